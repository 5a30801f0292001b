"""Crash injection at every object-store call of a checkpoint, a collection and a
compaction (issue 9, part 4).

The log already holds a checkpoint and was collected below it, and has three cursors.
For each store call of the operation in turn, a copy of the log 'crashes' before, then
after, that call (the in-memory store's ``Crash``). Then readers must see the old log
or the new one, never a mix: a fresh reader and a reader positioned at each cursor
reach the reference states at every retained point and the reference changesets after
it, bit for bit. Then a restart (the same call again, no manual step) finishes the
work: scrub and the state chain check pass, no collection is left half done, and no
state object is left that the published index does not reference.
"""

from __future__ import annotations

import copy
import functools
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from replay import Assembler, checkpoint_log, collect_log, compact_log
from sinks.codec import decode
from sinks.objstore import Call, Crash, InMemoryObjectStore
from sinks.wal3 import CursorStore, LogReader, StateDelta, read_log
from sinks.wal3._garbage import Garbage
from sinks.wal3._state import STATE_PREFIX, load_state_index
from tests.replay.test_compaction import (
    bits,
    build_log,
    check_state_chain,
    clone,
    positioned_at,
    raw_records,
)

Records = list[tuple[int, Any]]


@functools.cache
def _base() -> tuple[InMemoryObjectStore, tuple[tuple[int, Any], ...]]:
    objs = build_log(11, 1, 24, name="crash-base")
    records = raw_records(objs)
    end = LogReader(objs).manifest().next_offset
    CursorStore(objs).init("slow", end // 4)
    collect_log(objs)  # a checkpoint at end // 4, the fragments below it freed
    CursorStore(objs).init("middle", end // 2)
    CursorStore(objs).init("fast", end - 2)
    return objs, tuple(records)


OPERATIONS: dict[str, Callable[[InMemoryObjectStore], Any]] = {
    "compact": compact_log,
    "collect": collect_log,
    "checkpoint": lambda objs: checkpoint_log(objs, LogReader(objs).manifest().next_offset - 5),
}


def _expected_after(records: Records, start: int) -> list[tuple[Any, ...]]:
    asm = positioned_at(records, start)
    return [bits(c) for c in asm.changesets(r for o, r in records if o >= start)]


class _Reference:
    """The uncompacted log's states and changesets from each point, computed once per
    point: they depend only on the base records, and every crash trial asks again."""

    def __init__(self, records: Records) -> None:
        self.records = records
        self._states: dict[int, dict[bytes, bytes]] = {}
        self._after: dict[int, list[tuple[Any, ...]]] = {}
        self._readers: dict[int, Assembler] = {}

    def reader(self, start: int) -> Assembler:
        """A reader positioned at ``start``, its own copy to feed."""
        if start not in self._readers:
            self._readers[start] = positioned_at(self.records, start)
        return copy.deepcopy(self._readers[start])

    def state(self, point: int) -> dict[bytes, bytes]:
        if point not in self._states:
            self._states[point] = dict(positioned_at(self.records, point)._state)
        return self._states[point]

    def after(self, start: int) -> list[tuple[Any, ...]]:
        if start not in self._after:
            self._after[start] = _expected_after(self.records, start)
        return self._after[start]


def check_readers(objs: InMemoryObjectStore, records: Records,
                  reference: _Reference | None = None) -> None:
    """Every reader (fresh, or positioned at a cursor) sees one consistent log."""
    ref = reference or _Reference(records)
    cursors = CursorStore(objs)
    starts: list[int | None] = [None]
    starts += sorted(w.cursor.position for n in cursors.list()
                     if (w := cursors.load(n)) is not None)
    for start in starts:
        reader = Assembler() if start is None else ref.reader(start)
        items = list(read_log(objs, from_offset=start))
        deltas = [i for i in items if isinstance(i, StateDelta)]
        for delta in deltas:
            reader.feed(delta)
            if start is None or delta.hi > start:
                assert reader._state == ref.state(delta.hi), (start, delta.hi)
        raw_start = deltas[-1].hi if deltas else (start or 1)
        got = [bits(c) for c in reader.changesets(items[len(deltas):])]
        assert got == ref.after(raw_start), (start, raw_start)


@functools.cache
def _base_v2() -> tuple[InMemoryObjectStore, tuple[tuple[int, Any], ...]]:
    """A log whose compaction writes version-2 objects: two domains one after the other
    on the same cells, a baseline taken under writers, a cursor inside it (carry or
    an open window), already collected below a first cursor."""
    from tests.replay.test_compaction_domains import _inside, _waits, build_baseline_log

    objs = build_baseline_log(23, 3, False, batches=3, records=6)
    records = raw_records(objs)
    end = LogReader(objs).manifest().next_offset
    readers = {p: positioned_at(records, p) for p in range(2, end)}
    allowed = [p for p, asm in readers.items() if not _waits(asm)]
    inside = [p for p in allowed if _inside(readers[p])]
    assert inside
    CursorStore(objs).init("slow", allowed[0])
    collect_log(objs)
    CursorStore(objs).init("inside", inside[len(inside) // 2])
    CursorStore(objs).init("fast", end - 2)
    return objs, tuple(records)


def _steps(op: str, base: InMemoryObjectStore) -> list[str]:
    """The store calls of ``op`` on ``base``, in order (their operation names)."""
    objs = clone(base, f"count-{op}")
    first = len(objs.calls)
    OPERATIONS[op](objs)
    return [c.op for c in objs.calls[first:] if c.phase == "before"]


_WRITES = ("put", "put_if_absent", "put_if_match", "delete")


@pytest.mark.parametrize("op", sorted(OPERATIONS))
def test_a_crash_at_any_store_call_then_a_restart(op: str) -> None:
    _crash_everywhere(op, *_base())


def test_a_crash_at_any_store_call_of_a_version_2_compaction() -> None:
    """The same for a compaction writing per-domain stripes, carry and a baseline's
    bookkeeping (objects version 2), at every call that changes the store (the same
    code paths as above; a crash at a read equals one before the next write, and the
    whole list would take minutes here)."""
    base, records_t = _base_v2()
    copy = clone(base, "v2-check")
    compact_log(copy)
    index = load_state_index(LogReader(copy).store, LogReader(copy).manifest())
    assert index is not None
    assert any(copy.objects()[e.path][8] == 2 for e in index.entries)  # version byte
    _crash_everywhere("compact", base, records_t, writes_only=True)


def _crash_everywhere(op: str, base: InMemoryObjectStore,
                      records_t: tuple[tuple[int, Any], ...], *,
                      writes_only: bool = False) -> None:
    records = list(records_t)
    reference = _Reference(records)
    calls = _steps(op, base)
    steps = [i for i, name in enumerate(calls, 1) if not writes_only or name in _WRITES]
    total = len(steps)
    assert total > 10
    crashed = 0
    checked: set[Any] = set()
    for step, phase in itertools.product(steps, ("before", "after")):
        objs = clone(base, f"{op}-{step}-{phase}")
        seen = itertools.count(1)
        target: list[tuple[str, str, int]] = []

        def hook(call: Call, step: int = step, phase: str = phase,
                 seen: Iterator[int] = seen,
                 target: list[tuple[str, str, int]] = target) -> None:
            if call.phase == "before" and next(seen) == step:
                target.append((call.op, call.key, call.n))
            if call.phase == phase and target == [(call.op, call.key, call.n)]:
                target.append(("", "", 0))  # fire once
                raise Crash(f"crash {phase} store call {step}")

        objs.on_step = hook
        try:
            OPERATIONS[op](objs)
        except Crash:
            crashed += 1
        objs.on_step = None
        # A crash after a call leaves the store as a crash before the next one does (and
        # a crash around a read as one around its neighbours): the checks below see only
        # the store, so each store left behind is checked once (objects, etags).
        left = (objs._generation, tuple(sorted(objs._objects.items())))
        if left in checked:
            continue
        checked.add(left)
        where = f"{op}: crash {phase} call {step}"
        try:
            check_readers(objs, records, reference)  # the old log or the new, never a mix
            OPERATIONS[op](objs)  # the restart
            check_readers(objs, records, reference)
            check_state_chain(objs)
            garbage = objs.objects().get("gc/GARBAGE", b"")
            assert garbage.strip() in (b"", Garbage().to_json().encode())
            index = load_state_index(LogReader(objs).store, LogReader(objs).manifest())
            assert index is not None
            referenced = {e.path for e in index.entries} | {index.path}
            stored = {k for k in objs.objects() if k.startswith(STATE_PREFIX)}
            assert stored == referenced, stored ^ referenced
        except AssertionError as exc:
            raise AssertionError(f"{where}: {exc}") from exc
    assert crashed >= 2 * total * 0.9


def test_compaction_rebases_on_appends_and_refuses_a_race_it_lost() -> None:
    """A writer appends while a compaction writes its objects: the compaction publishes
    on top of the new manifest (the appended records stay, after the newest point). A
    checkpoint that published meanwhile makes the compaction raise StateContention,
    publishing nothing; the next run succeeds."""
    from agent import Agent, MemoryStore
    from sinks.wal3 import StateContention, Wal3Sink

    base, records_t = _base()
    objs = clone(base, "race")
    fired: list[str] = []

    def append_meanwhile(call: Call) -> None:
        if call.phase == "before" and call.op == "put_if_absent" \
                and call.key.startswith(STATE_PREFIX) and not fired:
            fired.append(call.key)
            objs.on_step = None
            agent = Agent(MemoryStore(), Wal3Sink(objs))
            agent.set("other", 1, "a", "appended meanwhile")
            agent.close()

    end = LogReader(objs).manifest().next_offset
    objs.on_step = append_meanwhile
    report = compact_log(objs)
    assert fired and LogReader(objs).manifest().next_offset > end
    assert load_state_index(LogReader(objs).store, LogReader(objs).manifest()).path == report.index
    check_readers(objs, raw_records_of_all(objs, list(records_t)))
    check_state_chain(objs)

    lost: list[str] = []

    def publish_meanwhile(call: Call) -> None:
        if call.phase == "before" and call.op == "put_if_absent" \
                and call.key.startswith(STATE_PREFIX) and not lost:
            lost.append(call.key)
            objs.on_step = None
            checkpoint_log(objs, LogReader(objs).manifest().next_offset)

    objs.on_step = publish_meanwhile
    with pytest.raises(StateContention):
        compact_log(objs)
    assert lost
    compact_log(objs)
    check_state_chain(objs)


def raw_records_of_all(objs: InMemoryObjectStore, before: Records) -> Records:
    """The reference records: those of the base log, then any appended since."""
    last = before[-1][0]
    reader = LogReader(objs)
    return before + [(r.offset, decode(r.body)) for r in reader.records(last + 1)]
