"""Compaction with several domains, and with cursors inside a baseline (issue 9).

- A stripe hands out one changeset per domain it moved, each holding the cells that
  domain's events changed: per stripe and per domain, the changesets after compaction
  compose to what that domain's changesets of the uncompacted log compose to (cells
  several domains changed interleaved go whole with the last of them, documented in
  docs/state.md).
- A cursor inside a baseline (a fresh consumer's window open, or chunk changes not yet
  handed out) is retained: readers there get the same states, carry, baseline
  bookkeeping and changesets as on the uncompacted log; only a point where a fresh
  consumer waits for a baseline (its replay broke before one came) is refused.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from agent import Agent, MemoryStore
from agent._workload import Workload
from replay import Assembler, Changeset, InconsistentLog, compact_log
from replay._assembler import _decode_cell
from sinks.codec import decode_value
from sinks.objstore import InMemoryObjectStore
from sinks.wal3 import CursorStore, LogReader, StateDelta, Wal3Sink, WriterOptions, read_log
from tests.replay.test_compaction import (
    Reference,
    bits,
    check_state_chain,
    clone,
    follow,
    positioned_at,
    raw_records,
    read_compacted,
    view,
)
from tests.sinks.wal3.conftest import no_sleep

_PHASES = (Phase.explicit, Phase.reuse, Phase.generate)
_ROWS: dict[str, tuple[tuple[int | str, ...], ...]] = {
    "disjoint": ((1, 2), ("k", "z"), (3, 4)),
    "overlapping": ((1, 2, "k"), (2, "k", "z"), (1, "z")),
}
# Domains alive at once must not write the same cells: the assembler orders the
# intervals of one domain, not those of two (a cell two live agents write has no
# order in the log). So overlapping cells come from lifetimes one after the other.


def build_domains(seed: int, domains: int, mode: str, rounds: int = 6
                  ) -> InMemoryObjectStore:
    """``domains`` agents over one store: one lifetime after the other ("sequential",
    overlapping rows), or all alive, taking turns round by round ("disjoint" rows)."""
    objs = InMemoryObjectStore(f"domains-{mode}-{seed}", sleep=no_sleep)
    store = MemoryStore()
    rows = _ROWS["overlapping" if mode == "sequential" else "disjoint"]

    def agent() -> Agent:
        return Agent(store, Wal3Sink(objs, options=WriterOptions(batch_size_records=3)))

    def round_(a: Agent, d: int, r: int) -> None:
        Workload(threads=2, batches=3, seed=seed * 100 + r * 10 + d, rows=rows[d]).run(a)
        a.flush()

    if mode == "sequential":
        for d in range(domains):
            a = agent()
            for r in range(rounds):
                round_(a, d, r)
            a.close()
    else:
        agents = [agent() for _ in range(domains)]
        for r in range(rounds):
            for d, a in enumerate(agents):
                round_(a, d, r)
        for a in agents:
            a.close()
    return objs


Net = dict[int, dict[bytes, tuple[bytes, bytes]]]


def per_domain(changesets: list[Changeset]) -> tuple[Net, dict[int, int]]:
    """Each domain's changesets composed: cell -> (first before, last after), no-ops
    dropped; and each domain's event count."""
    net: Net = {}
    events: dict[int, int] = {}
    for c in changesets:
        cells = net.setdefault(c.domain_id, {})
        events[c.domain_id] = events.get(c.domain_id, 0) + c.event_count
        for key, after in c._changes.items():
            cells[key] = (cells[key][0] if key in cells else c._before[key], after)
    return {d: {k: v for k, v in cells.items() if v[0] != v[1]}
            for d, cells in net.items()}, events


def uncompacted_stripe(records: list[tuple[int, Any]], lo: int, hi: int) -> list[Changeset]:
    asm = positioned_at(records, lo)
    for offset, record in records:
        if lo <= offset < hi:
            asm.feed(record, defer=True)
    return asm.drain()


@settings(max_examples=10, deadline=None, phases=_PHASES,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(seed=st.integers(0, 10_000), domains=st.integers(2, 3),
       mode=st.sampled_from(["sequential", "disjoint"]),
       fractions=st.lists(st.floats(0.0, 1.0), min_size=2, max_size=4))
def test_each_domain_gets_its_own_cells_after_compaction(
        seed: int, domains: int, mode: str, fractions: list[float]) -> None:
    objs = build_domains(seed, domains, mode)
    end = LogReader(objs).manifest().next_offset
    points = sorted({max(1, min(end, 1 + int(f * (end - 1)))) for f in fractions})
    for i, point in enumerate(points):
        CursorStore(objs).init(f"reader{i}", point)
    records = raw_records(objs)
    whole = positioned_at(records, end + 1)
    assert not any(t.held for t in whole._baselines._tracks.values())  # a consistent log
    ref = Reference(records, points)
    compact_log(objs)
    check_state_chain(objs)
    read_compacted(objs, Assembler(), ref, None)
    for point in points:
        read_compacted(objs, positioned_at(records, point), ref, point)
    # Per stripe: each domain's changesets compose as on the uncompacted log.
    reader = Assembler()
    for delta in read_log(objs):
        if not isinstance(delta, StateDelta):
            break
        shown, standing = view(reader), reader.position
        got = reader.feed(delta)
        if delta.kind == "checkpoint":
            continue
        if len(got) > 1:
            # A replica that stored the first domain's changeset, then crashed: it
            # resumes from its state and position with the other domains' changesets.
            mid = dict(shown)
            follow(mid, got[:1])
            cells: dict[Any, Any] = {_decode_cell(k): decode_value(v) for k, v in mid.items()}
            replica = Assembler(cells,
                                standing.advanced(got[0].position))
            assert [bits(c) for c in replica.feed(delta)] == [bits(c) for c in got[1:]]
        want = uncompacted_stripe(records, delta.lo, delta.hi)
        got_net, got_events = per_domain(got)
        want_net, want_events = per_domain(want)
        if len(want_events) > 1:  # one domain: version 1, it counts the events replaced
            assert got_events == want_events
        else:
            assert list(got_events) == list(want_events)
        assert [c.epoch_seq for c in got] == [
            max(c.epoch_seq for c in want if c.domain_id == d) for d in got_events]
        touched: dict[bytes, set[int]] = {}
        for d, cells in want_net.items():
            for key in cells:
                touched.setdefault(key, set()).add(d)
        # Nothing interleaved on one cell: every domain's cells exactly.
        assert {d: cells for d, cells in got_net.items() if cells} == {
            d: cells for d, cells in want_net.items() if cells}


def test_cells_domains_changed_interleaved_go_with_the_last() -> None:
    """Attribution rules (replay._compaction._Attribution): runs in changeset order
    split per domain; an interleaving (A, B, A on one cell) goes whole with the last
    domain that changed it; no-ops are dropped."""
    from replay._bulk import NetChanges
    from replay._compaction import _Attribution
    from replay._position import Position

    def cs(domain: int, changes: dict[bytes, tuple[bytes, bytes]], events: int) -> Changeset:
        keys = list(changes)
        net = NetChanges(keys, [changes[k][1] for k in keys], [changes[k][0] for k in keys],
                         [0, len(keys)], [events])
        return Changeset(domain, 1, events, Position(domain, 1, 1, 0), net, 0)

    a = _Attribution()
    a.add([cs(7, {b"x": (b"", b"1"), b"y": (b"", b"1"), b"n": (b"", b"1")}, 3),
           cs(9, {b"x": (b"1", b"2"), b"z": (b"", b"9")}, 2),
           cs(7, {b"x": (b"2", b"3"), b"y": (b"1", b"2"), b"n": (b"1", b"")}, 1),
           cs(9, {b"y": (b"2", b"3")}, 1)])
    assert a.order == {7: 4, 9: 3}
    # x: 7, 9, 7 interleaved -> whole with 7; y: 7 then 9 -> split; n: a no-op.
    assert a.rows() == [(7, b"x", b"", b"3"), (7, b"y", b"", b"2"), (9, b"y", b"2", b"3"),
                        (9, b"z", b"", b"9")]


# -- cursors inside a baseline ---------------------------------------------------------

def _prepopulated() -> MemoryStore:
    cells: dict[Any, Any] = {}
    for t in ("crashes", "issues"):
        for row in (1, 2, 3, "k", "z"):
            for c in ("a", "b"):
                cells[(t, row, c)] = f"{t}{row}{c}"
    return MemoryStore(cells)


def build_baseline_log(seed: int, chunk_rows: int, before: bool, batches: int = 8,
                       records: int = 2) -> InMemoryObjectStore:
    """A store that held data before its agent: (``before``: a round of writes first,
    which a fresh consumer cannot check until the baseline), a baseline taken in small
    chunks while writers run, more rounds, then a second agent's baseline (a trusted
    reader applies its chunks as corrections: carry)."""
    objs = InMemoryObjectStore(f"baseline-{seed}", sleep=no_sleep)
    store = _prepopulated()
    options = WriterOptions(batch_size_records=records)
    agent = Agent(store, Wal3Sink(objs, options=options))
    rows = (1, 2, 3, "k", "z")
    if before:
        Workload(threads=1, batches=3, seed=seed, rows=rows).run(agent)
        agent.flush()
    writers = threading.Thread(target=Workload(threads=2, batches=batches, seed=seed + 1,
                                               rows=rows).run, args=(agent,))
    writers.start()
    agent.snapshot(chunk_rows=chunk_rows)
    writers.join()
    agent.flush()
    for r in range(2):
        Workload(threads=2, batches=batches // 3 + 1, seed=seed + 2 + r, rows=rows).run(agent)
        agent.flush()
    agent.close()
    second = Agent(store, Wal3Sink(objs, options=options))
    second.snapshot(chunk_rows=chunk_rows)
    Workload(threads=1, batches=3, seed=seed + 5, rows=rows).run(second)
    second.close()
    return objs


def _waits(asm: Assembler) -> bool:
    return any(t.held is not None for t in asm._baselines._tracks.values())


def _inside(asm: Assembler) -> bool:
    return bool(asm._baselines.carry) or any(
        t.covered is not None for t in asm._baselines._tracks.values())


@settings(max_examples=8, deadline=None, phases=_PHASES,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(seed=st.integers(0, 10_000), chunk_rows=st.integers(1, 3), before=st.booleans(),
       fractions=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=3), pick=st.randoms())
def test_a_cursor_inside_a_baseline_is_retained(
        seed: int, chunk_rows: int, before: bool, fractions: list[float], pick: Any) -> None:
    objs = build_baseline_log(seed, chunk_rows, before)
    end = LogReader(objs).manifest().next_offset
    records = raw_records(objs)
    at = {p: positioned_at(records, p) for p in range(1, end + 1)}
    inside = [p for p, asm in at.items() if _inside(asm) and not _waits(asm)]
    assert inside, "the log has no offset inside a baseline"
    points = {max(1, min(end, 1 + int(f * (end - 1)))) for f in fractions}
    points.add(pick.choice(inside))
    waiting = sorted(p for p in points if _waits(at[p]))
    if waiting:  # a fresh consumer waits for a baseline there: refused, nothing written
        copy = clone(objs, "refused")
        for i, point in enumerate(sorted(points)):
            CursorStore(copy).init(f"reader{i}", point)
        with pytest.raises(InconsistentLog, match="waits for a baseline"):
            compact_log(copy)
        assert not any(k.startswith("state/") for k in copy.objects())
        points -= set(waiting)
    if not points:
        return
    ordered = sorted(points)
    for i, point in enumerate(ordered):
        CursorStore(objs).init(f"reader{i}", point)
    ref = Reference(records, ordered)
    compact_log(objs)
    check_state_chain(objs)
    read_compacted(objs, Assembler(), ref, None)
    for point in ordered:
        read_compacted(objs, positioned_at(records, point), ref, point)
