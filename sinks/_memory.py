"""An in-memory sink, for tests and for users testing their own code."""

from __future__ import annotations

import threading

from sequencer import ChangeEvent, EpochRecord, Record
from sinks._protocol import SinkClosed
from sinks.codec import (
    EventBatch,
    SnapshotChunk,
    decode,
    encode_epoch,
    encode_events,
    encode_snapshot,
    records,
)

__all__ = ["MemorySink", "RecordingSink"]


class MemorySink:
    """Keeps every record in emission order in ``.records`` (events one by one).

    With ``keep_messages=True`` it also keeps the encoded messages in ``.messages``,
    exactly as a byte-oriented sink would store them.
    """

    def __init__(self, *, keep_messages: bool = False) -> None:
        self.records: list[Record | SnapshotChunk] = []
        self.messages: list[bytes] = []
        self.flushes = 0
        self.closed = False
        self._keep_messages = keep_messages
        self._lock = threading.Lock()

    def write_events(self, batch: EventBatch) -> None:
        self._check_open()
        events = batch.to_events()
        with self._lock:
            self.records.extend(events)
            if self._keep_messages:
                self.messages.append(encode_events(batch))

    def write_epoch(self, record: EpochRecord) -> None:
        self._check_open()
        with self._lock:
            self.records.append(record)
            if self._keep_messages:
                self.messages.append(encode_epoch(record))

    def write_snapshot(self, chunk: SnapshotChunk) -> None:
        self._check_open()
        with self._lock:
            self.records.append(chunk)
            if self._keep_messages:
                self.messages.append(encode_snapshot(chunk))

    def flush(self) -> None:
        self.flushes += 1

    def close(self) -> None:
        self.closed = True

    @property
    def events(self) -> list[ChangeEvent]:
        return [r for r in self.records if isinstance(r, ChangeEvent)]

    @property
    def epochs(self) -> list[EpochRecord]:
        return [r for r in self.records if isinstance(r, EpochRecord)]

    @property
    def snapshot_chunks(self) -> list[SnapshotChunk]:
        return [r for r in self.records if isinstance(r, SnapshotChunk)]

    def decoded_messages(self) -> list[EventBatch | EpochRecord | SnapshotChunk]:
        return [r for m in self.messages for r in records(decode(m))]

    def _check_open(self) -> None:
        if self.closed:
            raise SinkClosed("MemorySink is closed; nothing more is accepted")


class RecordingSink:
    """Keeps what the agent ships exactly as shipped, in ``.items``: ``EventBatch``es
    and ``EpochRecord``s, nothing decoded or encoded (cheap; for tests and benchmarks
    that replay the shipments into another sink or reader)."""

    def __init__(self) -> None:
        self.items: list[EventBatch | EpochRecord | SnapshotChunk] = []
        self.closed = False

    def write_events(self, batch: EventBatch) -> None:
        self.items.append(batch)

    def write_epoch(self, record: EpochRecord) -> None:
        self.items.append(record)

    def write_snapshot(self, chunk: SnapshotChunk) -> None:
        self.items.append(chunk)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True
