"""Snapshot chunks (codec kind 0x03): a range of rows' cells at one quiescence point.

The layout is documented in ``sinks.codec``'s opening comment; this module holds the
chunk type, its encoding, decoding and digest, so the codec module stays one screen
per kind. Everything here is reached through ``sinks.codec``.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from typing import Any, Final, overload

import numpy as np
import pyarrow as pa

from sequencer import RowKey, Value
from sinks._ipc import BatchReader, WrongSchema
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

__all__ = ["SNAPSHOT_SCHEMA", "Bound", "RowCells", "SnapshotChunk", "cells_batch",
           "chunk_digest", "decode_snapshot", "encode_snapshot", "row_order"]

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
_SNAPSHOT_READER: Final = BatchReader(SNAPSHOT_SCHEMA)

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


class RowCells(Sequence[SnapshotCell]):
    """A chunk's cells as columns, grouped by row: what a store's ``list_cells`` returns
    cheaply (no tuple per cell) and ``SnapshotChunk.build`` lays into Arrow directly.

    Per row: ``tables``, ``rows`` and ``widths`` (its cell count, at least 1); per cell,
    row after row: ``columns`` and ``values``. Rows are in snapshot row order. As a
    sequence it is the ``(table, row, column, value)`` tuples, built on demand.
    """

    __slots__ = ("columns", "rows", "tables", "values", "widths")

    def __init__(self, tables: list[str], rows: list[RowKey], widths: list[int],
                 columns: list[str], values: list[Value]) -> None:
        self.tables, self.rows, self.widths = tables, rows, widths
        self.columns, self.values = columns, values

    @classmethod
    def of(cls, cells: Sequence[SnapshotCell]) -> RowCells:
        """``cells`` (any order) grouped by row in snapshot row order (stable within a
        row)."""
        if type(cells) is RowCells:
            return cells
        ordered = sorted(cells, key=lambda c: row_order(c[0], c[1]))
        tables: list[str] = []
        rows: list[RowKey] = []
        widths: list[int] = []
        last: tuple[str, RowKey] | None = None
        for table, row, _column, _value in ordered:
            if last is None or last[0] != table or type(last[1]) is not type(row) \
                    or last[1] != row:
                last = (table, row)
                tables.append(table)
                rows.append(row)
                widths.append(0)
            widths[-1] += 1
        return cls(tables, rows, widths, [c[2] for c in ordered], [c[3] for c in ordered])

    def __len__(self) -> int:
        return len(self.columns)

    def __iter__(self) -> Iterator[SnapshotCell]:
        tables = chain.from_iterable(map(repeat, self.tables, self.widths))
        rows = chain.from_iterable(map(repeat, self.rows, self.widths))
        return zip(tables, rows, self.columns, self.values, strict=True)

    @overload
    def __getitem__(self, index: int) -> SnapshotCell: ...

    @overload
    def __getitem__(self, index: slice) -> list[SnapshotCell]: ...

    def __getitem__(self, index: int | slice) -> SnapshotCell | list[SnapshotCell]:
        return list(self)[index]  # seldom used (tests): the columns are the fast path

    def row_slices(self) -> list[tuple[int, int]]:
        """Each row's ``(first cell, end)`` positions."""
        ends = np.cumsum(np.asarray(self.widths, dtype=np.int64)).tolist()
        return list(zip([0, *ends[:-1]], ends, strict=True))


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
        """A chunk of ``cells`` (in any order; ``RowCells`` is the fast path), its
        count and setsum filled in."""
        return cls.of_data(domain_id, epoch_seq, end_id, baseline_id, index, last, lo, hi,
                           cells_batch(cells))

    @classmethod
    def of_data(cls, domain_id: int, epoch_seq: int, end_id: int, baseline_id: int,
                index: int, last: bool, lo: Bound | None, hi: Bound | None,
                data: pa.RecordBatch) -> SnapshotChunk:
        """A chunk of cells already laid out as a ``SNAPSHOT_SCHEMA`` batch."""
        digest = chunk_digest(domain_id, epoch_seq, end_id, baseline_id, index, last, lo, hi,
                              data)
        return cls(domain_id, epoch_seq, end_id, baseline_id, index, last, lo, hi, data,
                   data.num_rows, Setsum.of_digests([digest]).hexdigest())

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


def cells_batch(cells: Sequence[SnapshotCell]) -> pa.RecordBatch:
    """The ``SNAPSHOT_SCHEMA`` batch of ``cells``: a ``RowCells`` is laid out by row
    (each row's table and key encoded once, then repeated by Arrow's ``take``); any
    other sequence column by column, in its own order."""
    if type(cells) is not RowCells:
        return pa.RecordBatch.from_arrays(
            [pa.array([c[0] for c in cells], pa.utf8()),
             _encode_column([c[1] for c in cells], encode_keys),
             pa.array([c[2] for c in cells], pa.utf8()),
             _encode_column([c[3] for c in cells], encode_values)],
            schema=SNAPSHOT_SCHEMA)
    widths = np.asarray(cells.widths, dtype=np.int64)
    if len(widths) and (widths == widths[0]).all():  # rows of equal width: no repeat
        per_row = pa.array(np.arange(len(cells.columns), dtype=np.int32) // int(widths[0]))
    else:
        per_row = pa.array(np.repeat(np.arange(len(widths), dtype=np.int32), widths))
    return pa.RecordBatch.from_arrays(
        [_repeated(pa.array(cells.tables, pa.utf8()), per_row),
         _repeated(_encode_column(cells.rows, encode_keys), per_row),
         pa.array(cells.columns, pa.utf8()), _encode_column(cells.values, encode_values)],
        schema=SNAPSHOT_SCHEMA)


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


def _repeated(per_row: pa.Array, positions: pa.Array) -> pa.Array:
    """``per_row.take(positions)`` without the validity bitmap ``take`` adds (the
    columns have no nulls): the same bytes as a column built cell by cell."""
    taken = per_row.take(positions)
    return pa.Array.from_buffers(taken.type, len(taken), [None, *taken.buffers()[1:]])


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
    except (struct.error, UnicodeDecodeError, IndexError) as exc:
        raise CodecError(f"corrupt SNAPSHOT header: {exc}") from exc
    try:  # untrusted bytes: full validation, as for EVENTS (issue 10, item 2)
        data = _SNAPSHOT_READER.read(payload[pos:])
    except WrongSchema as exc:
        raise CodecError(f"SNAPSHOT payload has schema {exc.found}, not SNAPSHOT_SCHEMA"
                         ) from None
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise CodecError(f"corrupt SNAPSHOT payload: {type(exc).__name__}: {exc}") from exc
    if flags & ~1:
        raise CodecError(f"SNAPSHOT flags {flags:#x} has unknown bits")
    _check_tags(data, "SNAPSHOT", values=("value",), absent_ok=False)
    if data.num_rows != count:
        raise CodecError(f"SNAPSHOT says {count} cells but holds {data.num_rows}")
    return SnapshotChunk(domain, seq, end, baseline, index, bool(flags & 1), lo, hi, data,
                         count, bytes(digest).hex())
