"""Chunks cut to the sink's size: a sink with ``snapshot_max_bytes`` (Kafka's message
limit) gets chunks of whole rows within it, all still tiling the rows, and a consumer
from nothing rebuilds the store."""

from __future__ import annotations

import itertools
import random
import threading
import time
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from agent import Agent, MemoryStore
from agent._baseline import split_rows
from replay import Assembler
from sinks import MemorySink, SinkBackpressure
from sinks.codec import RowCells, SnapshotChunk, cells_batch, row_order
from tests.agent.test_baseline import _bits, _prepopulated, _writer


class SmallMessageSink(MemorySink):
    """A MemorySink that, like KafkaSink, takes chunks of at most ``snapshot_max_bytes``."""

    def __init__(self, max_bytes: int, *, refuse_at: int | None = None) -> None:
        super().__init__()
        self.snapshot_max_bytes = max_bytes
        self.refuse_at = refuse_at  # the write_snapshot call that is pushed back once
        self.calls = 0

    def write_snapshot(self, chunk: SnapshotChunk) -> None:
        self.calls += 1
        if self.calls == self.refuse_at:
            raise SinkBackpressure("behind: took nothing, try again")
        super().write_snapshot(chunk)


def _big_store(rng: random.Random, rows: int, big: int) -> MemoryStore:
    store = _prepopulated(rng, rows)
    for i in range(big):  # rows with large values among the small ones
        store.exchange(rng.choice(["t", "u"]), rng.randrange(-50, 500), "big",
                       "x" * rng.randrange(200, 3000) if i % 2 else bytes(rng.randrange(900)))
    return store


def _rows(chunk: SnapshotChunk) -> set[Any]:
    return {(t, r) for t, r, _c, _v in chunk.cells()}


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck),
          phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(seed=st.integers(0, 10_000), max_bytes=st.integers(300, 5000),
       chunk_rows=st.integers(3, 60), writers=st.integers(0, 2),
       refuse_at=st.none() | st.integers(1, 12))
def test_chunks_fit_the_sink_and_a_consumer_rebuilds_the_store(
        seed: int, max_bytes: int, chunk_rows: int, writers: int,
        refuse_at: int | None) -> None:
    """Property: with writers running and a sink taking small chunks (pushing back
    once, mid-split), every chunk fits unless it is one row, chunks are numbered in order
    and tile the rows, the report counts them, and a consumer given nothing has the
    store's state at every quiescence point after the baseline."""
    rng = random.Random(seed)
    store = _big_store(rng, 80, 12)
    sink = SmallMessageSink(max_bytes, refuse_at=refuse_at)
    truth: dict[int, dict[Any, bytes]] = {}
    agent = Agent(store, sink, on_quiescence=lambda m: truth.__setitem__(
        m.epoch_seq, _bits(store.snapshot())))
    stop = threading.Event()
    threads = [threading.Thread(target=_writer, args=(agent, seed + i, stop))
               for i in range(writers)]
    for t in threads:
        t.start()
    time.sleep(0.005)
    report = agent.snapshot(chunk_rows=chunk_rows)
    stop.set()
    for t in threads:
        t.join()
    agent.close()
    chunks = sink.snapshot_chunks
    assert [c.index for c in chunks] == list(range(len(chunks))) == list(range(report.chunks))
    assert report.cells == sum(len(c) for c in chunks)
    assert chunks[0].lo is None and chunks[-1].hi is None and chunks[-1].last
    assert not any(c.last for c in chunks[:-1])
    for before, after in itertools.pairwise(chunks):
        assert after.lo == before.hi
    for chunk in chunks:
        assert chunk.data.nbytes <= max_bytes or len(_rows(chunk)) == 1, chunk.index
        assert chunk.actual_setsum() == chunk.setsum
    if max_bytes < 2000:
        assert len(chunks) > len({(c.epoch_seq, c.end_id) for c in chunks}), \
            "no chunk read in one hold was cut"
    asm = Assembler()
    states = {}
    for record in sink.records:
        for changeset in asm.feed(record):
            states[changeset.epoch_seq] = _bits(asm.state)
    asm.check_gaps()
    after = {q: s for q, s in states.items() if q > report.last_point[0]}
    assert after
    for q, state in after.items():
        assert state == truth[q], q


def test_split_rows_keeps_rows_whole_and_in_order() -> None:
    """Pieces are runs of whole rows in row order, each within the budget unless a
    single row is larger (then it is a piece of its own)."""
    cells = [("t", 2, "a", "x" * 50), ("t", 1, "a", "y" * 50), ("t", 1, "b", "z" * 50),
             ("s", "k", "a", 1), ("t", 3, "a", b"w" * 500)]
    grouped = RowCells.of(cells)  # type: ignore[arg-type]
    data = cells_batch(grouped)
    pieces = split_rows(data, grouped.widths, 120)
    flat = [c for start, end in pieces for c in _decoded(data.slice(start, end - start))]
    assert sorted(flat, key=lambda c: (row_order(c[0], c[1]), c[2])) == flat
    assert sorted(map(repr, flat)) == sorted(map(repr, cells))
    rows = [[(c[0], c[1]) for c in _decoded(data.slice(start, end - start))]
            for start, end in pieces]
    # (t, 1) is two cells of 78 bytes: whole, it does not fit beside (s, k) (29 bytes)
    assert rows == [[("s", "k")], [("t", 1), ("t", 1)], [("t", 2)], [("t", 3)]]
    assert split_rows(data, grouped.widths, 10_000) == [(0, len(cells))]


def _decoded(data: Any) -> list[Any]:
    return SnapshotChunk.of_data(1, 1, 1, 1, 0, True, None, None, data).cells()
