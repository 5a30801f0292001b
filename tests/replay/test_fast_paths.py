"""The fast paths equal the reference paths, on random logs and on damaged ones.

- ``Assembler.changesets`` (runs of intervals verified in one vectorised pass) against
  ``Assembler.feed`` one record at a time (one interval at a time, the Z-set cancel-out):
  the same changesets, then the same error.
- ``net_changes`` (chains in (batch, seq) order) against ``cancel_out`` (the Z-set sum).
- ``segment_digest_array`` and ``row_segment_digests`` against the setsum item written out
  from the codec's layout.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import struct
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay import Assembler, Changeset
from replay._bulk import BrokenChain, cancel_out, net_changes
from sequencer import EpochRecord
from sinks.codec import (
    SEGMENT_BITS,
    EpochRun,
    EventBatch,
    segment_digest_array,
    segment_digests,
)
from tests.sinks.kafka._simulate import Run, captured_run


@pytest.fixture(scope="module")
def runs() -> list[Run]:
    """Logs of 3 writer threads in overlapping batches (several epochs per interval):
    two of the random workload (many tables, every kind of write), one of one table;
    and one writer's single-event batches (each its own quiescent interval)."""
    from agent import Agent, MemoryStore
    from sinks import RecordingSink

    one_table = RecordingSink()
    agent = Agent(MemoryStore(), one_table)

    def write(offset: int) -> None:
        for start in range(0, 300, 5):
            with agent.batch():
                for i in range(start, start + 5):
                    agent.set("t", (offset + i * 7) % 40, "c", i)

    import threading

    workers = [threading.Thread(target=write, args=(w,)) for w in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    agent.close()
    singles = RecordingSink()
    single_agent = Agent(MemoryStore(), singles)
    for i in range(120):
        single_agent.set("t", i % 9, "c", i)
    single_agent.close()
    return [*(captured_run(seed=seed, threads=3, batches=50) for seed in (1, 2)),
            Run(one_table.items, {}, {}, 900), Run(singles.items, {}, {}, 120)]


def _outcome(changesets: list[Changeset], error: BaseException | None) -> tuple[Any, ...]:
    return ([(c.domain_id, c.epoch_seq, c.event_count, c._changes, c._before,
              c.position.epoch_seq, c.position.end_id) for c in changesets],
            None if error is None else (type(error).__name__, str(error)))


def _streamed(items: list[Any]) -> tuple[Any, ...]:
    assembler, out = Assembler(), []
    try:
        for item in items:
            out += assembler.feed(item)
        assembler.check_gaps()
    except Exception as exc:
        return _outcome(out, exc)
    return _outcome(out, None)


def _bulk(items: list[Any]) -> tuple[Any, ...]:
    out: list[Changeset] = []
    try:
        out.extend(Assembler().changesets(items))
    except Exception as exc:
        return _outcome(out, exc)
    return _outcome(out, None)


def _with_event(batch: EventBatch, row: int, **change: bytes) -> EventBatch:
    rows = batch.data.to_pylist()
    rows[row] = {**rows[row], **change}
    return EventBatch(pa.RecordBatch.from_pylist(rows, schema=batch.data.schema))


def _damage(items: list[Any], kind: str, rng: random.Random) -> list[Any]:
    items = list(items)
    batches = [i for i, r in enumerate(items) if isinstance(r, EventBatch) and len(r)]
    epochs = [i for i, r in enumerate(items) if isinstance(r, EpochRecord)]
    if kind == "drop event":
        i = rng.choice(batches)
        rows = items[i].data.to_pylist()
        del rows[rng.randrange(len(rows))]
        items[i] = EventBatch(pa.RecordBatch.from_pylist(rows, schema=items[i].data.schema))
    elif kind == "alter new":
        i = rng.choice(batches)
        items[i] = _with_event(items[i], rng.randrange(len(items[i])), new=b"\x04altered")
    elif kind == "alter old":
        i = rng.choice(batches)
        items[i] = _with_event(items[i], rng.randrange(len(items[i])), old=b"\x02" + bytes(8))
    elif kind == "duplicate batch":
        i = rng.choice(batches)
        after = next((j for j in epochs if j > i), len(items))
        items.insert(rng.randint(i + 1, after), items[i])
    elif kind == "drop epoch":
        del items[rng.choice(epochs)]
    elif kind == "forge count":
        i = rng.choice(epochs)
        items[i] = dataclasses.replace(items[i], event_count=items[i].event_count + 1)
    elif kind == "forge tables":
        i = rng.choice([j for j in epochs if items[j].table_counts] or epochs)
        counts = list(items[i].table_counts) or [("t", 0)]
        counts[0] = ("renamed", counts[0][1])
        items[i] = dataclasses.replace(items[i], table_counts=tuple(counts))
    elif kind == "forge setsum":
        i = rng.choice(epochs)
        items[i] = dataclasses.replace(items[i], setsum="1" * 64)
    elif kind == "shuffle batches":
        # Any order among the batches between two epoch records.
        start = 0
        for j in [*epochs, len(items)]:
            block = items[start:j]
            rng.shuffle(block)
            items[start:j] = block
            start = j + 1
    return items


_KINDS = ["none", "drop event", "alter new", "alter old", "duplicate batch", "drop epoch",
          "forge count", "forge tables", "forge setsum", "shuffle batches"]


@pytest.mark.parametrize("kind", _KINDS)
@pytest.mark.parametrize("which", range(4))
@settings(max_examples=5, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from([None, 1, 7, 50]))
def test_bulk_changesets_equal_one_interval_at_a_time(
        runs: list[Run], kind: str, which: int, seed: int, drain_every: int | None) -> None:
    """Same changesets, then the same InconsistentLog (message included), whatever the
    damage (each kind on each log), and however often the bulk path drains."""
    import replay._assembler as assembler_module

    items = _damage(runs[which].items, kind, random.Random(seed))
    want = _streamed(items)
    if drain_every is not None:
        original = assembler_module._BULK_EVENTS
        assembler_module._BULK_EVENTS = drain_every  # type: ignore[misc]
        try:
            got = _bulk(items)
        finally:
            assembler_module._BULK_EVENTS = original  # type: ignore[misc]
    else:
        got = _bulk(items)
    assert got == want
    if kind == "none":
        assert want[1] is None and want[0]


def _as_runs(items: list[Any], rng: random.Random, *, lone: bool = False) -> list[Any]:
    """``items`` as a version 3 log holds them: consecutive epoch records grouped into
    ``EpochRun``s at random cuts (a run of one, of a few, of many). With ``lone``, a
    group of one stays an ``EpochRecord``, as the shipper writes a flush of one epoch."""
    out: list[Any] = []
    pending: list[EpochRecord] = []
    for item in [*items, None]:
        if isinstance(item, EpochRecord):
            pending.append(item)
            if rng.random() > 0.2:
                continue
        if len(pending) == 1 and lone:
            out.append(pending[0])
        elif pending:
            out.append(EpochRun.from_records(pending))
        pending = []
        if item is not None and not isinstance(item, EpochRecord):
            out.append(item)
    return out


def _shipped(items: list[Any], rng: random.Random) -> list[Any]:
    """``items`` (events, then epoch records) in the order a shipper writes them: a
    flush of one to four epochs is their events, then their records. A flush can end
    past the last quiescence point, so a drain leaves part of a tail piece held."""
    events = pa.Table.from_batches([i.data for i in items if isinstance(i, EventBatch)])
    epochs = sorted((i for i in items if isinstance(i, EpochRecord)),
                    key=lambda r: (r.domain_id, r.epoch_seq))
    rest = [i for i in items if not isinstance(i, (EventBatch, EpochRecord))]
    domain_ids = events.column("domain_id").to_numpy()
    batch_ids = events.column("batch_id").to_numpy()
    out: list[Any] = []
    while epochs:
        size = rng.randint(1, 4)
        flush, epochs = epochs[:size], epochs[size:]
        inside = np.zeros(len(batch_ids), dtype=bool)
        for record in flush:
            inside |= ((domain_ids == record.domain_id) & (batch_ids >= record.begin_id)
                       & (batch_ids < record.end_id))
        if inside.any():
            out.append(EventBatch(events.filter(pa.array(inside)).combine_chunks()
                                  .to_batches()[0]))
        out += flush
    return out + rest


def _expanded(items: list[Any]) -> list[Any]:
    return [r for item in items for r in (item.records() if isinstance(item, EpochRun)
                                          else [item])]


def _damage_runs(items: list[Any], kind: str, rng: random.Random) -> list[Any]:
    """Damage only a log of runs can show: runs delivered again, out of order or
    overlapping (their records are then taken one by one)."""
    runs = [i for i, r in enumerate(items) if isinstance(r, EpochRun)]
    if kind == "repeat run":  # a copy later in the log (a reader resumed a fragment back)
        i = rng.choice(runs)
        items.insert(rng.randint(i + 1, len(items)), items[i])
    elif kind == "overlapping run":  # a run of records some of which were already sent
        i = rng.choice(runs)
        records = items[i].records()
        later = [j for j in runs if j > i]
        j = rng.choice(later) if later else i
        extra = items[j].records() if later else []
        cut = rng.randrange(len(records))
        # After the last run it repeats, as a copy comes (a writer's retry, a resumed
        # reader): placed earlier, a later run's records would come before their events,
        # which the record-by-record reference refuses the moment it sees them while the
        # bulk path, holding the events that follow, replays the log whole (seed
        # 2046968324 found it: the same states as without the copy).
        items.insert(rng.randint(j + 1, len(items)),
                     EpochRun.from_records(records[cut:] + extra[:rng.randint(0, 3)]))
    elif kind == "forge run row":  # one row of a run altered in its Arrow columns
        i = rng.choice(runs)
        rows = items[i].data.to_pylist()
        row = rng.randrange(len(rows))
        field = rng.choice(["begin_id", "end_id", "event_count", "quiescent", "setsum"])
        value = rows[row][field]
        rows[row][field] = (not value if field == "quiescent" else
                            bytes(31) + b"\x01" if field == "setsum" else value + 1)
        items[i] = EpochRun(pa.RecordBatch.from_pylist(rows, schema=items[i].data.schema))
    return items


_RUN_KINDS = [*_KINDS, "repeat run", "overlapping run", "forge run row"]


@pytest.mark.parametrize("kind", _RUN_KINDS)
@pytest.mark.parametrize("which", range(4))
@settings(max_examples=2, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from([None, 1, 50]))
def test_epoch_runs_equal_their_records_one_at_a_time(
        runs: list[Run], kind: str, which: int, seed: int, drain_every: int | None) -> None:
    """A log whose epoch records come as runs (verified as columns, no record per epoch)
    gives the same changesets, then the same InconsistentLog, as its records fed one at
    a time, damaged inside a run or not, through ``changesets`` and through ``feed``."""
    import replay._assembler as assembler_module

    rng = random.Random(seed)
    lone = rng.random() < 0.5  # flushes of one epoch as lone records between the runs
    log = _shipped(runs[which].items, rng) if rng.random() < 0.5 else runs[which].items
    if kind in _KINDS:
        items = _as_runs(_damage(log, kind, rng), rng, lone=lone)
    else:
        items = _damage_runs(_as_runs(log, rng, lone=lone), kind, rng)
    want = _streamed(_expanded(items))
    original = assembler_module._BULK_EVENTS
    if drain_every is not None:
        assembler_module._BULK_EVENTS = drain_every  # type: ignore[misc]
    try:
        got = _bulk(items)
    finally:
        assembler_module._BULK_EVENTS = original  # type: ignore[misc]
    assert got == want
    assert _streamed(items) == want  # feed(EpochRun): the run's records in order
    if kind in ("none", "repeat run", "shuffle batches"):
        assert want[1] is None and want[0]


@pytest.mark.parametrize("shipped", [False, True])
@pytest.mark.parametrize("which", range(4))
@settings(max_examples=4, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from([None, 1, 50]))
def test_a_sound_log_of_runs_never_expands_a_run(
        runs: list[Run], which: int, shipped: bool, seed: int, drain_every: int | None
) -> None:
    """Undamaged, every run is verified from its columns: no ``EpochRecord`` is built
    (a run expanded would mean the one-interval path took over, slowly). Shipped, the
    log has lone records between its runs, and drains that end inside a tail piece."""
    import replay._assembler as assembler_module

    rng = random.Random(seed)
    log = _shipped(runs[which].items, rng) if shipped else runs[which].items
    items = _as_runs(log, rng, lone=shipped)
    want = _streamed(_expanded(items))

    def refuse(self: EpochRun) -> list[EpochRecord]:
        raise AssertionError("a run was expanded into records")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(EpochRun, "records", refuse)
        if drain_every is not None:
            patch.setattr(assembler_module, "_BULK_EVENTS", drain_every)
        assert _bulk(items) == want


def _values() -> st.SearchStrategy[bytes]:
    return st.sampled_from([b"", b"\x02a", b"\x02b", b"\x02c", b"\x00"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), _values(), _values()), max_size=30),
       st.dictionaries(st.integers(0, 3).map(lambda k: b"k%d" % k), _values()),
       st.data())
def test_net_changes_equal_the_z_set_cancel_out(events: list[tuple[int, bytes, bytes]],
                                                state: dict[bytes, bytes],
                                                data: st.DataObject) -> None:
    """Random events (chained, broken, looping), split into intervals: the same changes
    per interval, or both refuse."""
    n = len(events)
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=3)))
    interval = np.searchsorted(np.array(cuts, dtype=np.int64), np.arange(n), side="right")
    n_intervals = len(cuts) + 1
    keys = pa.array([b"k%d" % k for k, _, _ in events], pa.binary())
    old = pa.array([o for _, o, _ in events], pa.binary())
    new = pa.array([w for _, _, w in events], pa.binary())
    state = {k: v for k, v in state.items() if v}
    reference = cancel_out(state, keys, old, new, interval.astype(np.int64), n_intervals)
    fast = net_changes(state, keys, old, new, interval.astype(np.int64), n_intervals)
    if isinstance(reference, BrokenChain):
        assert isinstance(fast, BrokenChain)
        return
    assert not isinstance(fast, BrokenChain)
    for i, result in enumerate(reference):
        lo, hi = fast.bounds[i], fast.bounds[i + 1]
        assert dict(zip(fast.keys[lo:hi], fast.finals[lo:hi], strict=True)) == result.changes
        assert dict(zip(fast.keys[lo:hi], fast.initials[lo:hi], strict=True)) == result.before
        assert fast.counts[i] == result.event_count


def _spec_digests(data: pa.RecordBatch) -> list[tuple[int, int, bytes]]:
    """The setsum items exactly as the codec's docstring lays them out, one at a time."""
    rows = data.to_pylist()
    out: list[tuple[int, int, bytes]] = []
    i = 0
    while i < len(rows):
        j = i
        key = (rows[i]["domain_id"], rows[i]["batch_id"], rows[i]["seq"] >> SEGMENT_BITS)
        while j < len(rows) and (rows[j]["domain_id"], rows[j]["batch_id"],
                                 rows[j]["seq"] >> SEGMENT_BITS) == key:
            j += 1
        segment = rows[i:j]
        item = b"CDCSEG1\x00" + struct.pack(">QQI", key[0], key[1], len(segment))
        item += b"".join(struct.pack(">I", r["seq"]) for r in segment)
        for name in ("table", "row", "column", "old", "new"):
            raw = [r[name].encode() if isinstance(r[name], str) else r[name] for r in segment]
            item += b"".join(struct.pack(">I", len(v)) for v in raw) + b"".join(raw)
        out.append((key[0], key[1], hashlib.sha3_256(item).digest()))
        i = j
    return out


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(1, 3), st.integers(0, 3),
                          st.text(max_size=3), st.binary(max_size=4), st.binary(max_size=4)),
                max_size=25),
       st.integers(1, 40))
def test_segment_digest_array_matches_the_layout(
        rows: list[tuple[int, int, int, str, bytes, bytes]], piece: int) -> None:
    """Digests of every segment at once equal the layout's item hashed one by one, also
    when the work is cut into pieces (segments of up to 2**16 seqs share a batch)."""
    import sinks.codec as codec

    events = sorted({(d, b, s << SEGMENT_BITS if s == 3 else s): (t, o, w)
                     for d, b, s, t, o, w in rows}.items())
    data = pa.RecordBatch.from_pylist(
        [{"domain_id": d, "batch_id": b, "seq": s, "table": t or "t", "row": b"\x02" + o,
          "column": "c", "old": o, "new": w} for (d, b, s), (t, o, w) in events],
        schema=codec.EVENT_SCHEMA)
    want = _spec_digests(data)
    original, small = codec._ITEM_ROWS, codec._SMALL_ROWS
    codec._ITEM_ROWS = piece  # type: ignore[misc]
    codec._SMALL_ROWS = piece % 3 * 10  # type: ignore[misc]
    try:
        starts, digests = segment_digest_array(data)
        assert list(segment_digests(data)) == want
    finally:
        codec._ITEM_ROWS = original  # type: ignore[misc]
        codec._SMALL_ROWS = small  # type: ignore[misc]
    assert [digests[32 * k:32 * k + 32] for k in range(len(starts))] == [d for *_, d in want]
    # The same items from Python rows (a Kafka partition's few events), no Arrow.
    rows_py = [tuple(r.values()) for r in data.to_pylist()]
    assert codec.row_segment_digests(rows_py) == [d for *_, d in want]


def test_read_log_runs_replays_like_its_records() -> None:
    """``read_log(runs=True)`` yields each EPOCHS message as its ``EpochRun`` (the agent
    writes runs to a wal3 log), and the assembler gives from it the changesets it gives
    from the records one by one."""
    from agent import Agent, MemoryStore
    from sinks.wal3 import Wal3Sink, read_log

    uri = "memory://read-log-runs"
    agent = Agent(MemoryStore(), Wal3Sink(uri))
    for i in range(40):
        with agent.batch():
            agent.set("t", i % 7, "c", i)
            agent.set("u", i % 3, "d", -0.0 if i % 2 else float("nan"))
    agent.close()
    items = list(read_log(uri, runs=True))
    assert any(isinstance(r, EpochRun) for r in items)
    assert not any(isinstance(r, EpochRecord) for r in items)
    want = _bulk(list(read_log(uri)))
    assert want[1] is None and len(want[0]) >= 40
    assert _bulk(items) == want
    assert _streamed(items) == want
