"""The shipping pipeline: a thread between the writers and the sink.

Writers hand over whole segments of events and the sequencer's epoch records, in log
order, through a bounded queue (a full queue makes writers wait: backpressure, never
loss). The shipper encodes events to Arrow, computes each epoch's setsum and per-table
counts off the writers' path, and calls the sink in order: an epoch record always
after every event of its epoch.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import numpy as np
import pyarrow as pa
import structlog

from sequencer import EpochRecord, RowKey
from sinks import EventBatch, Setsum, Sink
from sinks.codec import EVENT_SCHEMA, encode_key, encode_value, segment_digests

__all__ = ["ShippingFailed", "Shipper", "Shipment"]

log = structlog.get_logger()

_DRAIN_MAX: Final = 4096  # queue items gathered into one sink call at most

PendingEvent = tuple[str, RowKey, str, object, object]  # (table, row, column, old, new)


class ShippingFailed(RuntimeError):
    """The sink failed; records from the failed one on were not shipped.

    The store keeps every write; the records not shipped stay in the agent's queue
    (``pending``). Fix the sink and start a new Agent: the log's next domain starts
    from the store's current state.
    """


@dataclass(frozen=True, slots=True)
class Shipment:
    """One segment of a write batch's events (``seq_start`` is a multiple of 2**16)."""

    domain_id: int
    batch_id: int
    epoch_seq: int
    seq_start: int
    events: list[PendingEvent]


@dataclass(slots=True)
class _Flush:
    done: threading.Event = dataclasses.field(default_factory=threading.Event)


_STOP: Final = object()


class Shipper:
    """Runs the shipping thread. ``put`` is called by writers (under the agent's lock
    for epoch records, so records enter in sequencer order)."""

    def __init__(self, sink: Sink, *, max_queue: int = 1024,
                 on_epoch: Callable[[EpochRecord], None] | None = None) -> None:
        self._sink = sink
        self._queue: queue.Queue[object] = queue.Queue(max_queue)
        self._digests: dict[int, list[bytes]] = {}
        self._table_counts: dict[int, dict[str, int]] = {}
        self._event_counts: dict[int, int] = {}
        self._on_epoch = on_epoch
        self.error: BaseException | None = None
        self.shipped_events = 0
        self.shipped_epochs = 0
        self._thread = threading.Thread(target=self._run, name="cdc-shipper", daemon=True)
        self._thread.start()

    # -- writers' side -------------------------------------------------------------------

    def put(self, item: Shipment | EpochRecord) -> None:
        self._raise_if_failed()
        self._queue.put(item)

    def flush(self, timeout: float | None = None) -> None:
        """Return once everything put so far reached the sink and the sink flushed."""
        self._raise_if_failed()
        request = _Flush()
        self._queue.put(request)
        if not request.done.wait(timeout):
            raise TimeoutError(f"the sink did not flush within {timeout}s")
        self._raise_if_failed()

    def stop(self, timeout: float | None = None) -> None:
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout)

    def pending(self) -> int:
        return self._queue.qsize()

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise ShippingFailed(
                f"shipping to the sink failed ({self.error!r}); the store kept every write, "
                f"{self.pending()} queued records were not shipped"
            ) from self.error

    # -- the shipping thread -------------------------------------------------------------

    def _run(self) -> None:
        q = self._queue
        while True:
            items = [q.get()]
            try:
                while len(items) < _DRAIN_MAX:
                    items.append(q.get_nowait())
            except queue.Empty:
                pass
            shipments: list[Shipment] = []
            for position, item in enumerate(items):
                try:
                    if isinstance(item, Shipment):
                        shipments.append(item)
                        continue
                    self._ship_events(shipments)
                    shipments = []
                    if isinstance(item, EpochRecord):
                        self._ship_epoch(item)
                    elif isinstance(item, _Flush):
                        self._sink.flush()
                        item.done.set()
                    elif item is _STOP:
                        return
                except BaseException as exc:  # the sink failed: keep what is left
                    self.error = exc
                    log.error("cdc.shipping_failed", error=repr(exc))
                    self._fail_remaining(items[position:])
                    return
            try:
                self._ship_events(shipments)
            except BaseException as exc:
                self.error = exc
                log.error("cdc.shipping_failed", error=repr(exc))
                self._fail_remaining(shipments)
                return

    def _fail_remaining(self, items: list[object]) -> None:
        # Wake every flush waiter still queued so no caller hangs; they see the error.
        for item in items:
            if isinstance(item, _Flush):
                item.done.set()
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Flush):
                item.done.set()

    def _ship_events(self, shipments: list[Shipment]) -> None:
        if not shipments:
            return
        data, epochs = _to_arrow(shipments)
        for (_domain, _batch, digest), epoch in zip(
            segment_digests(data), _segment_epochs(shipments), strict=True
        ):
            self._digests.setdefault(epoch, []).append(digest)
        counts = pa.table({"epoch": epochs, "table": data.column(3)}).group_by(
            ["epoch", "table"]).aggregate([([], "count_all")])
        for epoch, table, n in zip(counts.column(0).to_pylist(), counts.column(1).to_pylist(),
                                   counts.column(2).to_pylist(), strict=True):
            per_table = self._table_counts.setdefault(epoch, {})
            per_table[table] = per_table.get(table, 0) + n
            self._event_counts[epoch] = self._event_counts.get(epoch, 0) + n
        self._sink.write_events(EventBatch(data))
        self.shipped_events += data.num_rows

    def _ship_epoch(self, record: EpochRecord) -> None:
        seq = record.epoch_seq
        shipped = self._event_counts.pop(seq, 0)
        if shipped != record.event_count:  # an agent bug, never a user error
            raise AssertionError(
                f"epoch {seq}: sequencer counted {record.event_count} events, "
                f"shipper saw {shipped}"
            )
        digests = self._digests.pop(seq, [])
        table_counts = self._table_counts.pop(seq, {})
        record = dataclasses.replace(
            record,
            setsum=Setsum().insert_digests(b"".join(digests)).hexdigest(),
            table_counts=tuple(sorted(table_counts.items())),
        )
        self._sink.write_epoch(record)
        self.shipped_epochs += 1
        if self._on_epoch is not None:
            self._on_epoch(record)


def _segment_epochs(shipments: list[Shipment]) -> list[int]:
    # segment_digests yields one digest per shipment, in order: each shipment is
    # exactly one segment, and consecutive shipments never share (batch, segment).
    return [s.epoch_seq for s in shipments if s.events]


def _to_arrow(shipments: list[Shipment]) -> tuple[pa.RecordBatch, np.ndarray]:
    domains: list[int] = []
    batches: list[int] = []
    seqs: list[int] = []
    tables: list[str] = []
    rows: list[bytes] = []
    columns: list[str] = []
    olds: list[bytes] = []
    news: list[bytes] = []
    epochs: list[int] = []
    for s in shipments:
        n = len(s.events)
        if not n:
            continue
        domains += [s.domain_id] * n
        batches += [s.batch_id] * n
        seqs.extend(range(s.seq_start, s.seq_start + n))
        epochs += [s.epoch_seq] * n
        for table, row, column, old, new in s.events:
            tables.append(table)
            rows.append(encode_key(row))
            columns.append(column)
            olds.append(encode_value(old))  # type: ignore[arg-type]
            news.append(encode_value(new))
    arrays = [pa.array(col, type=field.type) for col, field in zip(
        (domains, batches, seqs, tables, rows, columns, olds, news), EVENT_SCHEMA, strict=True)]
    return (pa.RecordBatch.from_arrays(arrays, schema=EVENT_SCHEMA),
            np.array(epochs, dtype=np.uint64))
