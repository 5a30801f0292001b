"""The write operations as sans-IO step sequences (agent._operations), without threads.

Each operation is driven against a scripted store whose every answer is drawn at
random (a racing writer may have changed or removed any cell between two steps, a
conditional store fails, the store raises part way), and compared with a reference
model: the same operation written plainly against the store, as the drivers did before
the definitions were shared. The steps, the events emitted before the store failed,
and the result must all agree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent import ABSENT, Agent, InvalidWrite
from agent import _operations as ops
from sinks import MemorySink

tables = st.sampled_from(["t", "u"])
rows = st.one_of(st.integers(-3, 3), st.sampled_from(["r", "s"]))
columns = st.sampled_from(["a", "b", "c"])
values = st.one_of(st.none(), st.booleans(), st.integers(-2, 2), st.floats(allow_nan=False),
                   st.text(max_size=3), st.binary(max_size=3))
maybe = st.one_of(st.just(ABSENT), values)


class StoreDown(Exception):
    """The scripted store's injected failure."""


class Scripted:
    """A store whose answers are drawn as it is called; ``replay`` answers them again."""

    def __init__(self, draw: Callable[[Any], Any] | None, fail_at: int | None) -> None:
        self.draw = draw
        self.fail_at = fail_at
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.answers: list[Any] = []

    def _answer(self, method: str, args: tuple[Any, ...], strategy: Any) -> Any:
        if len(self.calls) == self.fail_at:
            self.calls.append((method, args))
            raise StoreDown(method)
        self.calls.append((method, args))
        if self.draw is None:  # replaying
            return self.answers[len(self.calls) - 1]
        answer = self.draw(strategy)
        self.answers.append(answer)
        return answer

    def exchange(self, table: str, row: Any, column: str, value: Any) -> Any:
        return self._answer("exchange", (table, row, column, value), maybe)

    def compare_exchange(self, table: str, row: Any, column: str, expected: Any,
                         value: Any) -> Any:
        # swapped: the cell held ``expected``; else it held anything (maybe even equal:
        # a store may compare bits the model would call equal)
        return self._answer("compare_exchange", (table, row, column, expected, value),
                            st.one_of(st.just((True, expected)),
                                      st.tuples(st.just(False), maybe)))

    def read_row(self, table: str, row: Any) -> Any:
        return self._answer("read_row", (table, row),
                            st.dictionaries(columns, values, max_size=3))

    def replay(self) -> Scripted:
        again = Scripted(None, self.fail_at)
        again.answers = self.answers
        return again


# -- the reference model: each operation written plainly against a store ---------------


def ref_set(store: Any, emit: Callable[..., None], t: str, r: Any, c: str, v: Any) -> Any:
    old = store.exchange(t, r, c, v)
    emit((t, r, c, old, v))
    return old


def ref_delete(store: Any, emit: Callable[..., None], t: str, r: Any, c: str) -> Any:
    old = store.exchange(t, r, c, ABSENT)
    if old is not ABSENT:
        emit((t, r, c, old, ABSENT))
    return old


def ref_clear_row(store: Any, emit: Callable[..., None], t: str, r: Any) -> Any:
    removed = {}
    for c in store.read_row(t, r):
        old = store.exchange(t, r, c, ABSENT)
        if old is not ABSENT:
            removed[c] = old
            emit((t, r, c, old, ABSENT))
    return removed


def ref_update(store: Any, emit: Callable[..., None], t: str, rs: list[Any],
               vs: dict[str, Any]) -> None:
    for r in rs:
        for c, v in vs.items():
            emit((t, r, c, store.exchange(t, r, c, v), v))


def ref_conditional(store: Any, emit: Callable[..., None], t: str,
                    changes: dict[Any, dict[str, Any]]) -> Any:
    results = {}
    for r, cells in changes.items():
        ok = True
        for c, (expected, new) in cells.items():
            swapped, old = store.compare_exchange(t, r, c, expected, new)
            if not swapped:
                ok = False
                break
            if not (old is ABSENT and new is ABSENT):
                emit((t, r, c, old, new))
        results[r] = ok
    return results


operations = st.one_of(
    st.tuples(st.just(ops.set_cell), st.just(ref_set),
              st.tuples(tables, rows, columns, values)),
    st.tuples(st.just(ops.delete_cell), st.just(ref_delete), st.tuples(tables, rows, columns)),
    st.tuples(st.just(ops.clear_row), st.just(ref_clear_row), st.tuples(tables, rows)),
    st.tuples(st.just(ops.update), st.just(ref_update),
              st.tuples(tables, st.lists(rows, max_size=3),
                        st.dictionaries(columns, values, max_size=3))),
    st.tuples(st.just(ops.conditional_set), st.just(ref_conditional),
              st.tuples(tables, st.dictionaries(
                  rows, st.dictionaries(columns, st.tuples(maybe, maybe), max_size=3),
                  max_size=3))),
)


def drive(op: ops.Operation[Any], store: Any) -> tuple[list[Any], Any, BaseException | None]:
    """Run ``op`` with the sync driver; return its events, result and the store's error."""
    events: list[Any] = []
    try:
        step = next(op)
    except StopIteration as stop:
        return events, stop.value, None
    try:
        return events, ops.run(store, op, step, events.append), None
    except StoreDown as exc:
        return events, None, exc


def reference(ref: Callable[..., Any], args: tuple[Any, ...],
              store: Any) -> tuple[list[Any], Any, BaseException | None]:
    events: list[Any] = []
    try:
        return events, ref(store, events.append, *args), None
    except StoreDown as exc:
        return events, None, exc


@settings(max_examples=400, deadline=None)
@given(operations, st.one_of(st.none(), st.integers(0, 8)), st.data())
def test_each_operation_matches_the_reference_model(
        operation: Any, fail_at: int | None, data: st.DataObject) -> None:
    """Whatever the store answers (racing writers, failed swaps) and wherever it fails,
    an operation makes the reference's store calls, emits its events (those before the
    failure included) and returns its result."""
    define, ref, args = operation
    store = Scripted(data.draw, fail_at)
    events, result, error = drive(define(*args), store)
    again = store.replay()
    want_events, want_result, want_error = reference(ref, args, again)
    assert store.calls == again.calls
    assert events == want_events
    assert (error is None) == (want_error is None)
    if error is None:
        assert result == want_result


@settings(max_examples=200, deadline=None)
@given(operations, st.data())
def test_the_asyncio_driver_agrees_with_the_sync_one(operation: Any, data: st.DataObject) -> None:
    """``arun`` makes the same calls, emits the same events, returns the same result."""
    import asyncio

    define, _ref, args = operation
    store = Scripted(data.draw, None)
    events, result, _ = drive(define(*args), store)
    again = store.replay()

    class Async:
        def __getattr__(self, name: str) -> Any:
            method = getattr(again, name)

            async def call(*a: Any) -> Any:
                return method(*a)
            return call

    async_events: list[Any] = []

    async def main() -> Any:
        op = define(*args)
        try:
            step = next(op)
        except StopIteration as stop:
            return stop.value
        return await ops.arun(Async(), op, step, async_events.append)

    assert asyncio.run(main()) == result
    assert async_events == events and again.calls == store.calls


@settings(max_examples=200, deadline=None)
@given(tables, rows, columns, values, st.data())
def test_agent_set_inlines_exactly_set_cell(table: str, row: Any, column: str, value: Any,
                                            data: st.DataObject) -> None:
    """``Agent.set`` (its steps inlined for speed) makes set_cell's call and event."""
    store = Scripted(data.draw, None)
    sink = MemorySink()
    agent = Agent(store, sink)  # type: ignore[arg-type]
    result = agent.set(table, row, column, value)
    agent.close()
    again = store.replay()
    events, want, _ = drive(ops.set_cell(table, row, column, value), again)
    assert store.calls == again.calls
    assert result is want or result == want
    assert [(e.table, e.row, e.column, e.old, e.new) for e in sink.events] == events


@settings(max_examples=150, deadline=None)
@given(tables, rows, columns, values, st.one_of(st.none(), st.just(0)), st.booleans(),
       st.data())
def test_async_agent_set_inlines_exactly_set_cell(
        table: str, row: Any, column: str, value: Any, fail_at: int | None, scoped: bool,
        data: st.DataObject) -> None:
    """``AsyncAgent.set`` (inlined too), in a batch or not, with the store failing or
    not: set_cell's call, event and result; a failed write leaves no event and its
    automatic batch closed."""
    import asyncio

    from agent import AsyncAgent

    store = Scripted(data.draw, fail_at)

    class Async:
        def __getattr__(self, name: str) -> Any:
            method = getattr(store, name)

            async def call(*a: Any) -> Any:
                return method(*a)
            return call

    sink = MemorySink()

    async def main() -> Any:
        agent = AsyncAgent(Async(), sink)  # type: ignore[arg-type]
        try:
            if scoped:
                async with agent.batch():
                    return await agent.set(table, row, column, value)
            return await agent.set(table, row, column, value)
        except StoreDown as exc:
            return exc
        finally:
            assert agent._sequencer.quiescent
            await agent.aclose()

    result = asyncio.run(main())
    again = store.replay()
    events, want, error = drive(ops.set_cell(table, row, column, value), again)
    assert store.calls == again.calls
    assert isinstance(result, StoreDown) == (error is not None)
    if error is None:
        assert result is want or result == want
    assert [(e.table, e.row, e.column, e.old, e.new) for e in sink.events] == events


@pytest.mark.parametrize("make", [
    lambda: ops.set_cell("t", 1, "a", [1]),  # type: ignore[arg-type]
    lambda: ops.set_cell("bad name", 1, "a", 1),
    lambda: ops.delete_cell("t", 1.5, "a"),  # type: ignore[arg-type]
    lambda: ops.clear_row("t", None),  # type: ignore[arg-type]
    lambda: ops.update("t", [1], {"a": 1 << 64}),
    lambda: ops.update("t", [1, b"x"], {"a": 1}),  # type: ignore[list-item]
    lambda: ops.conditional_set("t", {1: {"a": (ABSENT, object())}}),  # type: ignore[dict-item]
    lambda: ops.conditional_set("t", {1: {"bad col": (ABSENT, 1)}}),
])
def test_invalid_writes_are_refused_before_the_first_step(make: Any) -> None:
    """The checks run when the operation is primed: no step is yielded first."""
    with pytest.raises(InvalidWrite):
        next(make())


def test_no_event_when_both_sides_are_absent() -> None:
    """A conditional swap from ABSENT to ABSENT that happened changed nothing: no event."""
    op = ops.conditional_set("t", {1: {"a": (ABSENT, ABSENT), "b": (ABSENT, 2)}})
    assert next(op) == ops.CompareExchange("t", 1, "a", ABSENT, ABSENT)
    assert op.send((True, ABSENT)) == ops.CompareExchange("t", 1, "b", ABSENT, 2)
    assert op.send((True, ABSENT)) == ops.Emit(("t", 1, "b", ABSENT, 2))
    with pytest.raises(StopIteration) as done:
        op.send(None)
    assert done.value.value == {1: True}
