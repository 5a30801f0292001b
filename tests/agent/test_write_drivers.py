"""One behavioural suite for the three drivers of the write operations: ``Agent``,
``AsyncAgent`` and ``SidecarClient`` (against a running sidecar).

Each scenario is written once, as a coroutine over a small async facade; the sync
drivers are wrapped in it. Stores that misbehave on purpose (a racing writer, a store
failing part way) sit under every driver alike, and the events that reach the log are
compared, not just the store.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from agent import ABSENT, Agent, AsyncAgent, AsyncMemoryStore, InvalidWrite, MemoryStore
from agent.sidecar import SidecarClient
from sinks import MemorySink
from tests.agent._sidecar import Served, short_dir


class StoreDown(Exception):
    """The failing store's injected error."""


class RacingStore(MemoryStore):
    """After ``read_row``, a racing writer removes the row's cell ``gone`` (behind the
    agent's back, as another process would)."""

    gone = "b"

    def read_row(self, table: str, row: Any) -> dict[str, Any]:
        cells = super().read_row(table, row)
        super().exchange(table, row, self.gone, ABSENT)
        return cells


class FailingStore(MemoryStore):
    """Its ``fail_at``-th exchange (from 0) raises, having changed nothing."""

    fail_at = 2

    def __init__(self) -> None:
        super().__init__()
        self.exchanges = 0

    def exchange(self, table: str, row: Any, column: str, value: Any) -> Any:
        self.exchanges += 1
        if self.exchanges - 1 == self.fail_at:
            raise StoreDown("the store went away")
        return super().exchange(table, row, column, value)


class Facade:
    """The write API as coroutines, whatever the driver underneath."""

    def __init__(self, api: Any, is_async: bool) -> None:
        self.api = api
        self.is_async = is_async

    async def _call(self, name: str, *args: Any) -> Any:
        result = getattr(self.api, name)(*args)
        return await result if self.is_async else result

    async def set(self, *args: Any) -> Any:
        return await self._call("set", *args)

    async def delete(self, *args: Any) -> Any:
        return await self._call("delete", *args)

    async def clear_row(self, *args: Any) -> Any:
        return await self._call("clear_row", *args)

    async def update(self, *args: Any) -> Any:
        return await self._call("update", *args)

    async def conditional_set(self, *args: Any) -> Any:
        return await self._call("conditional_set", *args)

    @asynccontextmanager
    async def batch(self) -> AsyncIterator[None]:
        if self.is_async:
            async with self.api.batch():
                yield
        else:
            with self.api.batch():
                yield


Scenario = Callable[[Facade], Awaitable[Any]]


class Harness:
    """Runs a scenario through one driver over ``store``; then the log's events."""

    def __init__(self, kind: str, folder: Path) -> None:
        self.kind = kind
        self.folder = folder

    def run(self, store: MemoryStore, scenario: Scenario) -> tuple[Any, list[tuple[Any, ...]]]:
        """The scenario's result (or the exception it raised) and the logged events as
        ``(batch_id, table, row, column, old, new)``."""
        outcome: Any
        if self.kind == "sidecar":
            served = Served(self.folder / "s", store=store)
            client = SidecarClient(str(self.folder / "s"), store)
            try:
                outcome = _outcome(asyncio.run, scenario(Facade(client, False)))
            finally:
                client.flush()
                client.close()
                served.stop()
            sink = served.sink
        else:
            sink = MemorySink()
            if self.kind == "agent":
                agent: Any = Agent(store, sink)
                outcome = _outcome(asyncio.run, scenario(Facade(agent, False)))
            else:
                agent = AsyncAgent(AsyncMemoryStore(store), sink)
                outcome = _outcome(asyncio.run, scenario(Facade(agent, True)))
            agent.close()
        return outcome, [(e.batch_id, e.table, e.row, e.column, e.old, e.new)
                         for e in sink.events]


def _outcome(run: Callable[[Any], Any], coro: Any) -> Any:
    try:
        return run(coro)
    except Exception as exc:  # the scenario's error is part of the behaviour compared
        return exc


@pytest.fixture(params=["agent", "async", "sidecar"])
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    with short_dir() as folder:
        yield Harness(request.param, folder)


def cells(events: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [e[1:] for e in events]


def test_set_and_delete_report_the_old_value_and_a_missing_cell_makes_no_event(
        harness: Harness) -> None:
    """set/delete return what they replaced; deleting a cell that is not there logs nothing."""
    async def scenario(w: Facade) -> Any:
        return [await w.set("t", 1, "a", "x"), await w.set("t", 1, "a", None),
                await w.delete("t", 1, "a"), await w.delete("t", 1, "a")]

    result, events = harness.run(MemoryStore(), scenario)
    assert result == [ABSENT, "x", None, ABSENT]
    assert cells(events) == [("t", 1, "a", ABSENT, "x"), ("t", 1, "a", "x", None),
                             ("t", 1, "a", None, ABSENT)]
    assert len({e[0] for e in events}) == 3  # an automatic batch per write


def test_clear_row_skips_a_cell_a_racing_writer_removed(harness: Harness) -> None:
    """clear_row returns and logs only the cells it removed itself."""
    store = RacingStore({("t", 1, "a"): 1, ("t", 1, "b"): 2, ("t", 1, "c"): 3})

    async def scenario(w: Facade) -> Any:
        return await w.clear_row("t", 1)

    result, events = harness.run(store, scenario)
    assert result == {"a": 1, "c": 3}
    assert cells(events) == [("t", 1, "a", 1, ABSENT), ("t", 1, "c", 3, ABSENT)]
    assert store.snapshot() == {}


def test_conditional_set_stops_a_row_at_its_first_mismatch(harness: Harness) -> None:
    """Earlier swaps of a failed row stay (and are logged); an ABSENT -> ABSENT swap
    changed nothing and is not logged; other rows go on."""
    store = MemoryStore({("t", 1, "a"): 1, ("t", 1, "b"): b"x", ("t", 2, "a"): 5})

    async def scenario(w: Facade) -> Any:
        return await w.conditional_set("t", {
            1: {"a": (1, 10), "b": (b"nope", b"y"), "c": (ABSENT, 3)},
            2: {"z": (ABSENT, ABSENT), "a": (5, ABSENT)},
            3: {"a": (ABSENT, "new")},
        })

    result, events = harness.run(store, scenario)
    assert result == {1: False, 2: True, 3: True}
    assert cells(events) == [("t", 1, "a", 1, 10), ("t", 2, "a", 5, ABSENT),
                             ("t", 3, "a", ABSENT, "new")]
    assert len({e[0] for e in events}) == 1
    assert store.snapshot() == {("t", 1, "a"): 10, ("t", 1, "b"): b"x", ("t", 3, "a"): "new"}


def test_a_store_failing_part_way_keeps_the_writes_that_happened_in_the_log(
        harness: Harness) -> None:
    """update's third exchange fails: the error reaches the caller, and the two writes
    that took effect are logged (in the batch, which still closes)."""
    store = FailingStore()

    async def scenario(w: Facade) -> Any:
        await w.update("t", [1, 2], {"a": 1, "b": 2})

    result, events = harness.run(store, scenario)
    assert isinstance(result, StoreDown)
    assert cells(events) == [("t", 1, "a", ABSENT, 1), ("t", 1, "b", ABSENT, 2)]
    assert store.snapshot() == {("t", 1, "a"): 1, ("t", 1, "b"): 2}


def test_invalid_writes_are_refused_before_the_store_is_touched(harness: Harness) -> None:
    """A bad value or name raises InvalidWrite; nothing is written or logged, and the
    batch around it goes on."""
    store = MemoryStore()

    async def scenario(w: Facade) -> Any:
        refused = []
        async with w.batch():
            for bad in (lambda: w.set("t", 1, "a", [1]),
                        lambda: w.update("t", [1, 2.5], {"a": 1}),
                        lambda: w.conditional_set("t", {1: {"a": (ABSENT, 1 << 64)}}),
                        lambda: w.clear_row("bad name", 1)):
                try:
                    await bad()
                except InvalidWrite as exc:
                    refused.append(type(exc))
            await w.set("t", 9, "a", "ok")
        return refused

    result, events = harness.run(store, scenario)
    assert result == [InvalidWrite] * 4
    assert cells(events) == [("t", 9, "a", ABSENT, "ok")]
    assert store.snapshot() == {("t", 9, "a"): "ok"}


def test_operations_in_a_batch_share_it(harness: Harness) -> None:
    """Every operation inside one (nested) batch logs into that one batch, in order."""
    async def scenario(w: Facade) -> Any:
        async with w.batch():
            await w.update("t", [1], {"a": 1})
            async with w.batch():
                await w.set("t", 2, "a", 2)
            await w.delete("t", 1, "a")
            return await w.clear_row("t", 2)

    result, events = harness.run(MemoryStore(), scenario)
    assert result == {"a": 2}
    assert cells(events) == [("t", 1, "a", ABSENT, 1), ("t", 2, "a", ABSENT, 2),
                             ("t", 1, "a", 1, ABSENT), ("t", 2, "a", 2, ABSENT)]
    assert len({e[0] for e in events}) == 1
