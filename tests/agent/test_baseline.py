"""Baseline snapshots: a pre-populated store, writers running, a consumer from nothing."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import threading
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from agent import Agent, AsyncAgent, AsyncMemoryStore, MemoryStore
from replay import Assembler, InconsistentLog
from sequencer import ABSENT as ABSENT_
from sequencer import EpochRecord
from sinks import MemorySink
from sinks.codec import SnapshotChunk, encode_value
from sinks.wal3 import Wal3Sink, read_log


def _bits(state: dict[Any, Any]) -> dict[Any, bytes]:
    return {cell: encode_value(value) for cell, value in state.items()}


def _prepopulated(rng: random.Random, rows: int) -> MemoryStore:
    cells: dict[Any, Any] = {}
    for i in range(rows):
        table = rng.choice(["t", "u", "v"])
        row: int | str = rng.randrange(-50, 500) if rng.random() < 0.7 else f"r{i}"
        for column in rng.sample(["a", "b", "c"], rng.randrange(1, 4)):
            cells[(table, row, column)] = rng.choice([i, -0.0, "é", b"\x00", None, True])
    return MemoryStore(cells)


def _writer(agent: Agent, seed: int, stop: threading.Event, limit: int | None = None) -> None:
    rng = random.Random(seed)
    for _ in itertools.count() if limit is None else range(limit):
        if stop.is_set():
            break
        with agent.batch():
            for _ in range(rng.randrange(1, 5)):
                table = rng.choice(["t", "u", "v"])
                row: int | str = (rng.randrange(-60, 520) if rng.random() < 0.7
                                  else f"r{rng.randrange(300)}")
                column = rng.choice(["a", "b", "c"])
                roll = rng.random()
                if roll < 0.2:
                    agent.delete(table, row, column)
                elif roll < 0.25:
                    agent.clear_row(table, row)
                else:
                    agent.set(table, row, column, rng.randrange(1000))


def _run(seed: int, rows: int, chunk_rows: int, writers: int, limit: int | None = None
         ) -> tuple[MemorySink, dict[int, dict[Any, bytes]], Any]:
    rng = random.Random(seed)
    store = _prepopulated(rng, rows)
    sink = MemorySink()
    truth: dict[int, dict[Any, bytes]] = {0: _bits(store.snapshot())}
    agent = Agent(store, sink, on_quiescence=lambda m: truth.__setitem__(
        m.epoch_seq, _bits(store.snapshot())))
    stop = threading.Event()
    threads = [threading.Thread(target=_writer, args=(agent, seed * 10 + i, stop, limit))
               for i in range(writers)]
    for t in threads:
        t.start()
    time.sleep(0.01)  # the writers start before the baseline: pre-baseline events
    report = agent.snapshot(chunk_rows=chunk_rows)
    time.sleep(0.01)
    stop.set()
    for t in threads:
        t.join()
    agent.close()
    return sink, truth, report


def _states_feed(records: list[Any]) -> dict[int, dict[Any, bytes]]:
    asm = Assembler()
    states = {}
    for record in records:
        for changeset in asm.feed(record):
            states[changeset.epoch_seq] = _bits(asm.state)
    asm.check_gaps()
    return states


def _states_bulk(records: list[Any]) -> dict[int, dict[Any, bytes]]:
    return {s.epoch_seq: _bits(s.state) for s in Assembler().replay(records)}


# No shrinking: each example runs writer threads, and a failure's seed is printed anyway.
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck),
          phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(seed=st.integers(0, 10_000), rows=st.integers(0, 120), chunk_rows=st.integers(4, 40),
       writers=st.integers(0, 3))
def test_baseline_under_writers_rebuilds_the_store_from_nothing(
        seed: int, rows: int, chunk_rows: int, writers: int) -> None:
    """Property: after a baseline taken while writers run, a consumer given no initial
    state has the store's exact state at every quiescence point (fed record by record
    and in bulk)."""
    # Each writer stops after 1,000 batches (at full speed: a pause between batches
    # would hide races at the chunk boundaries): unbounded writers create rows ahead of
    # the walk faster than it lists them, up to 100,000 records and a minute an example.
    sink, truth, report = _run(seed, rows, chunk_rows, writers, limit=1000)
    assert report.chunks == len(sink.snapshot_chunks) >= 1
    assert report.cells == sum(len(c) for c in sink.snapshot_chunks)
    last = report.last_point[0]
    for states in (_states_feed(sink.records), _states_bulk(sink.records)):
        # The last chunk's changes go out at the next quiescence point, which the
        # agent makes right after the baseline.
        after = {q: s for q, s in states.items() if q > last}
        assert after, "no quiescence point after the baseline"
        for q, state in after.items():
            assert state == truth[q], q


def test_writers_get_in_between_chunks() -> None:
    """Writers wait for one chunk at a time, not for the whole baseline: with writers
    running, the chunks are read at many different quiescence points."""
    sink, _truth, report = _run(3, 300, 10, 3)
    points = {c.epoch_seq for c in sink.snapshot_chunks}
    assert report.chunks >= 30
    assert len(points) > report.chunks // 2
    assert report.first_point != report.last_point


def test_chunks_tile_the_rows_and_cover_every_cell() -> None:
    store = _prepopulated(random.Random(5), 100)
    sink = MemorySink()
    with Agent(store, sink) as agent:
        report = agent.snapshot(chunk_rows=7)
    chunks = sink.snapshot_chunks
    assert chunks[0].lo is None and chunks[-1].hi is None and chunks[-1].last
    assert [c.index for c in chunks] == list(range(len(chunks)))
    for before, after in itertools.pairwise(chunks):
        assert before.hi == after.lo
    listed = {(t, r, c): v for chunk in chunks for t, r, c, v in chunk.cells()}
    assert _bits(listed) == _bits(store.snapshot())
    assert report.cells == len(listed)


def test_memory_store_walk_sees_rows_created_ahead_and_skips_deleted() -> None:
    store = MemoryStore({("t", i, "a"): i for i in range(10)})
    first = store.list_cells(None, 3)
    assert [c[1] for c in first.cells] == [0, 1, 2] and first.next == ("t", 3)
    store.exchange("t", 4, "a", ABSENT_)  # deleted ahead: not listed
    store.exchange("t", 5, "b", "new")  # a new cell ahead: listed
    store.exchange("t", 100, "a", 1)  # a new row ahead: listed
    store.exchange("t", 1, "z", 1)  # behind the walk: not listed again
    store.exchange("a", "x", "a", 1)  # another table, before: not listed
    rest = []
    start = first.next
    while start is not None:
        chunk = store.list_cells(start, 3)
        rest += chunk.cells
        start = chunk.next
    rows = [(t, r, c) for t, r, c, _ in rest]
    assert ("t", 4, "a") not in rows and ("t", 5, "b") in rows and ("t", 100, "a") in rows
    assert ("t", 1, "z") not in rows and ("a", "x", "a") not in rows
    assert len(rows) == len(set(rows))


@settings(max_examples=40, deadline=None)
@given(keys=st.lists(st.tuples(st.sampled_from("tu"),
                               st.integers(-5, 40) | st.text("ab\u00e9", max_size=3),
                               st.sampled_from("abc")), max_size=60, unique=True),
       limit=st.integers(1, 9), recreate=st.booleans())
def test_memory_store_lists_whole_rows_in_snapshot_row_order(
        keys: list[tuple[str, Any, str]], limit: int, recreate: bool) -> None:
    """Property: the walk's chunks, as RowCells columns, list every cell once, rows
    whole and in snapshot row order (int keys before str keys of a table, whether or
    not a table mixes them), and a row deleted then recreated ahead is listed."""
    from sinks.codec import RowCells, row_order

    store = MemoryStore({k: i for i, k in enumerate(keys)})
    chunks = []
    start = None
    while True:
        chunk = store.list_cells(start, limit)
        assert type(chunk.cells) is RowCells and 0 not in chunk.cells.widths
        chunks.append(chunk)
        if recreate and chunk.next is not None and len(chunks) == 1:  # a row ahead
            table, row, column = max(keys, key=lambda k: row_order(k[0], k[1]))
            store.exchange(table, row, column, ABSENT_)
            store.exchange(table, row, column, "back")
        start = chunk.next
        if start is None:
            break
    listed = [cell for chunk in chunks for cell in chunk.cells]
    rows = [(t, r) for t, r, _c, _v in listed]
    assert rows == sorted(rows, key=lambda k: row_order(*k))
    assert len(set(rows)) == len(list(itertools.groupby(rows)))  # each row in one run
    assert _bits({(t, r, c): v for t, r, c, v in listed}) == _bits(store.snapshot())
    assert len(listed) == len(store.snapshot())


def test_a_fresh_consumer_without_baseline_still_fails_on_a_prepopulated_store() -> None:
    store = MemoryStore({("t", 1, "a"): 1})
    sink = MemorySink()
    with Agent(store, sink) as agent:
        agent.set("t", 1, "a", 2)
    with pytest.raises(InconsistentLog, match="did not replace the value the cell held"):
        list(Assembler().replay(sink.records))
    with pytest.raises(InconsistentLog, match="did not replace the value the cell held"):
        _states_feed(sink.records)


def test_a_consumer_with_state_applies_chunks_as_corrections() -> None:
    """A consumer that follows the log with the state it was given gets every chunk's
    differences as a changeset at the chunk's quiescence point."""
    store = MemoryStore({("t", 1, "a"): 1, ("t", 2, "a"): 2})
    sink = MemorySink()
    with Agent(store, sink) as agent:
        agent.snapshot()
        agent.set("t", 1, "a", 3)
    wrong = {("t", 1, "a"): 1, ("t", 9, "a"): 9}  # misses row 2, holds a row 9 the store has not
    snaps = list(Assembler(initial_state=wrong).replay(sink.records))
    assert snaps[-1].state == {("t", 1, "a"): 3, ("t", 2, "a"): 2}


def _tampered(records: list[Any], change: Any) -> list[Any]:
    out = []
    for record in records:
        if isinstance(record, SnapshotChunk):
            record = change(record)
        if record is not None:
            out.append(record)
    return out


def _baseline_log() -> MemorySink:
    store = MemoryStore({("t", i, "a"): i for i in range(20)})
    sink = MemorySink()
    with Agent(store, sink) as agent:
        agent.snapshot(chunk_rows=5)
        agent.set("t", 3, "a", "x")
    return sink


def test_an_altered_chunk_is_refused() -> None:
    import dataclasses

    import pyarrow as pa

    sink = _baseline_log()

    def alter(chunk: SnapshotChunk) -> SnapshotChunk:
        if chunk.index != 1:
            return chunk
        values = chunk.data.column(3).to_pylist()
        values[0] = encode_value(12345)
        data = chunk.data.set_column(3, "value", pa.array(values, pa.binary()))
        return dataclasses.replace(chunk, data=data)

    with pytest.raises(InconsistentLog, match="setsum of its cells"):
        list(Assembler().replay(_tampered(sink.records, alter)))


def test_a_missing_chunk_is_refused() -> None:
    sink = _baseline_log()
    records = _tampered(sink.records, lambda c: None if c.index == 2 else c)
    with pytest.raises(InconsistentLog, match=r"chunk 3 .* where chunk 2"):
        list(Assembler().replay(records))


def test_async_agent_snapshot() -> None:
    async def main() -> tuple[MemorySink, dict[Any, Any]]:
        store = AsyncMemoryStore(MemoryStore({("t", i, "a"): i for i in range(50)}))
        sink = MemorySink()
        agent = AsyncAgent(store, sink)

        async def write() -> None:
            for i in range(200):
                await agent.set("t", i % 70, "a", -i)

        writer = asyncio.create_task(write())
        report = await agent.snapshot(chunk_rows=8)
        await writer
        assert report.chunks >= 7
        agent.close()
        return sink, store.sync.snapshot()

    sink, final = asyncio.run(main())
    snaps = list(Assembler().replay(sink.records))
    assert _bits(snaps[-1].state) == _bits(final)


def test_baseline_through_wal3_then_read_log_from_nothing() -> None:
    store = _prepopulated(random.Random(9), 80)
    sink = Wal3Sink("memory://baseline-wal3")
    with Agent(store, sink) as agent:
        agent.set("t", 1, "a", "before")
        agent.snapshot(chunk_rows=9)
        agent.set("t", 1, "a", "after")
    records = list(read_log("memory://baseline-wal3"))
    assert any(isinstance(r, SnapshotChunk) for r in records)
    assert all(isinstance(r, SnapshotChunk | EpochRecord) or len(r) for r in records)
    snaps = list(Assembler().replay(records))
    assert _bits(snaps[-1].state) == _bits(store.snapshot())


def test_snapshot_needs_a_listable_store() -> None:
    class Plain:
        def exchange(self, *a: Any) -> Any: ...

    with Agent(Plain(), MemorySink()) as agent, \
            pytest.raises(TypeError, match="cannot list its cells"):
        agent.snapshot()


class _FailingSink(MemorySink):
    """A MemorySink that fails at its ``fail_at``-th snapshot chunk (the agent 'dies')."""

    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.fail_at = fail_at

    def write_snapshot(self, chunk: SnapshotChunk) -> None:
        if len(self.snapshot_chunks) == self.fail_at:
            raise OSError("disk gone")
        super().write_snapshot(chunk)


@pytest.mark.parametrize("fail_at", [0, 1, 3])
def test_a_baseline_cut_short_then_a_new_agent_takes_another(fail_at: int) -> None:
    """A crash in the middle of a baseline (the sink fails at chunk ``fail_at``): the
    log ends with a partial baseline; a new agent (a new domain) takes a new one, and a
    consumer from nothing rebuilds the store after it, never raising on the old part."""
    from agent import ShippingFailed

    store = _prepopulated(random.Random(11), 60)
    first = _FailingSink(fail_at)
    agent = Agent(store, first)
    agent.set("t", 1, "a", "before the crash")
    with pytest.raises(ShippingFailed):
        agent.snapshot(chunk_rows=10)
    records = list(first.records)
    second = MemorySink()
    with Agent(store, second) as again:
        again.set("t", 2, "b", "after the restart")
        again.snapshot(chunk_rows=10)
        again.set("t", 3, "c", "later")
    snaps = list(Assembler().replay(records + second.records))
    assert _bits(snaps[-1].state) == _bits(store.snapshot())


def test_a_stream_waiting_for_a_baseline_that_never_comes_raises(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Fed record by record (a stream never ends), a held failure is raised once enough
    epochs wait behind it: the consumer does not stall in silence."""
    import replay._baseline

    monkeypatch.setattr(replay._baseline, "HOLD_LIMIT_EPOCHS", 20)
    store = MemoryStore({("t", 1, "a"): 1})
    sink = MemorySink()
    with Agent(store, sink) as agent:
        for i in range(30):
            agent.set("t", 1, "a", i + 2)
    asm = Assembler()
    with pytest.raises(InconsistentLog, match="did not replace the value the cell held"):
        for record in sink.records:
            asm.feed(record)


def test_snapshot_progress_reaches_the_metrics() -> None:
    """Each chunk's rows are counted per table in the agent's metrics; done at the end."""
    from prometheus_client import CollectorRegistry

    from agent._metrics import CaptureMetrics

    registry = CollectorRegistry()
    # Two cells per row of "a": rows are counted, not cells.
    store = MemoryStore({("a", i, c): i for i in range(25) for c in "xy"}
                        | {("b", "k", "y"): 1})
    with Agent(store, MemorySink(), metrics=CaptureMetrics(registry)) as agent:
        agent.snapshot(chunk_rows=7)
    rows = registry.get_sample_value
    assert rows("cdc_snapshot_rows_total", {"table": "a"}) == 25
    assert rows("cdc_snapshot_rows_total", {"table": "b"}) == 1
    assert rows("cdc_snapshot_done", {"table": "a"}) == 1


def test_two_async_baselines_at_once_are_refused() -> None:
    async def main() -> None:
        store = AsyncMemoryStore(MemoryStore({("t", i, "a"): i for i in range(40)}))
        agent = AsyncAgent(store, MemorySink())
        first = asyncio.create_task(agent.snapshot(chunk_rows=2))
        await asyncio.sleep(0)
        with pytest.raises(RuntimeError, match="already running"):
            await agent.snapshot()
        await first
        agent.close()

    asyncio.run(main())


@pytest.mark.parametrize("restart_completes", [True, False])
def test_a_crashed_domain_without_its_baseline_is_superseded_by_a_later_one(
        restart_completes: bool) -> None:
    """A crashed agent's write to a pre-existing cell reached the log, its baseline did
    not: a fresh consumer cannot verify that domain. A later domain's completed baseline
    (the restart's) supersedes it: its states are dropped, never applied, and the
    consumer rebuilds the store from the baseline on. Without a completed baseline after
    it, the failure stands."""
    store = MemoryStore({("t", 1, "a"): 69, ("t", 2, "a"): 7})
    first = MemorySink()
    with Agent(store, first) as crashed:
        crashed.set("t", 1, "a", "first")
    second = _FailingSink(1) if not restart_completes else MemorySink()
    restart = Agent(store, second)
    try:
        restart.snapshot(chunk_rows=1)
        restart.set("t", 3, "a", "restarted")
    except Exception:
        assert not restart_completes
    finally:
        with contextlib.suppress(Exception):
            restart.close()
    records = list(first.records) + list(second.records)
    if restart_completes:
        snaps = list(Assembler().replay(records))
        assert _bits(snaps[-1].state) == _bits(store.snapshot())
        assert all(s.domain_id != first.records[0].domain_id for s in snaps)
    else:
        with pytest.raises(InconsistentLog, match="did not replace the value the cell held"):
            list(Assembler().replay(records))
