"""The native Kafka encoding: one compact message per change event, keyed by its cell.

Kafka keys a message, so the sink sends one message per event (the codec's EVENTS
message, an Arrow stream, would cost far more than the event itself). Layout, version 1,
all integers big-endian, values and row keys tagged exactly as in ``sinks.codec``:

    key      := table utf-8 | 0x00 | column utf-8 | 0x00 | tagged row key
    value    := "CDK" | version u8 (= 1) | domain_id u64 | batch_id u64 | seq u32 |
                table_len u8 | column_len u8 | row_len u32 | old_len u32 | new_len u32 |
                table | column | row (tagged key) | old (tagged value) | new (tagged value)

The lengths must add up to the message's length exactly (a cut message is refused).
Table and column names are identifiers (at most 63 ASCII characters, no NUL), so the key
is unambiguous. The partition of an event is
``crc32(key) mod partitions`` (``partition_of``), which is also librdkafka's
``consistent`` partitioner: one cell's events always land in the same partition.

Epoch records are the codec's EPOCH messages (``sinks.codec.encode_epoch``); see
``sinks.kafka._markers`` for how they are spread over partitions.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from typing import Final, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sequencer import ChangeEvent
from sinks.codec import CodecError, EventBatch, decode_key, decode_value

__all__ = [
    "EVENT_MAGIC",
    "RawEvent",
    "cell_key",
    "decode_event",
    "encode_event_messages",
    "event_keys",
    "partition_of",
    "partitions_of",
    "raw_events_batch",
]

EVENT_MAGIC: Final = b"CDK"
EVENT_VERSION: Final = 1
_HEAD: Final = struct.Struct(">3sBQQIBBIII")
_HEAD_DTYPE: Final = np.dtype([
    ("magic", "S3"), ("version", "u1"), ("domain_id", ">u8"), ("batch_id", ">u8"),
    ("seq", ">u4"), ("table_len", "u1"), ("column_len", "u1"), ("row_len", ">u4"),
    ("old_len", ">u4"), ("new_len", ">u4"),
])
assert _HEAD_DTYPE.itemsize == _HEAD.size


class RawEvent(NamedTuple):
    """An event as it travels: ids, names, and the tagged bytes of row, old and new."""

    domain_id: int
    batch_id: int
    seq: int
    table: str
    row: bytes
    column: str
    old: bytes
    new: bytes

    def to_event(self) -> ChangeEvent:
        return ChangeEvent(self.domain_id, self.batch_id, self.seq, self.table,
                           decode_key(self.row), self.column, decode_value(self.old),
                           decode_value(self.new))


def cell_key(table: str, row: bytes, column: str) -> bytes:
    """The Kafka key of a cell (``row`` is the tagged row key)."""
    return b"%s\x00%s\x00%s" % (table.encode(), column.encode(), row)


def partition_of(key: bytes, partitions: int) -> int:
    """The partition of a key: ``crc32(key) mod partitions`` (stable across processes)."""
    return zlib.crc32(key) % partitions


def partitions_of(keys: Sequence[bytes], partitions: int) -> np.ndarray:
    """``partition_of`` for many keys, as an int64 array."""
    return np.array(list(map(zlib.crc32, keys)), dtype=np.int64) % partitions


def _binary(column: pa.Array) -> pa.Array:
    return column if column.type == pa.binary() else column.cast(pa.binary())


def _lengths(column: pa.Array) -> np.ndarray:
    return np.asarray(pc.binary_length(column).to_numpy(zero_copy_only=False))


def event_keys(data: pa.RecordBatch) -> list[bytes]:
    """The Kafka key of every event of ``data`` (an ``EVENT_SCHEMA`` batch)."""
    joined = pc.binary_join_element_wise(
        _binary(data.column("table")), _binary(data.column("column")), data.column("row"),
        b"\x00",
    )
    keys: list[bytes] = joined.to_pylist()
    return keys


def encode_event_messages(data: pa.RecordBatch) -> list[bytes]:
    """The native message value of every event of ``data``, computed column-wise."""
    n = data.num_rows
    table, column = _binary(data.column("table")), _binary(data.column("column"))
    row, old, new = data.column("row"), data.column("old"), data.column("new")
    head = np.zeros(n, dtype=_HEAD_DTYPE)
    head["magic"] = EVENT_MAGIC
    head["version"] = EVENT_VERSION
    head["domain_id"] = data.column("domain_id").to_numpy()
    head["batch_id"] = data.column("batch_id").to_numpy()
    head["seq"] = data.column("seq").to_numpy()
    head["table_len"] = _lengths(table)
    head["column_len"] = _lengths(column)
    head["row_len"] = _lengths(row)
    head["old_len"] = _lengths(old)
    head["new_len"] = _lengths(new)
    heads = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(_HEAD.size), n, [None, pa.py_buffer(head.tobytes())]
    ).cast(pa.binary())
    values: list[bytes] = pc.binary_join_element_wise(
        heads, table, column, row, old, new, b""
    ).to_pylist()
    return values


def decode_event(value: bytes) -> RawEvent:
    """Parse one native event message, checking magic, version and lengths."""
    try:
        magic, version, domain, batch, seq, tl, cl, rl, ol, nl = _HEAD.unpack_from(value, 0)
    except struct.error as exc:
        raise CodecError(f"native event message too short ({len(value)} bytes)") from exc
    if magic != EVENT_MAGIC:
        raise CodecError(f"not a native event message (starts {bytes(value[:8])!r})")
    if version != EVENT_VERSION:
        raise CodecError(f"native event format version {version}; this reader knows "
                         f"version {EVENT_VERSION}")
    pos = _HEAD.size
    end = pos + tl + cl + rl + ol
    if end + nl != len(value):
        raise CodecError(f"native event message truncated or padded ({len(value)} bytes, "
                         f"its lengths say {end + nl})")
    try:
        table = value[pos : pos + tl].decode()
        column = value[pos + tl : pos + tl + cl].decode()
    except UnicodeDecodeError as exc:
        raise CodecError(f"native event message has a bad name: {exc}") from exc
    pos += tl + cl
    row = value[pos : pos + rl]
    old = value[pos + rl : end]
    return RawEvent(domain, batch, seq, table, row, column, old, value[end:])


def raw_events_batch(events: Sequence[RawEvent]) -> EventBatch:
    """An ``EventBatch`` of raw events, without decoding their values."""
    from sinks.codec import EVENT_SCHEMA

    columns = list(zip(*events, strict=True)) if events else [()] * 8
    return EventBatch(pa.RecordBatch.from_arrays(
        [pa.array(col, type=field.type) for col, field in zip(columns, EVENT_SCHEMA,
                                                               strict=True)],
        schema=EVENT_SCHEMA,
    ))
