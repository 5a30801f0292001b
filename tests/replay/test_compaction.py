"""Checkpoints and logical compaction against cursors (issue 9, parts 2-4).

The reference is the uncompacted log: a reader *positioned at* offset ``p`` is an
assembler that consumed every record below ``p``. After compaction (and collection),
a reader at any retained point reaches the same state at every later retained point,
and the same changesets, bit for bit, after the newest one; a fresh reader starts from
the checkpoint; a reader anywhere else is refused, naming the retained points.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from agent import Agent, MemoryStore
from agent._workload import Workload
from replay import Assembler, Changeset, InconsistentLog, collect_log, compact_log
from replay._resume import _baseline_text, _parse, frontier_of
from sinks import Setsum
from sinks.codec import decode
from sinks.codec import records as expand
from sinks.objstore import InMemoryObjectStore
from sinks.wal3 import (
    CorruptState,
    CursorStore,
    LogReader,
    NotARetainedPoint,
    StateDelta,
    Wal3Sink,
    WriterOptions,
    read_log,
)
from sinks.wal3._garbage import Garbage
from sinks.wal3._state import check_accounting, iter_state_deltas, load_state_index
from tests.sinks.wal3.conftest import no_sleep

Record = Any
# Each example builds and compacts a log: shrinking would take minutes, and the seeds
# printed on failure replay it.
_PHASES = (Phase.explicit, Phase.reuse, Phase.generate)


_ROUND = 4  # batches per flushed round of build_log


def build_log(seed: int, threads: int, batches: int, domains: int = 1,
              name: str = "log") -> InMemoryObjectStore:
    """A log of ``domains`` agent lifetimes (each a domain) over one store."""
    objs = InMemoryObjectStore(f"{name}-{seed}", sleep=no_sleep)
    store = MemoryStore()
    for d in range(domains):
        agent = Agent(store, Wal3Sink(objs, options=WriterOptions(batch_size_records=3)))
        # Rounds of a few batches, each flushed: the shipper packs whatever is queued into
        # one EVENTS and one EPOCHS record, and the tests want many records (many
        # offsets for cursors to stand at), as a log written over time has.
        for r, start in enumerate(range(0, batches, _ROUND)):
            Workload(threads=threads, batches=min(_ROUND, batches - start),
                     seed=(seed * 7 + d) * 1000 + r, rows=(1, 2, 3, "k", "z")).run(agent)
            agent.flush()
        agent.close()
    return objs


def clone(objs: InMemoryObjectStore, name: str) -> InMemoryObjectStore:
    copy = InMemoryObjectStore(name, sleep=no_sleep)
    for key, data in sorted(objs.objects().items()):
        copy.put(key, data)
    return copy


def raw_records(objs: InMemoryObjectStore) -> list[tuple[int, Record]]:
    # An EPOCHS record holds a run of epoch records: each at that record's offset.
    return [(r.offset, x) for r in LogReader(objs).records() for x in expand(decode(r.body))]


def positioned_at(records: list[tuple[int, Record]], point: int) -> Assembler:
    """A reader that consumed every record below ``point`` of the uncompacted log."""
    asm = Assembler()
    for offset, record in records:
        if offset >= point:
            break
        asm.feed(record, defer=True)
    asm.drain()
    return asm


def pending_epochs(asm: Assembler) -> dict[int, list[int]]:
    """The epochs an assembler holds whose interval is not complete, per domain."""
    return {d: sorted(dom.epochs) for d, dom in asm._domains.items() if dom.epochs}


def held(asm: Assembler) -> tuple[Any, ...]:
    """What else a reader holds at a point: the baseline carry (chunk changes not handed
    out yet), the baseline bookkeeping (a fresh consumer's open window included), and
    whether its state is the whole store."""
    return (dict(asm._baselines.carry), _baseline_text(asm), asm._baselines.trusted)


def view(asm: Assembler) -> dict[bytes, bytes]:
    """The state as the changesets handed out so far show it (the carry undone)."""
    out = dict(asm._state)
    for key, (_value, shown) in asm._baselines.carry.items():
        if shown:
            out[key] = shown
        else:
            out.pop(key, None)
    return out


def follow(replica: dict[bytes, bytes], changesets: list[Changeset]) -> None:
    """Apply changesets as a replica does, checking each one's before values."""
    for changeset in changesets:
        for key, before in changeset._before.items():
            assert replica.get(key, b"") == before, (changeset, key)
        for key, after in changeset._changes.items():
            if after:
                replica[key] = after
            else:
                replica.pop(key, None)


def bits(changeset: Changeset) -> tuple[Any, ...]:
    return (changeset.domain_id, changeset.epoch_seq, changeset.event_count,
            str(changeset.position), changeset._changes, changeset._before)


class Reference:
    """States and changesets of the uncompacted log at each point."""

    def __init__(self, records: list[tuple[int, Record]], points: list[int]) -> None:
        self.records = records
        self.states: dict[int, tuple[dict[bytes, bytes], str]] = {}
        self.pending: dict[int, dict[int, list[int]]] = {}
        self.held: dict[int, tuple[Any, ...]] = {}
        for point in points:
            asm = positioned_at(records, point)
            self.states[point] = (dict(asm._state), frontier_of(asm))
            self.pending[point] = pending_epochs(asm)
            self.held[point] = held(asm)
        newest = points[-1]
        asm = positioned_at(records, newest)
        self.after_newest = [bits(c) for c in asm.changesets(
            r for o, r in records if o >= newest)]
        self.final = dict(asm._state)


def read_compacted(objs: InMemoryObjectStore, reader: Assembler, ref: Reference,
                   from_offset: int | None, stands_at: int | None = None) -> None:
    """Read the compacted log with ``reader`` (standing at ``stands_at``, by default
    ``from_offset``): at every later stripe's end it must hold the reference state;
    after the last, the reference changesets, bit for bit."""
    at = from_offset if stands_at is None else stands_at
    items = list(read_log(objs, from_offset=from_offset))
    deltas = [i for i in items if isinstance(i, StateDelta)]
    rest = items[len(deltas):]
    assert not any(isinstance(i, StateDelta) for i in rest)
    # A replica following this reader's changesets: each one's befores must hold.
    replica = {} if from_offset is None else view(reader)
    for delta in deltas:
        follow(replica, reader.feed(delta))
        if delta.hi in ref.states and (at is None or delta.hi >= at):
            assert (reader._state, frontier_of(reader)) == ref.states[delta.hi], delta.hi
            assert pending_epochs(reader) == ref.pending[delta.hi], delta.hi
            assert held(reader) == ref.held[delta.hi], delta.hi
            assert replica == view(reader), delta.hi
    after = list(reader.changesets(rest))
    assert [bits(c) for c in after] == ref.after_newest
    assert reader._state == ref.final
    follow(replica, after)
    assert replica == view(reader)


def between_domains(ref: Reference, frontier: str) -> bool:
    """True if ``frontier`` is where a reader stands after some of one stripe's domains'
    changesets and not the others (a replica that crashed between them, which a stripe
    resumes: docs/state.md): each domain at its frontier at one retained point or the
    next, neither point's whole frontier."""
    fronts = [_parse(ref.states[p][1]) for p in sorted(ref.states)]
    here = _parse(frontier)
    for lo, hi in pairwise(fronts):
        if here not in (lo, hi) and all(here.get(d) in (lo.get(d), hi.get(d))
                                        for d in set(lo) | set(hi) | set(here)):
            return True
    return False


def check_state_chain(objs: InMemoryObjectStore) -> None:
    reader = LogReader(objs)
    reader.scrub()
    manifest = reader.manifest()
    index = load_state_index(reader.store, manifest)
    assert index is not None
    list(iter_state_deltas(reader.store, index))
    check_accounting(reader, manifest, index)


@settings(max_examples=12, deadline=None, phases=_PHASES,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(seed=st.integers(0, 10_000), threads=st.integers(1, 3), domains=st.integers(1, 2),
       fractions=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=4))
@example(seed=2154, threads=1, domains=2, fractions=[1.0, 0.8958130146699272, 0.47720360882929935])
def test_every_retained_point_reads_the_same_after_compaction(
        seed: int, threads: int, domains: int, fractions: list[float]) -> None:
    objs = build_log(seed, threads, 25, domains)
    end = LogReader(objs).manifest().next_offset
    points = sorted({max(1, min(end, 1 + int(f * (end - 1)))) for f in fractions})
    for i, point in enumerate(points):
        CursorStore(objs).init(f"reader{i}", point)
    records = raw_records(objs)
    ref = Reference(records, points)
    report = compact_log(objs)
    assert report.points == points
    manifest = LogReader(objs).manifest()
    assert report.gc is not None and report.gc.applied == (manifest.oldest_offset > 1)
    check_state_chain(objs)
    # A fresh reader starts from the checkpoint; one positioned at each point resumes.
    read_compacted(objs, Assembler(), ref, None)
    for point in points:
        read_compacted(objs, positioned_at(records, point), ref, point)
    # Offsets compacted away are refused, naming the retained points around them.
    for q in range(manifest.oldest_offset):
        if q not in points and q >= 1:
            with pytest.raises(NotARetainedPoint, match="is not a retained point: the nearest"):
                next(iter(read_log(objs, from_offset=q)))
            break
    # A reader standing inside a stripe (its state is from elsewhere) is refused, except
    # one that stands between a stripe's domains (it applied the first domains'
    # changesets): it resumes, and must then read exactly what the reference reads.
    inside = [q for q in range(points[0] + 1, manifest.oldest_offset)
              if q not in points and frontier_of(positioned_at(records, q))
              not in {s[1] for s in ref.states.values()}]
    for q in inside:
        stranger = positioned_at(records, q)
        if between_domains(ref, frontier_of(stranger)):
            read_compacted(objs, stranger, ref, points[0], stands_at=q)
            continue
        with pytest.raises(InconsistentLog, match="not a retained point of this compacted"):
            list(stranger.changesets(read_log(objs, from_offset=points[0])))


@settings(max_examples=8, deadline=None, phases=_PHASES,
          suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), threads=st.integers(1, 3),
       fraction=st.floats(0.0, 1.0))
def test_gc_then_read_log_from_the_checkpoint_equals_the_uncompacted_replay(
        seed: int, threads: int, fraction: float) -> None:
    objs = build_log(seed, threads, 30)
    end = LogReader(objs).manifest().next_offset
    point = max(1, int(fraction * end))
    CursorStore(objs).init("consumer", point)
    records = raw_records(objs)
    ref = Reference(records, [point])
    full = positioned_at(records, end + 1)
    report = collect_log(objs)
    assert report.points == [point]
    check_state_chain(objs)
    fresh = Assembler()
    changesets = list(fresh.changesets(read_log(objs)))
    assert fresh._state == full._state == ref.final
    assert [bits(c) for c in changesets[-len(ref.after_newest):]] == ref.after_newest \
        if ref.after_newest else True
    read_compacted(objs, positioned_at(records, point), ref, point)


def test_a_compacted_log_grows_with_cells_changed_not_events() -> None:
    """Three cursors over a log of many events on few cells: each stripe holds at most
    the cells there are, and the state objects are far smaller than the records freed."""
    objs = build_log(5, 2, 400)
    manifest = LogReader(objs).manifest()
    end = manifest.next_offset
    before = sum(len(v) for v in objs.objects().values())
    for i, point in enumerate((end // 4, end // 2, end - 2)):
        CursorStore(objs).init(f"r{i}", point)
    # The cells the log ends with, counted on the uncompacted log (gc frees its head).
    cells = len(positioned_at(raw_records(objs), end)._state) or 1
    report = compact_log(objs)
    assert all(n <= 2 * 5 * 3 for n in report.stripe_cells)  # tables x rows x columns
    assert report.events_replaced > 20 * cells
    after = sum(len(v) for v in objs.objects().values())
    assert after < before / 3, (before, after)


def test_a_damaged_stripe_is_refused_then_rewritten() -> None:
    """A stripe whose bytes were altered no longer hashes to its name: scrub refuses it;
    while the records it replaced are still in the log, the next compaction writes it
    again; once they are collected, read_log refuses it."""
    objs = build_log(9, 1, 60)
    end = LogReader(objs).manifest().next_offset
    for i, point in enumerate((end // 3, 2 * end // 3)):
        CursorStore(objs).init(f"r{i}", point)
    records = raw_records(objs)
    ref = Reference(records, [end // 3, 2 * end // 3])
    compact_log(objs, collect=False)
    stripe = next(k for k in objs.objects() if k.startswith("state/STRIPE."))
    good = objs.objects()[stripe]
    bad = good[:-40] + bytes([good[-40] ^ 1]) + good[-39:]
    objs.put(stripe, bad)
    with pytest.raises(CorruptState, match="does not hash to its name"):
        check_state_chain(objs)
    compact_log(objs)
    assert objs.objects()[stripe] == good
    read_compacted(objs, Assembler(), ref, None)
    objs.put(stripe, bad)
    with pytest.raises(CorruptState, match="does not hash to its name"):
        list(read_log(objs))


def test_collection_refuses_when_the_replaced_accounting_is_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint claiming to replace other records than the log holds: the collection
    is refused before anything is freed, and no garbage file is left behind."""
    import replay._compaction as compaction

    objs = build_log(4, 1, 40)
    end = LogReader(objs).manifest().next_offset
    CursorStore(objs).init("consumer", end // 2)
    real = compaction._deltas

    def off(*args: Any) -> list[StateDelta]:
        deltas = real(*args)
        wrong = Setsum.of([b"a record the log never held"]).hexdigest()
        return [replace(deltas[0], replaced_setsum=wrong), *deltas[1:]]

    monkeypatch.setattr(compaction, "_deltas", off)
    fragments = sorted(k for k in objs.objects() if k.startswith("log/"))
    with pytest.raises(CorruptState, match="nothing may be collected"):
        collect_log(objs)
    assert sorted(k for k in objs.objects() if k.startswith("log/")) == fragments
    assert objs.objects().get("gc/GARBAGE", b"").strip() in (b"", Garbage().to_json().encode())
