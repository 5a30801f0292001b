"""The shipping pipeline: a thread between the writers and the sink.

Writers hand over whole segments of events and the sequencer's epoch records, in log
order, through a bounded queue (a full queue makes writers wait: backpressure, never
loss). The waits are bounded: a new batch that waited ``backpressure_timeout`` for room
is refused (``ShippingBackpressure``, nothing written); a sink that says it is behind
(``SinkBackpressure``) is retried, so a slow sink slows capture but never stops it.

A closing batch is one queue item: its last segment of events and the epochs its
close ended (``EpochClosed``). The shipper encodes a whole shipment's events to Arrow,
hashes its segments at once, tallies each epoch's setsum and per-table counts off the
writers' path (``agent._tally``), and calls the sink in order: an epoch record always
after every event of its epoch. The epoch records of a shipment go out as one run
(``Sink.write_epochs``, one message) when the sink offers it, else one by one; a
shipment's lone record goes out as itself (``Sink.write_epoch``). A sink offering
``Sink.write_shipment`` gets the shipment's events and epoch records in one call.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from itertools import chain
from typing import TYPE_CHECKING, Final

import numpy as np
import pyarrow as pa
import structlog

from agent._native import (
    EventEncoder,
    SegmentDigests,
    Transpose,
    event_encoder,
    segment_digests_helper,
    shipper_helpers,
    table_runs_helper,
)
from agent._tally import EpochTally
from sequencer import EpochClosed, EpochRecord, RowKey
from sinks import EventBatch, Sink, SinkBackpressure, SinkTimeout
from sinks.codec import (
    EVENT_SCHEMA,
    EpochRun,
    encode_keys,
    encode_values,
    segment_digest_array,
)

if TYPE_CHECKING:
    from agent._metrics import CaptureMetrics

__all__ = ["Shipper", "ShippingBackpressure", "ShippingFailed"]

log = structlog.get_logger()

_DRAIN_MAX: Final = 4096  # queue items gathered into one sink call at most
_RETRY_MAX_DELAY: Final = 0.25  # seconds between retries of a sink that is behind

PendingEvent = tuple[str, RowKey, str, object, object]  # (table, row, column, old, new)


class ShippingFailed(RuntimeError):
    """The sink failed; records from the failed one on were not shipped.

    The store keeps every write; the records not shipped stay in the agent's queue
    (``pending``). Fix the sink and start a new Agent: the log's next domain starts
    from the store's current state.
    """


class ShippingBackpressure(TimeoutError):
    """The sink is behind: a new write batch waited longer than ``backpressure_timeout``
    for room in the shipping queue. Nothing was written; retry later. Capture goes on:
    the queue drains as the sink catches up.
    """


# One queue item per closing batch (and per full segment shipped before the close):
# (batch_id, epoch_seq, seq_start, events, closed). A plain tuple: it is made on every
# batch's path. ``seq_start`` is a multiple of 2**16; ``closed`` the epochs it ended.
_BatchItem = tuple[int, int, int, list[PendingEvent], list[EpochClosed]]
# What a shipment hands the sink: its events, then its epoch records (a run or each).
_Record = EventBatch | EpochRun | EpochRecord


@dataclass(slots=True)
class _Flush:
    """A flush request: finished once every item queued before it is durable in the
    sink (or shipping failed: ``callback`` then gets the error)."""

    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    callback: Callable[[BaseException | None], None] | None = None

    def finish(self, error: BaseException | None) -> None:
        if self.done.is_set():
            return  # finished once only (a failing shipper may drain it twice)
        self.done.set()
        if self.callback is not None:
            self.callback(error)


_STOP: Final = object()


class Shipper:
    """Runs the shipping thread. ``put`` is called by writers (under the agent's lock
    for epoch records, so records enter in sequencer order)."""

    def __init__(self, sink: Sink, *, domain_id: int = 0, max_queue: int = 1024,
                 linger: float = 0.002,
                 on_epoch: Callable[[EpochRecord], None] | None = None,
                 backpressure_timeout: float = 30.0,
                 metrics: CaptureMetrics | None = None) -> None:
        self._linger = linger
        self._metrics = metrics
        self.started_at = self.last_quiescent_at = time.monotonic()
        self._backpressure_timeout = backpressure_timeout
        # How long put() may wait for room; an event loop's thread sets 0 (never block
        # the loop: new batches are held back at open instead).
        self.put_wait = backpressure_timeout
        self._stopping = False  # stop() asked: a sink that is behind is not retried
        self.behind_since: float | None = None  # monotonic time the sink began refusing
        self.sink_retries = 0
        self._sink = sink
        # A deque handed over under the GIL, not a queue.Queue: its lock convoys
        # between writers and the shipper cost more than the shipping itself.
        self._items: deque[object] = deque()
        self.items = self._items  # read-only for the agent: its length is the backlog
        self._max_queue = self.max_queue = max_queue
        self._idle = False
        self._wakeup = threading.Event()
        # Someone waits on the next shipment (a flush, a stop, a writer out of room): the
        # shipper does not linger for more items then.
        self._hurry = False
        self._drained = threading.Condition(threading.Lock())
        self._domain_id = domain_id
        self._tally = EpochTally()
        # C when built (agent._native): a shipment's columns and its segments' SHA3s.
        self._transpose, self._digest_slices = shipper_helpers()
        self._segment_digests = segment_digests_helper()
        self._event_columns = event_encoder()
        self._table_runs = table_runs_helper()
        self._write_epochs = getattr(sink, "write_epochs", None)
        self._write_shipment = getattr(sink, "write_shipment", None)
        self._on_epoch = on_epoch
        self.error: BaseException | None = None
        self.shipped_events = 0
        self.shipped_epochs = 0
        self._thread = threading.Thread(target=self._run, name="cdc-shipper", daemon=True)
        self._thread.start()

    # -- writers' side -------------------------------------------------------------------

    def put_batch(self, batch_id: int, epoch_seq: int, seq_start: int,
                  events: list[PendingEvent], closed: list[EpochClosed]) -> None:
        """Hand over a segment of batch ``batch_id``'s events (it may be empty) and the
        epochs its close ended (under the agent's lock if any, so they enter in
        sequencer order); wait while too much is queued."""
        self.put((batch_id, epoch_seq, seq_start, events, closed))

    def put(self, item: _BatchItem) -> None:
        """Hand ``item`` to the shipping thread; wait while too much is queued (a
        baseline's chunks come this way too, as objects with ``ship_to``)."""
        if self.error is not None:
            self._raise_if_failed()
        items = self._items
        items.append(item)
        if self._idle or len(items) > self._max_queue:
            self._after_put()

    def _after_put(self) -> None:
        """After an item was queued: wake the shipper if it is idle, and wait while the
        queue is over its bound (``sequencer._native.UnscopedWriter`` calls it too)."""
        if self._idle:
            # Once per wake-up: the writers that queue more before the shipper runs
            # would each pay for an Event.set() otherwise.
            self._idle = False
            self._wakeup.set()
        if len(self._items) > self._max_queue and self.put_wait > 0:
            # Backpressure: wait for the shipper to catch up, a bounded time. The item is
            # queued already (its writes are in the store); the next batch's open waits
            # for room, and refuses if there is none.
            self._wait_for_room(self.put_wait)

    def has_room(self) -> bool:
        """Whether the queue is within its bound (a new batch may open at once)."""
        return len(self._items) <= self._max_queue

    def wait_for_room(self) -> None:
        """Before a new batch: wait while the queue is over its bound, at most
        ``backpressure_timeout``; then raise ``ShippingBackpressure``."""
        self._raise_if_failed()
        if len(self._items) <= self._max_queue:
            return
        if not self._wait_for_room(self._backpressure_timeout):
            self._raise_if_failed()
            raise self.backpressure_error()

    def backpressure_error(self) -> ShippingBackpressure:
        return ShippingBackpressure(
            f"the sink is behind: {len(self._items)} records wait to be shipped (more than "
            f"max_queue={self._max_queue}) after {self._backpressure_timeout}s; this batch "
            "was not opened and nothing was written: retry later (capture goes on as the "
            "sink catches up)")

    def _wait_for_room(self, timeout: float) -> bool:
        items = self._items
        deadline = time.monotonic() + timeout
        with self._drained:
            while len(items) > self._max_queue and self.error is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._hurry_up()
                self._drained.wait(min(1.0, remaining))
        return True

    def flush(self, timeout: float | None = None) -> None:
        """Return once everything put so far reached the sink and the sink flushed."""
        self._raise_if_failed()
        request = _Flush()
        self._items.append(request)
        self._hurry_up()
        if self.error is not None:  # failed meanwhile: its drain may have missed us
            self._fail_remaining([])
        if not request.done.wait(timeout):
            raise TimeoutError(f"the sink did not flush within {timeout}s")
        self._raise_if_failed()

    def request_flush(self, callback: Callable[[BaseException | None], None]) -> None:
        """Without waiting: call ``callback(None)`` (from the shipping thread) once
        everything put so far is durable in the sink, or ``callback(error)`` if shipping
        failed. Requests that arrive together share one ``sink.flush()``."""
        request = _Flush(callback=callback)
        if self.error is not None:
            request.finish(self.error)
            return
        self._items.append(request)
        self._hurry_up()
        if self.error is not None:  # failed meanwhile: its drain may have missed us
            self._fail_remaining([])

    def stop(self, timeout: float | None = None) -> None:
        self._stopping = True
        if self._thread.is_alive():
            self._items.append(_STOP)
            self._hurry_up()
            self._thread.join(timeout)

    def pending(self) -> int:
        return len(self._items)

    def _hurry_up(self) -> None:
        """Wake the shipper, and cut its linger short: the caller waits on the shipment."""
        self._hurry = True
        self._wakeup.set()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise ShippingFailed(
                f"shipping to the sink failed ({self.error!r}); the store kept every write, "
                f"{self.pending()} queued records were not shipped"
            ) from self.error

    # -- the shipping thread -------------------------------------------------------------

    def _take(self) -> list[object]:
        """Wait for items, then take up to _DRAIN_MAX of them."""
        items = self._items
        if not items:
            while not items:
                self._idle = True
                if not items:  # re-check after announcing idleness: no lost wake-up
                    self._wakeup.wait(1.0)
                    self._wakeup.clear()
                self._idle = False
            # Linger, as a Kafka producer does: let writers queue more before we take
            # the GIL back. Each wake-up costs writers more than a millisecond's wait.
            # Not while someone waits on the shipment (a flush, a stop, a writer out of
            # room): a flush after one write would wait out two lingers (the write's
            # wake-up, then its own).
            if not self._hurry:
                self._wakeup.wait(self._linger)  # such a wake-up ends it early
            self._wakeup.clear()
        # Before the take: a request queued from here on is taken by this take or the
        # next, without a linger (at worst a later wake-up skips one too).
        self._hurry = False
        popleft = items.popleft  # only this thread takes items: len() stays a lower bound
        taken = [popleft() for _ in range(min(len(items), _DRAIN_MAX))]
        with self._drained:
            self._drained.notify_all()
        return taken

    def _run(self) -> None:
        while True:
            items = self._take()
            flushes: list[_Flush] = []
            stop = False
            try:
                # Events first, in one batch: every epoch record in the group then
                # follows all of its own events (later epochs' events may precede it).
                events = self._event_batch([i for i in items if type(i) is tuple and i[3]])
                shipment: list[_Record] = [] if events is None else [events]
                closed: list[EpochClosed] = []
                for item in items:
                    if type(item) is tuple:
                        if item[4]:
                            closed += item[4]
                    elif type(item) is _Flush:
                        flushes.append(item)
                    elif item is _STOP:
                        stop = True
                    elif hasattr(item, "ship_to"):  # a baseline chunk (agent._baseline)
                        # After the epochs before it: it is read at a quiescence point.
                        self._write(shipment + self._epoch_items(closed))
                        shipment, closed = [], []
                        self._call_sink("write_snapshot", partial(item.ship_to, self._sink),
                                        SinkBackpressure)
                self._write(shipment + self._epoch_items(closed))
                self._tally.carry()
                if flushes:  # one sink flush for the group's requests (group commit)
                    self._call_sink("flush", self._sink.flush, SinkTimeout)
                    for request in flushes:
                        request.finish(None)
                if stop:
                    return
            except BaseException as exc:  # the sink failed: keep what is left
                self.error = exc
                log.error("cdc.shipping_failed", error=repr(exc))
                if self._metrics is not None:
                    self._metrics.count_sink_error("fatal")
                self._fail_remaining(items)
                return

    def _fail_remaining(self, items: list[object]) -> None:
        # Finish every flush request still queued so no caller hangs; they see the error.
        for item in items:
            if isinstance(item, _Flush):
                item.finish(self.error)
        while self._items:
            try:
                item = self._items.popleft()
            except IndexError:  # another thread drained it meanwhile
                break
            if isinstance(item, _Flush):
                item.finish(self.error)
        with self._drained:
            self._drained.notify_all()

    def _event_batch(self, segments: list[_BatchItem]) -> EventBatch | None:
        """The segments' events as one batch, tallied (None: no events)."""
        tally = self._tally
        if not segments:
            if tally.carrying:  # epochs of earlier shipments may close in this one
                tally.add(np.zeros(0, np.uint64), b"", np.zeros(0, np.int64),
                          pa.array([], pa.utf8()))
            return None
        data, lengths, batch_ids, epoch_seqs = _to_arrow(self._domain_id, segments,
                                                         self._transpose, self._event_columns)
        if self._segment_digests is not None:  # C: each item (one segment) built and hashed
            digests = _native_digests(self._segment_digests, self._domain_id, batch_ids,
                                      lengths, data)
        else:
            starts, digests = segment_digest_array(data, self._digest_slices)
            if len(starts) != len(segments):  # an agent bug, never a user error
                raise AssertionError(f"{len(segments)} segments shipped, {len(starts)} hashed")
        # C (with the native module): the tables as runs, one per segment usually.
        runs = (self._table_runs([item[3] for item in segments])
                if self._table_runs is not None else None)
        tally.add(epoch_seqs, digests, lengths, data.column(3), runs)
        return EventBatch(data)

    def _epoch_items(self, closed: list[EpochClosed]) -> list[_Record]:
        """The records of the epochs ``closed``, with their tallies: as one run when the
        sink takes runs, else (and for a shipment's lone record, the usual case when
        writes are spread out) as records. Building a run's Arrow columns costs about
        0.25 ms however few records it holds; a record, a few microseconds."""
        if not closed:
            return []
        columns = list(self._transpose(closed, 5))
        digests, offsets, names, counts = self._tally.take(columns[0], columns[3])
        if len(closed) == 1 or self._write_epochs is None:
            return list(epoch_records(self._domain_id, closed, digests, offsets, names,
                                      counts))
        return [EpochRun.from_columns(self._domain_id, columns, digests, offsets, names,
                                      counts)]

    def _write(self, records: list[_Record]) -> None:
        """Hand ``records`` (events first, then epoch records) to the sink: in one call
        when it takes shipments (a wal3 log then stores them in one fragment, up to its
        batch size: one object write and one manifest commit for a flush after a few
        writes, not two), else one call each (a retry repeats one)."""
        sink = self._sink
        if len(records) > 1 and self._write_shipment is not None:
            write_shipment = self._write_shipment
            self._call_sink("write_shipment", lambda: write_shipment(records),
                            SinkBackpressure)
            for record in records:
                self._shipped(record)
            return
        for record in records:
            if isinstance(record, EventBatch):
                self._call_sink("write_events", partial(sink.write_events, record),
                                SinkBackpressure)
            elif isinstance(record, EpochRun):
                assert self._write_epochs is not None  # runs only go to sinks taking them
                self._call_sink("write_epoch", partial(self._write_epochs, record),
                                SinkBackpressure)
            else:
                self._call_sink("write_epoch", partial(sink.write_epoch, record),
                                SinkBackpressure)
            self._shipped(record)

    def _shipped(self, record: _Record) -> None:
        """Count a record the sink took (and show its epochs to ``on_epoch``)."""
        if isinstance(record, EventBatch):
            self.shipped_events += record.data.num_rows
        elif isinstance(record, EpochRun):  # its records are built only if watched
            self.shipped_epochs += len(record)
            if record.data.column("quiescent").true_count:
                self.last_quiescent_at = time.monotonic()
            if self._on_epoch is not None:
                for epoch in record.records():
                    self._on_epoch(epoch)
        else:
            self.shipped_epochs += 1
            if record.quiescent:
                self.last_quiescent_at = time.monotonic()
            if self._on_epoch is not None:
                self._on_epoch(record)

    def _call_sink(self, name: str, call: Callable[[], None],
                   retry: type[BaseException]) -> None:
        """Make one sink call; while it raises ``retry`` (the sink is behind and took
        nothing), wait and make it again: writers slow down, capture does not stop."""
        delay, behind_since = 0.01, 0.0
        metrics = self._metrics
        started = time.perf_counter() if metrics is not None else 0.0
        while True:
            try:
                call()
            except retry as exc:
                if self._stopping:
                    raise  # shutting down: do not wait for the sink forever
                self.sink_retries += 1
                if metrics is not None:
                    metrics.count_sink_error("retried")
                if not behind_since:
                    behind_since = time.monotonic()
                    self.behind_since = behind_since
                    log.warning("cdc.sink_behind", error=repr(exc), queued=len(self._items))
                time.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX_DELAY)
                continue
            if behind_since:
                self.behind_since = None
                log.info("cdc.sink_caught_up", waited=round(time.monotonic() - behind_since, 3))
            if metrics is not None:
                metrics.observe_sink_call(name, time.perf_counter() - started)
            return


def _to_arrow(domain_id: int, segments: list[_BatchItem],
              transpose: Transpose, event_columns: EventEncoder | None = None,
              ) -> tuple[pa.RecordBatch, np.ndarray, np.ndarray, np.ndarray]:
    """Encode the segments' events as one record batch; also return each one's length,
    batch id and epoch seq.

    Transposed with ``transpose`` and ``chain`` (C loops, with the native module): no
    Python step per event; with ``event_columns`` (C) the variable columns are built in
    one pass, straight into Arrow's buffers (the codec encodes whatever it leaves)."""
    batch_ids, epochs, seq_starts, lists, _closed = transpose(segments, 5)
    lengths = np.fromiter(map(len, lists), np.int64, len(lists))
    offsets = np.cumsum(lengths) - lengths
    n = int(lengths.sum())
    encoded = event_columns(lists) if event_columns is not None else None
    if encoded is not None:
        variable = [pa.Array.from_buffers(kind, n, [None, pa.py_buffer(ends),
                                                    pa.py_buffer(data)])
                    for kind, (ends, data) in zip(_VARIABLE_TYPES, encoded, strict=True)]
    else:
        tables, rows, columns, olds, news = transpose(list(chain.from_iterable(lists)), 5)
        variable = [pa.array(tables, pa.utf8()), encode_keys(rows),
                    pa.array(columns, pa.utf8()), encode_values(olds), encode_values(news)]
    seqs = np.arange(n) - np.repeat(offsets - np.array(seq_starts, np.int64), lengths)
    segment_batches = np.array(batch_ids, np.uint64)
    arrays = [
        pa.array(np.full(n, domain_id, dtype=np.uint64)),
        pa.array(np.repeat(segment_batches, lengths)),
        pa.array(seqs.astype(np.uint32)),
        *variable,
    ]
    return (pa.RecordBatch.from_arrays(arrays, schema=EVENT_SCHEMA), lengths, segment_batches,
            np.array(epochs, np.uint64))


# Arrow types of the variable columns: table, row, column, old, new (EVENT_SCHEMA's).
_VARIABLE_TYPES: Final = (pa.utf8(), pa.binary(), pa.utf8(), pa.binary(), pa.binary())


# The columns of a segment's setsum item after the seqs: table, row, column, old, new.
_ITEM_COLUMNS: Final = (3, 4, 5, 6, 7)


def _native_digests(sha3_segments: SegmentDigests, domain_id: int, batch_ids: np.ndarray,
                    lengths: np.ndarray, data: pa.RecordBatch) -> bytes:
    """Each segment's setsum digest (``sinks.codec``'s item layout), by the C helper:
    one segment per queue item, so the segments are known and nothing is searched
    (bounds: the lengths' running sums; one domain for all)."""
    n = data.num_rows
    columns = []
    for k in _ITEM_COLUMNS:
        column = data.column(k)
        buffers = column.buffers()
        columns.append((np.frombuffer(buffers[1], np.int32, n + 1, column.offset * 4),
                        buffers[2] if buffers[2] is not None else b""))
    bounds = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=bounds[1:])
    return sha3_segments(bounds, np.full(len(lengths), domain_id, np.uint64),
                         np.ascontiguousarray(batch_ids, np.uint64),
                         np.ascontiguousarray(data.column(2).to_numpy(), np.uint32),
                         tuple(columns))


def epoch_records(domain_id: int, closed: list[EpochClosed], digests: bytes,
                  offsets: np.ndarray, names: pa.Array, counts: np.ndarray
                  ) -> list[EpochRecord]:
    """The records of ``closed`` with their tallies (``EpochTally.take``'s digests and
    per-table counts): the records ``EpochRun.from_columns(...).records()`` gives,
    without the run."""
    tables, numbers, bounds = names.to_pylist(), counts.tolist(), offsets.tolist()
    return [EpochRecord(domain_id, epoch.epoch_seq, epoch.begin_id, epoch.end_id,
                        epoch.event_count, epoch.quiescent,
                        tuple(zip(tables[lo:hi], numbers[lo:hi], strict=True)),
                        digests[32 * k:32 * k + 32].hex())
            for k, (epoch, lo, hi) in enumerate(zip(closed, bounds, bounds[1:], strict=False))]
