"""Baseline snapshots: every cell of the wrapped store, as snapshot records in the log.

``Agent.snapshot()`` walks the store in chunks of rows, in the snapshot row order of
``sinks.codec``. For each chunk it holds new write batches back (as forced quiescence
does), waits for the open ones to end, reads the chunk's rows, hands the records to the
shipper, and lets writers go again: writers wait for at most one chunk, and each
chunk's cells are the true state of its rows at that quiescence point. The log order
(the chunk right after its quiescence point, before the next one) lets a consumer
apply the chunk at exactly that point: the events after it on those rows chain from
the chunk's values; rows not covered yet are rebuilt by a later chunk.

Stores take part by offering ``list_cells(start, limit)`` (``ListableStore``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa
import structlog

from agent._agent import QuiescenceTimeout
from agent._baseline_journal import BaselineJournal, finished_report, note_previous
from sequencer import RowKey, Value
from sinks import Setsum
from sinks.codec import Bound, RowCells, SnapshotCell, SnapshotChunk, cells_batch, decode_key

if TYPE_CHECKING:
    from agent._agent import _Capture

log = structlog.get_logger()

__all__ = ["AsyncListableStore", "BaselineReport", "CellChunk", "ListableStore",
           "SnapshotProgress"]

DEFAULT_CHUNK_ROWS = 10_000
_CELL_OVERHEAD = 16  # an Arrow offset per column: what a cell costs beyond its bytes
_CHUNK_OVERHEAD = 16  # and a chunk: the first offset of each column


@dataclass(frozen=True, slots=True)
class CellChunk:
    """What ``list_cells`` returns: the present cells of the rows from ``start`` up to
    (not including) ``next`` in snapshot row order; ``next`` is None at the end."""

    cells: Sequence[SnapshotCell]
    next: Bound | None


@runtime_checkable
class ListableStore(Protocol):
    """A store that can list its cells in chunks (needed by ``Agent.snapshot``)."""

    def list_cells(self, start: Bound | None, limit: int) -> CellChunk:
        """Every present cell of about ``limit`` whole rows from ``start`` on (None: the
        first row), in snapshot row order. Called while no write runs."""
        ...


class AsyncListableStore(Protocol):
    async def list_cells(self, start: Bound | None, limit: int) -> CellChunk: ...


@dataclass(frozen=True, slots=True)
class SnapshotProgress:
    """Reported after each chunk: for a progress bar or a metric."""

    baseline_id: int
    chunks: int
    cells: int
    rows_done_until: Bound | None  # None once finished
    hold_seconds: float  # how long writers were held back for this chunk


@dataclass(frozen=True)
class BaselineReport:
    """What ``snapshot()`` recorded, once every chunk is durable in the sink."""

    domain_id: int
    baseline_id: int
    chunks: int
    cells: int
    setsum: str
    first_point: tuple[int, int]  # (epoch_seq, end_id) of the first chunk
    last_point: tuple[int, int]  # ... and of the last: the log is whole from here on
    longest_hold: float  # seconds writers waited for one chunk at most
    elapsed: float


class ChunkNumbering:
    """The next chunk index of one baseline, taken as chunks are shipped: a chunk read
    in one hold may ship as several (``PendingSnapshot.ship_to``)."""

    def __init__(self) -> None:
        self.next = 0

    def take(self, count: int) -> int:
        first, self.next = self.next, self.next + count
        return first


@dataclass
class PendingSnapshot:
    """A chunk's cells handed to the shipper, which encodes and hashes it off the
    writers' path (``ship_to``) and keeps the result for the report.

    With ``numbering``, a chunk larger than the sink's ``snapshot_max_bytes`` (Kafka's
    message limit) ships as several chunks of whole rows, all at the same quiescence
    point, numbered in order; without it (the sidecar's chunks, numbered by its
    client) it ships as ``index``, whatever its size."""

    domain_id: int
    point: tuple[int, int]
    baseline_id: int
    index: int
    lo: Bound | None
    hi: Bound | None
    cells: Sequence[SnapshotCell]
    numbering: ChunkNumbering | None = None
    chunks: list[SnapshotChunk] = field(default_factory=list)
    written: int = 0  # chunks the sink took (a retried call goes on from there)
    shipped: threading.Event = field(default_factory=threading.Event)

    def ship_to(self, sink: Any) -> None:
        write = getattr(sink, "write_snapshot", None)
        if write is None:
            raise TypeError(f"{type(sink).__name__} cannot carry snapshot records (it has no "
                            "write_snapshot); use a sink of this version")
        if not self.chunks:
            self.chunks = self._build(getattr(sink, "snapshot_max_bytes", None))
            self.cells = ()
        for chunk in self.chunks[self.written:]:
            write(chunk)
            self.written += 1
        self.shipped.set()

    def _build(self, max_bytes: int | None) -> list[SnapshotChunk]:
        numbering = self.numbering
        index = self.index if numbering is None else numbering.next
        cells = RowCells.of(self.cells)  # grouped by row: a cut keeps rows whole
        data = cells_batch(cells)
        if numbering is None or max_bytes is None or data.nbytes <= max_bytes \
                or len(cells.widths) < 2:
            if numbering is not None:
                numbering.take(1)
            return [SnapshotChunk.of_data(self.domain_id, self.point[0], self.point[1],
                                          self.baseline_id, index, self.hi is None, self.lo,
                                          self.hi, data)]
        pieces = split_rows(data, cells.widths, max_bytes)
        first = numbering.take(len(pieces))
        out = []
        for i, (start, end) in enumerate(pieces):
            lo = self.lo if i == 0 else _row_bound(data, start)
            hi = self.hi if i == len(pieces) - 1 else _row_bound(data, end)
            out.append(SnapshotChunk.of_data(
                self.domain_id, self.point[0], self.point[1], self.baseline_id, first + i,
                hi is None, lo, hi, data.slice(start, end - start)))
        return out


def _row_bound(data: pa.RecordBatch, at: int) -> Bound:
    """The (table, row) of the cell at ``at``: where a piece starts."""
    return (data.column(0)[at].as_py(), decode_key(data.column(1)[at].as_py()))


def cell_sizes(data: pa.RecordBatch) -> np.ndarray:
    """What each cell costs in a chunk: its four columns' bytes and their offsets."""
    sizes = np.full(data.num_rows, _CELL_OVERHEAD, dtype=np.int64)
    for i in range(4):
        col = data.column(i)
        offsets = np.frombuffer(col.buffers()[1], dtype=np.int32, count=len(col) + 1,
                                offset=col.offset * 4)
        sizes += np.diff(offsets)
    return sizes


def split_rows(data: pa.RecordBatch, widths: Sequence[int], max_bytes: int
               ) -> list[tuple[int, int]]:
    """Cut ``data`` (cells grouped by row, ``widths`` cells per row) into runs of whole
    rows whose Arrow data is at most ``max_bytes`` each, as ``(start, end)`` cell
    positions; a row larger than that is a run of its own."""
    budget = max_bytes - _CHUNK_OVERHEAD
    row_ends = np.cumsum(np.asarray(widths, dtype=np.int64))
    spent = np.concatenate(([0], np.cumsum(cell_sizes(data))))[row_ends]  # bytes to row end
    pieces: list[tuple[int, int]] = []
    row = 0  # the first row of the next piece
    while row < len(row_ends):
        before = int(spent[row - 1]) if row else 0
        last = max(row, int(np.searchsorted(spent, before + budget, side="right")) - 1)
        start = int(row_ends[row - 1]) if row else 0
        pieces.append((start, int(row_ends[last])))
        row = last + 1
    return pieces


def _rows_per_table(cells: Sequence[SnapshotCell]) -> Counter[str]:
    """The rows per table of a chunk's cells (whole rows, in row order: one run each).
    Counted only for the metrics, outside the hold: per-cell work costs the baseline."""
    if type(cells) is RowCells:
        return Counter(cells.tables)
    return Counter(table for (table, _row), _run in groupby(cells, key=itemgetter(0, 1)))


def _lister(store: object) -> Callable[[Bound | None, int], Any]:
    lister = getattr(store, "list_cells", None)
    if lister is None:
        raise TypeError(f"{type(store).__name__} cannot list its cells: a baseline snapshot "
                        "needs a store with list_cells(start, limit) (MemoryStore and "
                        "PostgresStore have one)")
    return lister  # type: ignore[no-any-return]


class _Run:
    """The bookkeeping of one baseline, shared by the threaded and asyncio drivers."""

    def __init__(self, agent: _Capture, chunk_rows: int,
                 progress: Callable[[SnapshotProgress], None] | None) -> None:
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be at least 1, not {chunk_rows}")
        self.agent = agent
        self.chunk_rows = chunk_rows
        self.progress = progress
        self.baseline_id = agent._ids.next()
        self.pending: list[PendingSnapshot] = []
        self.numbering = ChunkNumbering()
        self.start: Bound | None = None
        self.cells = 0
        self.longest_hold = 0.0
        self.started = time.perf_counter()
        self.last_cells: Sequence[SnapshotCell] = ()  # for the metrics, after the hold
        self.tables: set[str] = set()

    def record(self, point: tuple[int, int], chunk: CellChunk, held_since: float) -> bool:
        """Hand one chunk to the shipper (writers still held); True if it was the last."""
        pending = PendingSnapshot(self.agent.domain_id, point, self.baseline_id,
                                  len(self.pending), self.start, chunk.next, chunk.cells,
                                  self.numbering)
        self.agent._shipper.put(pending)  # type: ignore[arg-type]
        self.pending.append(pending)
        hold = time.perf_counter() - held_since
        self.longest_hold = max(self.longest_hold, hold)
        self.cells += len(chunk.cells)
        self.start = chunk.next
        self.last = SnapshotProgress(self.baseline_id, len(self.pending), self.cells,
                                     chunk.next, hold)
        self.last_cells = chunk.cells
        return chunk.next is None

    def notify(self) -> None:
        """Report progress (after writers were let go again): to ``progress`` and to
        the agent's metrics (``cdc_snapshot_rows`` per table, done at the end)."""
        report_rows = getattr(self.agent, "_snapshot_progress", None)
        if report_rows is not None and getattr(self.agent, "metrics", None) is not None:
            for table, rows in _rows_per_table(self.last_cells).items():
                self.tables.add(table)
                report_rows(table, rows)
            if self.last.rows_done_until is None:
                for table in self.tables:
                    report_rows(table, 0, done=True)
        if self.progress is not None:
            self.progress(self.last)

    def report(self) -> BaselineReport:
        return baseline_report(self.agent.domain_id, self.baseline_id, self.pending,
                               self.cells, self.longest_hold, self.started)


def baseline_report(domain_id: int, baseline_id: int, pending: Sequence[PendingSnapshot],
                    cells: int, longest_hold: float, started: float) -> BaselineReport:
    """The report of a baseline whose chunks (``pending``) were all shipped."""
    total = Setsum()
    chunks = [chunk for one in pending for chunk in one.chunks]
    for chunk in chunks:
        total = total + Setsum.from_hexdigest(chunk.setsum)
    return BaselineReport(domain_id, baseline_id, len(chunks), cells, total.hexdigest(),
                          pending[0].point, pending[-1].point, longest_hold,
                          time.perf_counter() - started)


def take_baseline(agent: _Capture, store: object, *, chunk_rows: int = DEFAULT_CHUNK_ROWS,
                  progress: Callable[[SnapshotProgress], None] | None = None,
                  flush_timeout: float | None = None,
                  journal: BaselineJournal | str | None = None) -> BaselineReport:
    """``Agent.snapshot``: see the module docstring.

    With a ``journal`` (``agent._baseline_journal``), in this order:

    Step 1. Read it: ``closed`` (the last agent closed cleanly): record this agent
    as running on from it and return its report, nothing else done.
    Step 2. Record the new baseline as running.
    Step 3. Take the baseline: chunk by chunk, then a quiescence point, then flush
    (every chunk durable in the sink).
    Step 4. Record it as done, with its report (a clean ``close()`` marks it closed).

    A crash anywhere leaves ``running`` or ``done`` (or the older entry): the next call
    takes a new baseline from chunk 0.
    """
    lister = _lister(store)
    journal = _journal(journal)
    with agent._snapshot_lock:  # one baseline at a time per agent
        # Step 1.
        if journal is not None:
            recorded = journal_recorded(agent, journal)
            if recorded is not None:
                return recorded
        run = _Run(agent, chunk_rows, progress)
        # Step 2.
        if journal is not None:
            journal.started(agent.domain_id, run.baseline_id)
        # Step 3.
        done = False
        while not done:
            agent._begin_hold()
            try:
                point = agent._wait_quiescent()
                held_since = time.perf_counter()
                done = run.record(point, lister(run.start, chunk_rows), held_since)
            finally:
                agent._end_hold()
            run.notify()
        with agent.batch():  # a quiescence point after the last chunk: consumers hand
            pass  # out the baseline's changes with the changeset of the next interval
        agent.flush(flush_timeout)
        report = run.report()
        # Step 4.
        if journal is not None:
            journal_finished(agent, journal, report)
        return report


def _journal(journal: BaselineJournal | str | None) -> BaselineJournal | None:
    return BaselineJournal.at(journal) if isinstance(journal, str) else journal


def journal_recorded(agent: _Capture, journal: BaselineJournal) -> BaselineReport | None:
    """Step 1 of a journaled baseline (for every caller: the agents and the sidecar):
    a ``closed`` journal (the last agent closed cleanly) is adopted by ``agent`` and its
    report returned, nothing else done; anything else returns None after logging why
    a new baseline is taken."""
    previous = journal.read()
    if previous is not None and previous["state"] == "closed" and agent._log_incomplete:
        log.warning("cdc.baseline_journal_not_adopted", reason=agent._log_incomplete,
                    consequence="a new baseline is taken")
        return None  # (note_previous would blame a close that was clean)
    if previous is not None and previous["state"] == "closed":
        report = finished_report(previous)
        journal.adopted(previous, agent.domain_id)
        agent._baseline_journal = journal  # its clean close() marks the journal closed
        return report
    note_previous(journal, previous)
    return None


def journal_finished(agent: _Capture, journal: BaselineJournal, report: BaselineReport
                     ) -> None:
    """Step 4 of a journaled baseline: every chunk is durable; ``agent``'s clean
    ``close()`` will mark the journal closed."""
    journal.finished(report, agent.domain_id)
    agent._baseline_journal = journal


async def atake_baseline(agent: _Capture, store: object, *,
                         chunk_rows: int = DEFAULT_CHUNK_ROWS,
                         progress: Callable[[SnapshotProgress], None] | None = None,
                         journal: BaselineJournal | str | None = None) -> BaselineReport:
    """``AsyncAgent.snapshot``: the same steps, waiting without blocking the event loop
    (the journal's object store calls run in a thread)."""
    lister: Callable[[Bound | None, int], Awaitable[CellChunk]] = _lister(store)
    journal = _journal(journal)
    if not agent._snapshot_lock.acquire(blocking=False):
        raise RuntimeError("a baseline snapshot is already running on this agent; wait for "
                           "it to finish")
    try:
        # Step 1.
        if journal is not None:
            recorded = await asyncio.to_thread(journal_recorded, agent, journal)
            if recorded is not None:
                return recorded
        report = await _atake(agent, lister, chunk_rows, progress, journal)
        # Step 4.
        if journal is not None:
            await asyncio.to_thread(journal_finished, agent, journal, report)
        return report
    finally:
        agent._snapshot_lock.release()


async def _atake(agent: _Capture, lister: Callable[[Bound | None, int], Awaitable[CellChunk]],
                 chunk_rows: int, progress: Callable[[SnapshotProgress], None] | None,
                 journal: BaselineJournal | None = None) -> BaselineReport:
    run = _Run(agent, chunk_rows, progress)
    if journal is not None:  # Step 2.
        await asyncio.to_thread(journal.started, agent.domain_id, run.baseline_id)
    done = False
    while not done:
        agent._begin_hold()
        try:
            point = await _await_quiescent(agent)
            held_since = time.perf_counter()
            done = run.record(point, await lister(run.start, chunk_rows), held_since)
        finally:
            agent._end_hold()
        run.notify()
        await asyncio.sleep(0)  # let the writers held back open their batches
    async with agent.batch():  # a quiescence point after the last chunk
        pass
    await asyncio.get_running_loop().run_in_executor(None, agent.flush)
    return run.report()


async def _await_quiescent(agent: _Capture) -> tuple[int, int]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + agent._wait_timeout
    while True:
        with agent._cond:
            if agent._sequencer.quiescent:
                return agent._last_point
            waiter = loop.create_future()
            agent._async_waiters.append((loop, waiter))
        try:
            await asyncio.wait_for(waiter, max(0.0, deadline - loop.time()))
        except TimeoutError:
            raise QuiescenceTimeout(
                f"a snapshot waited {agent._wait_timeout}s for open write batches to end"
            ) from None


def sorted_cells(cells: dict[tuple[str, RowKey, str], Value]) -> list[SnapshotCell]:
    """Cells as (table, row, column, value) in snapshot row order (for tests)."""
    from sinks.codec import row_order

    return sorted(((t, r, c, v) for (t, r, c), v in cells.items()),
                  key=lambda x: (row_order(x[0], x[1]), x[2]))
