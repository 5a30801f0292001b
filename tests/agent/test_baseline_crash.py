"""Crash injection: a baseline into a wal3 log on the in-memory object store, the process
'crashing' at each store call in turn; a restart (a new agent, a new baseline) leaves a
log from which a consumer given nothing rebuilds the store."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent import (
    Agent,
    AsyncAgent,
    AsyncMemoryStore,
    BaselineJournal,
    BaselineReport,
    JournalError,
    MemoryStore,
)
from replay import Assembler
from sinks.codec import encode_value
from sinks.objstore import Call, Crash, InMemoryObjectStore
from sinks.wal3 import Wal3Sink, read_log
from sinks.wal3._writer import WriterOptions
from tests.sinks.wal3.conftest import ProcessStore, no_sleep


def _bits(state: dict[Any, Any]) -> dict[Any, bytes]:
    return {cell: encode_value(value) for cell, value in state.items()}


def _store() -> MemoryStore:
    rng = random.Random(3)
    return MemoryStore({("t", i, c): rng.randrange(99) for i in range(40) for c in "ab"})


_OPTIONS = WriterOptions(batch_size_records=2, max_in_flight=1, store_retries=0)


def _run(objects: Any, store: MemoryStore) -> None:
    agent = Agent(store, Wal3Sink(objects, options=_OPTIONS))
    try:
        agent.set("t", 1, "a", "first")
        agent.snapshot(chunk_rows=7)
        agent.set("t", 2, "b", "after")
    finally:
        with contextlib.suppress(BaseException):
            agent.close(timeout=10)


def _calls() -> int:
    objects = InMemoryObjectStore("reference", sleep=no_sleep)
    _run(objects, _store())
    return sum(1 for c in objects.calls if c.phase == "before")


@pytest.mark.parametrize("phase", ["before", "after"])
def test_a_crash_at_any_store_call_of_a_baseline_then_a_restart(phase: str) -> None:
    total = _calls()
    assert total > 10
    for step in range(1, total + 1):
        objects = InMemoryObjectStore(f"crash-{phase}-{step}", sleep=no_sleep)
        seen = [0]

        def hook(call: Call, step: int = step, seen: list[int] = seen) -> None:
            if call.phase == "before":
                seen[0] += 1
            if call.phase == phase and seen[0] == step and call.phase == phase:
                seen[0] = -10**9  # fire once
                raise Crash(f"crash {phase} store call {step}")

        objects.on_step = hook
        store = _store()
        process = ProcessStore(objects)  # after its crash, nothing of it runs any more
        with contextlib.suppress(BaseException):
            _run(process, store)
        objects.on_step = None
        # Restart: a new agent on the same log takes a new baseline.
        with Agent(store, Wal3Sink(objects, options=_OPTIONS)) as agent:
            agent.snapshot(chunk_rows=7)
            agent.set("t", 3, "a", "restarted")
        snaps = list(Assembler().replay(read_log(objects)))
        assert _bits(snaps[-1].state) == _bits(store.snapshot()), (phase, step)


class _DiesAtChunk(Wal3Sink):
    """The process dies while shipping chunk ``k`` of its baseline: its store is dead
    from there on (nothing of the chunk, nothing after it, reaches the log)."""

    def __init__(self, objects: ProcessStore, k: int) -> None:
        super().__init__(objects, options=_OPTIONS)
        self.process, self.k, self.seen = objects, k, 0

    def write_snapshot(self, chunk: Any) -> None:
        if self.seen == self.k:
            self.process.dead = True
            raise Crash(f"died at chunk {self.k}")
        self.seen += 1
        super().write_snapshot(chunk)


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 1000), rows=st.integers(8, 40), chunk_rows=st.integers(3, 9))
def test_dying_at_every_chunk_never_shows_a_state_the_store_did_not_have(
        seed: int, rows: int, chunk_rows: int) -> None:
    """Crash at each chunk of a baseline (writes between chunks), restart (a new domain)
    and take a new baseline: a consumer from nothing reaches the store's state at every
    quiescence point once its state is whole, and never calls a partial state whole.
    (Recovery abandons the cut baseline: docs/state.md.)"""
    from tests.agent.test_baseline import _prepopulated

    rng = random.Random(seed)
    chunks = -(-rows // chunk_rows) + 1
    for k in range(chunks):
        store = _prepopulated(random.Random(seed), rows)
        objects = InMemoryObjectStore(f"die-{seed}-{k}", sleep=no_sleep)
        truth: dict[tuple[int, int], dict[Any, bytes]] = {}

        def mark(record: Any, store: MemoryStore = store,
                 truth: dict[tuple[int, int], dict[Any, bytes]] = truth) -> None:
            truth[(record.domain_id, record.epoch_seq)] = _bits(store.snapshot())

        first = Agent(store, _DiesAtChunk(ProcessStore(objects), k), on_quiescence=mark)

        def write(_step: Any, agent: Agent = first) -> None:
            agent.set("t", rng.randrange(rows), "a", rng.randrange(99))

        with contextlib.suppress(BaseException):
            first.set("t", 0, "a", "before")
            first.snapshot(chunk_rows=chunk_rows, progress=write)
        with contextlib.suppress(BaseException):
            first.close(timeout=5)
        with Agent(store, Wal3Sink(objects, options=_OPTIONS), on_quiescence=mark) as again:
            again.set("t", 1, "b", "restarted")
            again.snapshot(chunk_rows=chunk_rows,
                           progress=lambda _s, a=again: a.set("t", rng.randrange(rows), "b", 1))
            again.set("t", 2, "c", "later")
        asm = Assembler()
        whole = 0
        for record in read_log(objects):
            for changeset in asm.feed(record):
                if asm._baselines.trusted:  # the consumer holds the whole store
                    whole += 1
                    key = (changeset.domain_id, changeset.epoch_seq)
                    assert _bits(asm.state) == truth[key], (k, key)
        asm.check_gaps()
        assert whole >= 2, k
        assert _bits(asm.state) == _bits(store.snapshot()), k


_JOURNAL = "agent/baseline-journal.json"


def _journaled_run(objects: Any, store: MemoryStore, kind: str = "sync") -> None:
    if kind == "async":
        asyncio.run(_ajournaled_run(objects, store))
        return
    agent = Agent(store, Wal3Sink(objects, options=_OPTIONS))
    try:
        agent.set("t", 1, "a", "first")
        agent.snapshot(chunk_rows=7, journal=BaselineJournal(objects, _JOURNAL))
        agent.set("t", 2, "b", "after")
    finally:
        with contextlib.suppress(BaseException):
            agent.close(timeout=10)


async def _ajournaled_run(objects: Any, store: MemoryStore) -> None:
    agent = AsyncAgent(AsyncMemoryStore(store), Wal3Sink(objects, options=_OPTIONS))
    try:
        await agent.set("t", 1, "a", "first")
        await agent.snapshot(chunk_rows=7, journal=BaselineJournal(objects, _JOURNAL))
        await agent.set("t", 2, "b", "after")
    finally:
        with contextlib.suppress(BaseException):
            await agent.aclose(timeout=10)


def _restart(objects: Any, store: MemoryStore, journal: BaselineJournal, kind: str
             ) -> tuple[BaselineReport, int]:
    """A program's next start: ``snapshot(journal=...)``, a write, a clean close."""
    if kind == "sync":
        with Agent(store, Wal3Sink(objects, options=_OPTIONS)) as agent:
            report = agent.snapshot(chunk_rows=7, journal=journal)
            agent.set("t", 3, "a", "restarted")
        return report, agent.domain_id

    async def main() -> tuple[BaselineReport, int]:
        agent = AsyncAgent(AsyncMemoryStore(store), Wal3Sink(objects, options=_OPTIONS))
        report = await agent.snapshot(chunk_rows=7, journal=journal)
        await agent.set("t", 3, "a", "restarted")
        await agent.aclose()
        return report, agent.domain_id

    return asyncio.run(main())


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("phase", ["before", "after"])
def test_a_journaled_baseline_crashed_at_any_store_call_is_retaken_only_if_cut(
        phase: str, kind: str) -> None:
    """Crash at every store call of a journaled baseline (the journal's own puts among
    them, on the same in-memory object store), then restart and call
    ``snapshot(journal=...)`` as a program does at every start: after a crash (a cut
    baseline, or writes after a finished one lost) a new baseline is taken from chunk 0
    with no manual step; after a clean close none is; a consumer given nothing rebuilds
    the store either way, and the clean close of the restart marks the journal."""
    reference = InMemoryObjectStore("journal-reference", sleep=no_sleep)
    _journaled_run(reference, _store(), kind)
    total = sum(1 for c in reference.calls if c.phase == "before")
    outcomes = set()
    # Every store call in turn; then, as an asynchronous run's count of calls varies (the
    # writer batches in the background), the journal's 3rd put (its "closed") by name.
    steps: list[Any] = [*range(1, total + 1), "closed"]
    for step in steps:
        objects = InMemoryObjectStore(f"journal-{phase}-{step}", sleep=no_sleep)
        fired: list[bool] = []
        objects.on_step = (_crash_at(step, phase, fired) if step != "closed"
                           else _crash_at(3, phase, fired, _is_journal_put))
        store = _store()
        with contextlib.suppress(BaseException):
            _journaled_run(ProcessStore(objects), store, kind)
        objects.on_step = None
        journal = BaselineJournal(objects, _JOURNAL)
        entry = journal.read()
        finished = entry is not None and entry["state"] == "closed"
        report, domain_id = _restart(objects, store, journal, kind)
        assert (report.domain_id != domain_id) is finished, (phase, step)
        assert journal.read()["state"] == "closed"  # type: ignore[index]
        snaps = list(Assembler().replay(read_log(objects)))
        assert _bits(snaps[-1].state) == _bits(store.snapshot()), (phase, step)
        if step == "closed":  # crashed around the clean close's put of "closed"
            assert fired and finished is (phase == "after"), (phase, step)
        if fired:
            outcomes.add(finished)
        else:  # this run made fewer store calls (the writer batches in the background)
            assert finished, (phase, step)
    # A crash before any call leaves no clean close; after the last (the journal's
    # "closed"), the restart finds it and takes no baseline.
    assert outcomes == ({False} if phase == "before" else {True, False})


def _is_journal_put(call: Call) -> bool:
    return call.op in ("put", "put_if_match") and call.key == _JOURNAL


def _crash_at(nth: int, phase: str, fired: list[bool],
              counted: Callable[[Call], bool] = lambda call: True) -> Any:
    """A hook that crashes once, ``phase`` the ``nth`` store call that ``counted`` keeps."""
    seen = [0]

    def hook(call: Call) -> None:
        if not counted(call):
            return
        if call.phase == "before":
            seen[0] += 1
        if call.phase == phase and seen[0] == nth:
            seen[0] = -10**9  # fire once
            fired.append(True)
            raise Crash(f"crash {phase} store call {nth} ({call.op} {call.key})")

    return hook


def test_a_journal_from_another_version_is_refused_clearly() -> None:
    """A journal object this version did not write is refused, naming what to do."""
    objects = InMemoryObjectStore("journal-bad", sleep=no_sleep)
    objects.put(_JOURNAL, b'{"version": 9, "state": "done"}')
    with Agent(_store(), Wal3Sink(objects, options=_OPTIONS)) as agent, \
            pytest.raises(JournalError, match="remove it"):
        agent.snapshot(journal=BaselineJournal(objects, _JOURNAL))
    objects.put(_JOURNAL, b"not json")
    with pytest.raises(JournalError, match="not a journal"):
        BaselineJournal(objects, _JOURNAL).read()


def test_closed_is_never_written_over_a_baseline_that_started_meanwhile() -> None:
    """Agent A closes while agent B starts a baseline on the same journal: B's
    ``running`` written between A's read and A's write survives (a conditional put),
    so a crash of B is still retaken."""
    objects = InMemoryObjectStore("journal-race", sleep=no_sleep)
    with Agent(_store(), Wal3Sink(objects, options=_OPTIONS)) as a:
        journal = BaselineJournal(objects, _JOURNAL)
        a.snapshot(journal=journal)
        assert journal.read()["state"] == "done"  # type: ignore[index]
        get = objects.get

        def get_then_b_starts(key: str) -> Any:
            found = get(key)
            if key == _JOURNAL:
                objects.get = get  # type: ignore[method-assign]
                BaselineJournal(objects, _JOURNAL).started(domain_id=0xB, baseline_id=7)
            return found

        objects.get = get_then_b_starts  # type: ignore[method-assign]
    entry = journal.read()
    assert entry is not None and entry["state"] == "running" and entry["domain_id"] == 0xB
