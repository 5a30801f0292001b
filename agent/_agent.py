"""The Agent: wraps a relaxed store, scopes write batches, and captures every write.

Writes inside ``with agent.batch():`` share one write batch; the batch in force is
held in a ``ContextVar``, so each thread and each asyncio task sees its own, and a
nested ``batch()`` joins the outer one. A write outside any batch gets a short batch of
its own. There is deliberately no getter for "the current batch id": an operation that
needs one opens or joins a batch first.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures.thread  # noqa: F401 - its exit hook must be registered first
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Final, TypeVar

import structlog

from agent import _operations as operations
from agent._clock import system_ids
from agent._native import cell_writer, event_list, new_sequencer, unscoped_writer
from agent._scope import BatchScope
from agent._shipper import PendingEvent, Shipper, ShippingFailed
from agent._store import RelaxedStore
from sequencer import (
    Absent,
    BatchTicket,
    EpochClosed,
    EpochRecord,
    MonotonicIds,
    RowKey,
    Value,
    check_write,
    new_domain_id,
)
from sinks import Sink

if TYPE_CHECKING:
    from agent._baseline import BaselineReport, SnapshotProgress
    from agent._baseline_journal import BaselineJournal
    from agent._metrics import CaptureMetrics

__all__ = ["Agent", "AgentClosed", "QuiescenceTimeout"]

T = TypeVar("T")

log = structlog.get_logger()

_HOLD_GRACE: Final = 0.002  # seconds a baseline lets writers in between two chunks
SEGMENT_EVENTS: Final = 1 << 16  # events per shipped segment (sinks.codec.SEGMENT_BITS)
# A batch's list of events (untracked by the collector with the C module).
_new_events: Final = event_list()


class QuiescenceTimeout(TimeoutError):
    """Forced quiescence held a new batch back longer than the agent's wait timeout."""


class AgentClosed(RuntimeError):
    """A write was attempted after ``Agent.close()``."""


# Agents not yet closed. At interpreter exit each is closed (bounded wait), so a program
# that forgets close() still ships the tail of its log instead of dropping it.
_open_agents: weakref.WeakSet[_Capture] = weakref.WeakSet()
_EXIT_CLOSE_TIMEOUT: Final = 10.0


def _close_open_agents() -> None:
    for agent in list(_open_agents):
        try:
            agent.close(timeout=_EXIT_CLOSE_TIMEOUT)
        except Exception as exc:  # at exit nothing is left to raise to: say what was lost
            log.warning("cdc.agent_not_closed_at_exit", domain_id=f"{agent.domain_id:016x}",
                        error=repr(exc))


# Sinks finish on thread pools, and concurrent.futures refuses new work once its own
# exit hook ran. threading's exit hooks run before atexit's, last registered first, so
# registering there after concurrent.futures' hook closes the agents while pools work.
_register_exit = getattr(threading, "_register_atexit", atexit.register)
_register_exit(_close_open_agents)


# The sequencer's clock when no forced quiescence needs one: ``int()`` is 0, and a C
# call (a Python function here would cost a frame twice per batch).
_no_clock: Callable[[], int] = int


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class _Batch:
    __slots__ = ("depth", "events", "seq_start", "ticket")

    def __init__(self, ticket: BatchTicket) -> None:
        self.ticket = ticket
        self.events: list[PendingEvent] = _new_events()
        self.seq_start = 0
        self.depth = 1


class _Capture:
    """The machinery shared by ``Agent`` and ``AsyncAgent``: sequencer, scoping, shipping."""

    def __init__(
        self,
        sink: Sink,
        *,
        on_quiescence: Callable[[EpochRecord], None] | None = None,
        domain_id: int | None = None,
        ids: MonotonicIds | None = None,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        max_quiescence_interval: float | None = None,
        quiescence_wait_timeout: float = 60.0,
        max_queue: int = 1024,
        backpressure_timeout: float = 30.0,
        metrics: CaptureMetrics | None = None,
    ) -> None:
        self.domain_id = domain_id if domain_id is not None else new_domain_id()
        self._sink = sink
        self._on_quiescence = on_quiescence
        # The sequencer reads time only for forced quiescence: without it, feed 0
        # rather than read a clock twice per batch.
        self._clock_ns = clock_ns if max_quiescence_interval is not None else _no_clock
        self._ids = ids or system_ids()
        self._next_id = self._ids.next
        self._wait_timeout = quiescence_wait_timeout
        self._cond = threading.Condition(threading.Lock())
        self._sleepers = 0  # threads waiting on _cond (a close notifies only if any)
        self._sequencer = new_sequencer(
            self.domain_id, now_ns=clock_ns(),
            max_quiescence_interval_ns=(
                None if max_quiescence_interval is None
                else int(max_quiescence_interval * 1e9)),
        )
        self._current: ContextVar[_Batch | None] = ContextVar(
            f"cdc_batch_{self.domain_id:x}", default=None)
        self._shipper = Shipper(sink, domain_id=self.domain_id, max_queue=max_queue,
                                backpressure_timeout=backpressure_timeout, metrics=metrics)
        self._max_queue = max_queue
        self._batches_closed = 0
        self._backpressure_timeout = backpressure_timeout
        self._closing = False  # set by close(): no new batch, the sequencer drains
        self._closed = False
        self._async_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        # Set by a journaled snapshot(): a clean close() marks the journal closed.
        self._baseline_journal: BaselineJournal | None = None
        # Why the log may lack a write the store holds (a sidecar client that died
        # between its store write and its report): sticky, so no journal says closed.
        self._log_incomplete: str | None = None
        # Baseline snapshots (agent._baseline): while _hold > 0 no new batch opens, and
        # _last_point is the last quiescence point, (epoch_seq, end_id): (0, 0) at start.
        self._hold = 0
        self._waiting = 0  # writers waiting in _open for a ticket
        self._released: tuple[float, int] | None = None  # when a hold ended, batches then
        self._last_point = (0, 0)
        # _open's common case in one C call (sequencer._native.UnscopedWriter.open_ticket:
        # None where the general path below must run), set by an Agent with the C
        # sequencer, which also replaces _finish with the writer's close_batch.
        self._open_ticket: Callable[[], BatchTicket | None] | None = None
        self._snapshot_lock = threading.Lock()
        self.stats = {"batches": 0, "events": 0, "epochs": 0, "quiescence_points": 0}
        self.metrics = metrics
        if metrics is not None:
            metrics.attach(self)
        _open_agents.add(self)
        log.info("cdc.agent_started", domain_id=f"{self.domain_id:016x}")

    # -- public --------------------------------------------------------------------------

    def batch(self) -> BatchScope:
        """A write batch for the block: ``with agent.batch(): ...`` (joins an outer one)."""
        return BatchScope(self)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every record of every closed batch is durable in the sink.

        After ``close()`` it returns at once (close flushed them), or raises what made
        shipping fail."""
        if self._closed and not self._shipper.alive:  # nobody would answer the request
            self._check_shipping()
            return
        self._shipper.flush(timeout)

    def close(self, timeout: float | None = None) -> None:
        """Wait for open batches to end (the sequencer quiesces), flush, close the sink.

        Calling it again does nothing.
        """
        if self._closed:
            return
        if self._current.get() is not None:
            raise RuntimeError("close() inside a write batch would wait for itself; "
                               "call it after the batch's block")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._closing = True
            self._cond.notify_all()  # writers waiting on forced quiescence: give up
            self._wake_async_waiters()
            while not self._sequencer.quiescent:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise QuiescenceTimeout(
                        f"{self._sequencer.open_batches()} write batches still open after "
                        f"{timeout}s; close() needs them to end")
                self._sleep(remaining)
            self._closed = True
        _open_agents.discard(self)
        try:
            self._shipper.flush(None if deadline is None else max(0.0, deadline - time.monotonic()))
        finally:
            self._shipper.stop()
            self._sink.close()
        journal = self._baseline_journal
        if journal is not None and self._log_incomplete is None:
            journal.closed(self.domain_id)  # every write is in the log: none next start
        elif journal is not None:
            log.warning("cdc.baseline_journal_left_open", reason=self._log_incomplete,
                        consequence="the next start takes a new baseline")
        log.info("cdc.agent_closed", domain_id=f"{self.domain_id:016x}", **self.stats)

    def _log_may_lack_writes(self, reason: str) -> None:
        """The store may hold a write the log lacks (``reason``): from now on no journal
        is adopted as closed or marked closed, so the next start takes a new baseline."""
        if self._log_incomplete is None:
            self._log_incomplete = reason
            if self._baseline_journal is not None:
                log.warning("cdc.baseline_journal_left_open", reason=reason,
                            consequence="the next start takes a new baseline")

    def __enter__(self) -> _Capture:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def shipping_error(self) -> BaseException | None:
        return self._shipper.error

    def _metric_counts(self) -> dict[str, float]:
        """What ``CaptureMetrics`` reports for this agent, read at scrape time."""
        shipper = self._shipper
        depth = shipper.pending()
        return {"batches": self._batches_closed, "events": shipper.shipped_events,
                "epochs": shipper.shipped_epochs, "queue_depth": depth,
                "backlogged": float(depth > self._max_queue),
                "quiescence_age": time.monotonic() - shipper.last_quiescent_at}

    def _snapshot_progress(self, table: str, rows: int, *, expected: int | None = None,
                           done: bool = False) -> None:
        """For an initial snapshot: report progress to the metrics (if any)."""
        if self.metrics is not None:
            self.metrics.snapshot_progress(table, rows, expected=expected, done=done)

    # -- batches ---------------------------------------------------------------------------

    def _open(self) -> _Batch:
        if self._open_ticket is not None:  # C (an Agent with the C sequencer)
            ticket = self._open_ticket()
            if ticket is not None:
                return _Batch(ticket)
        shipper = self._shipper
        if shipper.error is not None or len(shipper.items) > shipper.max_queue:
            self._check_shipping()
            shipper.wait_for_room()  # a slow sink slows new batches (bounded)
        with self._cond:
            if self._closing:
                self._check_open()
            ticket = (None if self._hold
                      else self._sequencer.open_batch(self._next_id(), self._clock_ns()))
            if ticket is None:
                ticket = self._wait_for_ticket()
            self.stats["batches"] += 1
        return _Batch(ticket)

    def _wait_for_ticket(self) -> BatchTicket:
        """Under the lock: wait while forced quiescence (or a baseline) holds new
        batches back, at most the wait timeout."""
        deadline = time.monotonic() + self._wait_timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise QuiescenceTimeout(
                    f"forced quiescence held a new write batch back for "
                    f"{self._wait_timeout}s: {self._sequencer.open_batches()} batches "
                    "are still open (a batch left open too long?)")
            self._waiting += 1
            try:
                self._sleep(remaining)
            finally:
                self._waiting -= 1
            self._check_open()
            ticket = (None if self._hold
                      else self._sequencer.open_batch(self._next_id(), self._clock_ns()))
            if ticket is not None:
                return ticket

    def _sleep(self, timeout: float | None) -> None:
        """Under the lock: wait on it, counted (closes notify only when someone waits)."""
        self._sleepers += 1
        try:
            self._cond.wait(timeout)
        finally:
            self._sleepers -= 1

    def _check_open(self) -> None:
        """Under the lock: no new batch once close() has begun (it waits for quiescence)."""
        if self._closing:
            raise AgentClosed("this Agent is closed (or closing); create a new one to "
                              "capture more writes")

    async def _aopen(self) -> _Batch:
        """``_open`` for asyncio: waits for forced quiescence without blocking the loop."""
        self._check_shipping()
        loop = asyncio.get_running_loop()
        if not self._shipper.has_room():  # a slow sink slows new batches (bounded)
            room_deadline = loop.time() + self._backpressure_timeout
            while not self._shipper.has_room():
                self._check_shipping()
                if loop.time() >= room_deadline:
                    raise self._shipper.backpressure_error()
                await asyncio.sleep(0.005)
        deadline = loop.time() + self._wait_timeout
        while True:
            with self._cond:
                self._check_open()
                ticket = (None if self._hold
                          else self._sequencer.open_batch(self._next_id(), self._clock_ns()))
                if ticket is not None:
                    self.stats["batches"] += 1
                    return _Batch(ticket)
                waiter = loop.create_future()
                self._async_waiters.append((loop, waiter))
            remaining = deadline - loop.time()
            try:
                await asyncio.wait_for(waiter, max(0.0, remaining))
            except TimeoutError:
                raise QuiescenceTimeout(
                    f"forced quiescence held a new write batch back for {self._wait_timeout}s"
                ) from None

    def _check_shipping(self) -> None:
        error = self._shipper.error
        if error is not None:
            raise ShippingFailed(
                f"shipping to the sink failed ({error!r}); the store kept every write, "
                "but the log misses the records from that point on") from error

    def _close(self, batch: _Batch) -> None:
        self._finish(batch.ticket, batch.seq_start, batch.events)

    def _finish(self, ticket: BatchTicket, seq_start: int, events: list[PendingEvent]) -> None:
        """Close the batch of ``ticket`` whose last segment is ``events``."""
        total = seq_start + len(events)
        cond = self._cond
        cond.acquire()  # the lock's own C method: ``with`` on a Condition costs a frame
        try:
            closed = self._sequencer.close_batch(ticket, self._clock_ns(), self._next_id(),
                                                 total)
            # One queue item: the last segment and the epochs it ended, in log order.
            self._shipper.put((ticket.batch_id, ticket.epoch_seq, seq_start, events, closed))
            stats = self.stats
            stats["events"] += total
            self._batches_closed += 1
            if closed:
                stats["epochs"] += len(closed)
                if closed[-1].quiescent:
                    self._quiesced(closed[-1])
        finally:
            cond.release()

    def _quiesced(self, marker: EpochClosed) -> None:
        """Under the lock: the sequencer just quiesced at ``marker``."""
        self._last_point = (marker.epoch_seq, marker.end_id)
        self.stats["quiescence_points"] += 1
        try:
            if self._on_quiescence is not None:
                # New batches wait on this lock: the store is at the quiescent state.
                self._on_quiescence(marker.record(self.domain_id))
        finally:
            if self._sleepers:
                self._cond.notify_all()
            if self._async_waiters:
                self._wake_async_waiters()

    def _begin_hold(self) -> None:
        """Hold new batches back (a baseline chunk is about to be read)."""
        if self._current.get() is not None:
            raise RuntimeError("snapshot() inside a write batch would wait for itself; "
                               "call it outside any batch")
        with self._cond:
            self._check_open()
            # Fairness: writers held back by the previous chunk open their batches
            # before the next chunk holds them again (those still waiting, and for a
            # moment those not yet back at the lock).
            released = self._released
            deadline = time.monotonic() + 1.0
            while not self._hold and (now := time.monotonic()) < deadline:
                if self._waiting:
                    self._sleep(0.01)
                elif (released is not None and self.stats["batches"] == released[1]
                      and now < released[0] + _HOLD_GRACE):
                    self._sleep(_HOLD_GRACE / 4)
                else:
                    break
            self._hold += 1

    def _end_hold(self) -> None:
        with self._cond:
            self._released = (time.monotonic(), self.stats["batches"])
            self._hold -= 1
            self._cond.notify_all()
            self._wake_async_waiters()

    def _wait_quiescent(self) -> tuple[int, int]:
        """With new batches held back, wait for the open ones to end; return the
        quiescence point reached, (epoch_seq, end_id)."""
        deadline = time.monotonic() + self._wait_timeout
        with self._cond:
            while not self._sequencer.quiescent:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closing:
                    raise QuiescenceTimeout(
                        f"a snapshot waited {self._wait_timeout}s for "
                        f"{self._sequencer.open_batches()} open write batches to end")
                self._sleep(remaining)
            return self._last_point

    def _wake_async_waiters(self) -> None:
        waiters, self._async_waiters = self._async_waiters, []
        for loop, waiter in waiters:
            loop.call_soon_threadsafe(_resolve, waiter)

    def _ship_segment(self, batch: _Batch) -> None:
        if batch.events:
            ticket = batch.ticket
            self._shipper.put_batch(ticket.batch_id, ticket.epoch_seq, batch.seq_start,
                                    batch.events, [])
            batch.seq_start += len(batch.events)
            batch.events = _new_events()

    def _record(self, batch: _Batch, event: PendingEvent) -> None:
        events = batch.events
        events.append(event)
        if len(events) == SEGMENT_EVENTS:
            self._ship_segment(batch)


class Agent(_Capture):
    """Captures every write to a relaxed store as change events in write batches.

    ``Agent(store, sink, on_quiescence=callback)``: ``callback(marker)`` runs each time
    the sequencer quiesces, while new batches are held back, so it can look at the store
    at exactly that point (it must not write through the agent).
    """

    def __init__(self, store: RelaxedStore, sink: Sink, **options: object) -> None:
        super().__init__(sink, **options)  # type: ignore[arg-type]
        self.store = store
        # With the C sequencer, an unscoped write is one C call around the store's
        # exchange (sequencer._native.UnscopedWriter: the method below, step for step).
        writer = unscoped_writer(
            agent=self, sequencer=self._sequencer, shipper=self._shipper,
            items=self._shipper.items, lock=self._cond, next_id=self._next_id,
            clock=self._clock_ns, fallback=self._set_general, max_queue=self._max_queue)
        if writer is not None:
            self._set_unscoped = writer  # type: ignore[method-assign]
            # A scoped batch's open and close too: _open's common case and _finish,
            # step for step (tests/agent/test_cell_native.py holds the logs equal),
            # unless a subclass defines its own close steps.
            if (type(self)._finish is _Capture._finish
                    and type(self)._quiesced is _Capture._quiesced):
                self._open_ticket = writer.open_ticket
                self._finish = writer.close_batch  # type: ignore[method-assign]
        # And every ``set`` is one C call (sequencer._native.CellWriter: ``set`` below,
        # step for step; keyword calls and a subclass's own ``set`` keep Python's).
        if type(self).set is _PYTHON_SET:
            fast_set = cell_writer(sequencer=self._sequencer, agent=self,
                                   current=self._current, reference=_PYTHON_SET.__get__(self),
                                   segment_events=SEGMENT_EVENTS)
            if fast_set is not None:
                self.set = fast_set  # type: ignore[method-assign]

    # -- writes: each operation is defined once in agent._operations -------------------

    def set(self, table: str, row: RowKey, column: str, value: Value) -> Value | Absent:
        """Write one cell; return the value it replaced (ABSENT if it did not exist)."""
        # The hot path: ``operations.set_cell``'s steps inlined, because driving its
        # generator would double the cost of a write. tests/agent/test_operations.py
        # holds the two to the same events and results.
        check_write(table, row, column, value)
        batch = self._current.get()
        if batch is None:  # an automatic short batch for this one write
            return self._set_unscoped(table, row, column, value)
        old = self.store.exchange(table, row, column, value)
        events = batch.events
        events.append((table, row, column, old, value))
        if len(events) >= SEGMENT_EVENTS:
            self._ship_segment(batch)
        return old

    def _set_unscoped(self, table: str, row: RowKey, column: str,
                      value: Value) -> Value | Absent:
        """``set`` outside any batch: its automatic batch opened and closed directly,
        without a scope or the ContextVar (nothing can join a one-write batch)."""
        shipper = self._shipper
        cond = self._cond
        cond.acquire()
        if (self._closing or self._hold or shipper.error is not None
                or len(shipper.items) > shipper.max_queue):
            cond.release()  # the rare cases: the general path waits, refuses or raises
            return self._set_general(table, row, column, value)
        try:
            ticket = self._sequencer.open_batch(self._next_id(), self._clock_ns())
            if ticket is None:
                ticket = self._wait_for_ticket()
            self.stats["batches"] += 1
        finally:
            cond.release()
        try:
            old = self.store.exchange(table, row, column, value)
        except BaseException:
            self._finish(ticket, 0, [])  # no event, as when a scoped write raises
            raise
        # ``_finish``, inlined: this is the write path of every unscoped write.
        cond.acquire()
        try:
            closed = self._sequencer.close_batch(ticket, self._clock_ns(), self._next_id(), 1)
            shipper.put((ticket.batch_id, ticket.epoch_seq, 0,
                         [(table, row, column, old, value)], closed))
            stats = self.stats
            stats["events"] += 1
            self._batches_closed += 1
            if closed:
                stats["epochs"] += len(closed)
                if closed[-1].quiescent:
                    self._quiesced(closed[-1])
        finally:
            cond.release()
        return old

    def _set_general(self, table: str, row: RowKey, column: str,
                     value: Value) -> Value | Absent:
        """An unscoped ``set`` the fast path cannot take (closing, held back, a failed
        or backed-up shipper): through a scoped batch, which waits, refuses or raises."""
        with self.batch():
            return self.set(table, row, column, value)

    def delete(self, table: str, row: RowKey, column: str) -> Value | Absent:
        """Remove one cell; return the value it held (ABSENT if none: no event)."""
        return self._apply(operations.delete_cell(table, row, column))

    def clear_row(self, table: str, row: RowKey) -> dict[str, Value]:
        """Remove every cell of a row, in one batch; return the values removed."""
        return self._apply(operations.clear_row(table, row))

    def update(self, table: str, rows: Iterable[RowKey],
               values: Mapping[str, Value]) -> None:
        """Set ``values`` on every row of ``rows``, in one batch (an SQL UPDATE)."""
        self._apply(operations.update(table, rows, values))

    def conditional_set(
        self, table: str,
        changes: Mapping[RowKey, Mapping[str, tuple[Value | Absent, Value | Absent]]],
    ) -> dict[RowKey, bool]:
        """Per row, swap each cell from ``expected`` to ``new``; return per-row success.

        Each cell's swap is atomic; a row stops at its first cell that does not hold the
        expected value, and earlier cells of that row stay written (the store fails
        partially, at row granularity at best). Only swaps that happened become events.
        """
        return self._apply(operations.conditional_set(table, changes))

    def _apply(self, op: operations.Operation[T]) -> T:
        """Drive one operation in the batch in force, or in an automatic batch of its own
        (opened only once the operation's checks passed)."""
        try:
            step = next(op)  # the checks: no batch opened, the store not touched yet
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        batch = self._current.get()
        if batch is None:  # an automatic short batch for this one operation
            with self.batch():
                batch = self._current.get()
                assert batch is not None
                return operations.run(self.store, op, step,
                                      lambda event: self._record(batch, event))
        return operations.run(self.store, op, step, lambda event: self._record(batch, event))

    def get(self, table: str, row: RowKey, column: str) -> Value | Absent:
        """Read one cell (no batch, no event)."""
        return self.store.get(table, row, column)

    def snapshot(self, *, chunk_rows: int = 10_000,
                 progress: Callable[[SnapshotProgress], None] | None = None,
                 flush_timeout: float | None = None,
                 journal: BaselineJournal | str | None = None) -> BaselineReport:
        """Record every cell the store holds as a baseline (snapshot records in the log).

        The store is read ``chunk_rows`` rows at a time, each chunk at a quiescence point
        with new write batches held back meanwhile (writers wait for one chunk at most).
        Returns once every chunk is durable in the sink; ``progress`` is called after
        each chunk. The store must offer ``list_cells`` (see ``agent._baseline``).
        With a ``journal`` (a ``BaselineJournal`` or an object store URI), a baseline
        already finished is not taken again and a cut one is taken anew from chunk 0
        (``agent._baseline_journal``): call it at every start.
        """
        from agent._baseline import take_baseline

        metrics = self.metrics
        if metrics is not None:  # count each chunk for the snapshot metrics, then report
            reported = 0
            caller = progress

            def counted(step: SnapshotProgress) -> None:
                nonlocal reported
                metrics.baseline_chunk(step.cells - reported,
                                       finished=step.rows_done_until is None)
                reported = step.cells
                if caller is not None:
                    caller(step)

            progress = counted
        return take_baseline(self, self.store, chunk_rows=chunk_rows, progress=progress,
                             flush_timeout=flush_timeout, journal=journal)


# Agent.set as defined above: a subclass's own set, or Agent.set replaced afterwards (a
# test's spy), is not it, and keeps every call in Python.
_PYTHON_SET: Final = Agent.set
