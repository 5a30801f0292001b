"""Snapshot chunks (codec kind 0x03): a range of rows' cells at one quiescence point.

The layout is documented in ``sinks.codec``'s opening comment; this module holds the
chunk type, its encoding, decoding and digest, so the codec module stays one screen
per kind. Everything here is reached through ``sinks.codec``.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pyarrow as pa

from sequencer import RowKey, Value
from sinks._setsum import Setsum
from sinks.codec import (
    KIND_SNAPSHOT,
    MAGIC,
    CodecError,
    _check_tags,
    decode_key,
    decode_value,
    encode_key,
    encode_keys,
    encode_values,
)

__all__ = ["SNAPSHOT_SCHEMA", "Bound", "SnapshotChunk", "chunk_digest", "decode_snapshot",
           "encode_snapshot", "row_order"]

SNAPSHOT_VERSION: Final = 2  # the first codec version with kind 0x03

SNAPSHOT_SCHEMA: Final = pa.schema(
    [
        pa.field("table", pa.utf8(), nullable=False),
        pa.field("row", pa.binary(), nullable=False),
        pa.field("column", pa.utf8(), nullable=False),
        pa.field("value", pa.binary(), nullable=False),
    ],
    metadata={b"cdc-agent.format": str(SNAPSHOT_VERSION).encode()},
)

# A chunk boundary: (table, row) or (table, None) for "the start of that table".
Bound = tuple[str, RowKey | None]
SnapshotCell = tuple[str, RowKey, str, Value]

_HEAD = struct.Struct(">QQQQIBQ32s")
_U16 = struct.Struct(">H")
_DIGEST_HEAD = struct.Struct(">QQQQIBI")
_DIGEST_MAGIC: Final = b"CDCSNAP1"


def row_order(table: str, row: RowKey | None) -> tuple[str, int, RowKey | int]:
    """The sort key of a row (or of a bound with ``row=None``) in snapshot row order:
    by table, then int keys numerically before str keys by code point."""
    if row is None:
        return (table, -1, 0)
    return (table, 0, row) if type(row) is int else (table, 1, row)


@dataclass(frozen=True, slots=True)
class SnapshotChunk:
    """One chunk of a baseline: every present cell of rows ``lo <= row < hi`` as they
    were at quiescence point ``(epoch_seq, end_id)`` of ``domain_id``.

    ``lo``/``hi`` of ``None`` are open (before everything / after everything);
    ``setsum`` is the hex setsum of the chunk's digest (``chunk_digest``).
    """

    domain_id: int
    epoch_seq: int
    end_id: int
    baseline_id: int
    index: int
    last: bool
    lo: Bound | None
    hi: Bound | None
    data: pa.RecordBatch
    cell_count: int
    setsum: str

    @classmethod
    def build(cls, domain_id: int, epoch_seq: int, end_id: int, baseline_id: int,
              index: int, last: bool, lo: Bound | None, hi: Bound | None,
              cells: Sequence[SnapshotCell]) -> SnapshotChunk:
        """A chunk of ``cells`` (in any order), its count and setsum filled in."""
        tables = [c[0] for c in cells]
        data = pa.RecordBatch.from_arrays(
            [pa.array(tables, pa.utf8()), _encode_column([c[1] for c in cells], encode_keys),
             pa.array([c[2] for c in cells], pa.utf8()),
             _encode_column([c[3] for c in cells], encode_values)],
            schema=SNAPSHOT_SCHEMA)
        digest = chunk_digest(domain_id, epoch_seq, end_id, baseline_id, index, last, lo, hi,
                              data)
        return cls(domain_id, epoch_seq, end_id, baseline_id, index, last, lo, hi, data,
                   len(cells), Setsum.of_digests([digest]).hexdigest())

    def __len__(self) -> int:
        return int(self.data.num_rows)

    def cells(self) -> list[SnapshotCell]:
        """The chunk's cells, decoded."""
        cols = [self.data.column(i).to_pylist() for i in range(4)]
        return [(t, decode_key(r), c, decode_value(v))  # type: ignore[misc]
                for t, r, c, v in zip(*cols, strict=True)]

    def actual_setsum(self) -> str:
        """The setsum recomputed from the chunk's content (compare with ``setsum``)."""
        digest = chunk_digest(self.domain_id, self.epoch_seq, self.end_id, self.baseline_id,
                              self.index, self.last, self.lo, self.hi, self.data)
        return Setsum.of_digests([digest]).hexdigest()


_FIXED_TAGS: Final = {int: (2, ">i8"), float: (3, ">f8")}


def _encode_column(values: list[Any], encode: Callable[[list[Any]], pa.Array]) -> pa.Array:
    """``encode`` (``encode_values`` or ``encode_keys``) of a chunk's column, the same
    bytes; a column of only ints or only floats (a baseline's usual case) is laid out
    straight into the Arrow buffers: tag byte then 8 big-endian bytes per value."""
    kinds = set(map(type, values))
    fixed = _FIXED_TAGS.get(kinds.pop()) if len(kinds) == 1 else None
    if fixed is None:
        return encode(values)
    tag, dtype = fixed
    n = len(values)
    raw = np.empty((n, 9), np.uint8)
    raw[:, 0] = tag
    raw[:, 1:] = np.array(values, dtype=dtype).view(np.uint8).reshape(n, 8)
    offsets = np.arange(0, 9 * n + 1, 9, dtype=np.int32)
    return pa.BinaryArray.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets),
                                                        pa.py_buffer(raw)])


def _bound_bytes(bound: Bound | None) -> bytes:
    if bound is None:
        return b"\x00"
    table, row = bound
    raw_table = table.encode()
    raw_row = b"" if row is None else encode_key(row)
    return b"".join((b"\x01", _U16.pack(len(raw_table)), raw_table,
                     _U16.pack(len(raw_row)), raw_row))


def _read_bound(payload: memoryview, pos: int) -> tuple[Bound | None, int]:
    tag = payload[pos]
    pos += 1
    if tag == 0:
        return None, pos
    if tag != 1:
        raise CodecError(f"SNAPSHOT bound has tag {tag:#x}, expected 0 or 1")
    (n,) = _U16.unpack_from(payload, pos)
    table = bytes(payload[pos + 2: pos + 2 + n]).decode()
    pos += 2 + n
    (m,) = _U16.unpack_from(payload, pos)
    raw_row = bytes(payload[pos + 2: pos + 2 + m])
    pos += 2 + m
    if len(raw_row) != m:
        raise CodecError("SNAPSHOT bound is cut short")
    return (table, decode_key(raw_row) if raw_row else None), pos


def chunk_digest(domain_id: int, epoch_seq: int, end_id: int, baseline_id: int, index: int,
                 last: bool, lo: Bound | None, hi: Bound | None,
                 data: pa.RecordBatch) -> bytes:
    """SHA3-256 over the chunk's header and cells, column by column (one hash per chunk,
    as segments of events are hashed: lengths then bytes of each column)."""
    h = hashlib.sha3_256(_DIGEST_MAGIC)
    h.update(_DIGEST_HEAD.pack(domain_id, epoch_seq, end_id, baseline_id, index, int(last),
                               data.num_rows))
    h.update(_bound_bytes(lo))
    h.update(_bound_bytes(hi))
    for i in range(4):
        col = data.column(i)
        n = len(col)
        offsets = np.frombuffer(col.buffers()[1], dtype=np.int32, count=n + 1,
                                offset=col.offset * 4)
        h.update((offsets[1:] - offsets[:-1]).astype(">u4").tobytes())
        values = col.buffers()[2]
        if values is not None and n:
            h.update(memoryview(values)[int(offsets[0]): int(offsets[-1])])
    return h.digest()


def encode_snapshot(chunk: SnapshotChunk) -> bytes:
    """One SNAPSHOT message."""
    if not chunk.data.schema.equals(SNAPSHOT_SCHEMA):
        raise CodecError(f"snapshot cells must have SNAPSHOT_SCHEMA, got {chunk.data.schema}")
    sink = pa.BufferOutputStream()
    sink.write(MAGIC + bytes((SNAPSHOT_VERSION, KIND_SNAPSHOT)))
    sink.write(_HEAD.pack(chunk.domain_id, chunk.epoch_seq, chunk.end_id, chunk.baseline_id,
                          chunk.index, int(chunk.last), chunk.cell_count,
                          bytes.fromhex(chunk.setsum)))
    sink.write(_bound_bytes(chunk.lo))
    sink.write(_bound_bytes(chunk.hi))
    with pa.ipc.new_stream(sink, SNAPSHOT_SCHEMA) as writer:
        writer.write_batch(chunk.data)
    return bytes(sink.getvalue().to_pybytes())


def decode_snapshot(payload: memoryview) -> SnapshotChunk:
    """The chunk of a SNAPSHOT message's payload (after magic, version and kind)."""
    try:
        domain, seq, end, baseline, index, flags, count, digest = _HEAD.unpack_from(payload, 0)
        lo, pos = _read_bound(payload, _HEAD.size)
        hi, pos = _read_bound(payload, pos)
        table = pa.ipc.open_stream(pa.py_buffer(payload[pos:])).read_all()
    except (struct.error, UnicodeDecodeError, IndexError) as exc:
        raise CodecError(f"corrupt SNAPSHOT header: {exc}") from exc
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise CodecError(f"corrupt SNAPSHOT payload: {exc}") from exc
    if not table.schema.equals(SNAPSHOT_SCHEMA):
        raise CodecError(f"SNAPSHOT payload has schema {table.schema}, not SNAPSHOT_SCHEMA")
    if flags & ~1:
        raise CodecError(f"SNAPSHOT flags {flags:#x} has unknown bits")
    try:  # untrusted bytes: full validation, as for EVENTS (issue 10, item 2)
        table.validate(full=True)
        batches = table.combine_chunks().to_batches()
        data = batches[0] if batches else pa.RecordBatch.from_pylist([], schema=SNAPSHOT_SCHEMA)
        _check_tags(data, "SNAPSHOT", values=("value",), absent_ok=False)
    except (pa.ArrowException, OSError) as exc:
        raise CodecError(f"corrupt SNAPSHOT payload: {type(exc).__name__}: {exc}") from exc
    if data.num_rows != count:
        raise CodecError(f"SNAPSHOT says {count} cells but holds {data.num_rows}")
    return SnapshotChunk(domain, seq, end, baseline, index, bool(flags & 1), lo, hi, data,
                         count, bytes(digest).hex())
