"""The record codec: the one definition of cdc-agent's bytes on the wire and on disk.

Every sink and every reader (the Spark job included) encodes and decodes through this
module. Layout, version 3 (version 2 is the same without kind 0x04, version 1 also
without kind 0x03; readers accept all three, writers write 3, except that SNAPSHOT
chunks, whose layout is unchanged, are still written as version 2):

    message    := MAGIC "CDC" | version u8 (1, 2 or 3) | kind u8 | payload
    kind 0x01  EVENTS: payload is an Arrow IPC stream of record batches of
               EVENT_SCHEMA (below), uncompressed.
    kind 0x02  EPOCH: payload is, big-endian,
               domain_id u64 | epoch_seq u64 | begin_id u64 | end_id u64 |
               event_count u64 | flags u8 (bit 0 quiescent, bit 1 stream present) |
               stream u32 | setsum 32 bytes (the digest; zeros if not computed) |
               n_tables u16 | n x (name_len u16 | name utf-8 | count u64)
    kind 0x03  SNAPSHOT (version 2): one chunk of a baseline snapshot, the present cells
               of a range of rows as they were at one quiescence point. Big-endian:
               domain_id u64 | epoch_seq u64 | end_id u64 | baseline_id u64 |
               index u32 | flags u8 (bit 0: last chunk) | cell_count u64 |
               setsum 32 bytes | lo bound | hi bound | Arrow IPC stream of SNAPSHOT_SCHEMA
               bound := 0x00 (open: before everything / after everything)
                      | 0x01 table_len u16 | table utf-8 | row_len u16 | tagged key
                        (row_len 0: the start of that table)
               The chunk holds every present cell of the rows r with lo <= r < hi in
               row order: by table (code points), then int keys (numerically) before
               str keys (code points). (epoch_seq, end_id) name the quiescence point
               the cells were read at (0, 0: the domain's start). Chunks of one
               baseline are numbered from 0 and tile the row space: chunk 0 has an open
               lo, each lo is the previous hi, the last has an open hi. A consumer
               applies a chunk right after that quiescence point: the rows of its range
               then hold exactly its cells. ``setsum`` is the setsum of one item, the
               chunk digest (``chunk_digest``), so a baseline's setsum is the sum of its
               chunks'.

    kind 0x04  EPOCHS (version 3): a run of epoch records, many in one message (an
               automatic batch closes two epochs; one message each cost more than the
               batch). Payload is an Arrow IPC stream of EPOCHS_SCHEMA, one row per
               record, in log order; each row means what one EPOCH message means.
               ``records(decode(message))`` expands it into ``EpochRecord``s.

    EPOCHS_SCHEMA: domain_id uint64, epoch_seq uint64, begin_id uint64, end_id uint64,
                   event_count uint64, quiescent bool, stream uint32 (null: a whole
                   log's record), setsum fixed_size_binary(32),
                   table_counts list<struct<table utf8, count uint64>> (by table name)

    SNAPSHOT_SCHEMA: table utf8, row binary (tagged key), column utf8,
                     value binary (tagged value, never ABSENT)

    EVENT_SCHEMA: domain_id uint64, batch_id uint64, seq uint32, table utf8,
                  row binary (tagged key), column utf8, old binary (tagged value),
                  new binary (tagged value)

    tagged value := b""                 ABSENT (the cell does not exist)
                  | 0x00                None
                  | 0x01 u8             bool (0 or 1)
                  | 0x02 i64 (BE)       int
                  | 0x03 f64 bits (BE)  float, every bit (NaN payloads, -0.0)
                  | 0x04 utf-8          str
                  | 0x05 raw            bytes
    tagged key   := 0x02 i64 (BE) | 0x04 utf-8

Setsum items. An epoch's setsum is the setsum (``sinks.Setsum``) of its *segments*: a
segment is the events of one write batch whose ``seq >> SEGMENT_BITS`` agree, in seq
order, serialised column by column as

    b"CDCSEG1\\0" | domain_id u64 | batch_id u64 | n u32 | n x seq u32 |
    for table, row, column, old, new: n x length u32, then the n values' bytes

(all integers big-endian). A segment is never split across shipments, so a writer
hashes each one as it ships and a reader rebuilds the same items from the events alone,
whatever order or duplication they arrived in. Hashing per segment rather than per
event keeps one SHA3 call for many events.

Kafka messages (``sinks.kafka`` writes them, ``replay.kafka`` reads them; the code is the
last two sections of this module). Kafka keys each message, so events travel one per
message rather than as EVENTS messages. Two encodings:

    native, version 1 (NATIVE_VERSION), all integers big-endian:
      event key    := table utf-8 | 0x00 | column utf-8 | 0x00 | tagged row key
      event value  := "CDK" | version u8 (= 1) | domain_id u64 | batch_id u64 | seq u32 |
                      table_len u8 | column_len u8 | row_len u32 | old_len u32 |
                      new_len u32 | table | column | row (tagged key) |
                      old (tagged value) | new (tagged value)
      The lengths add up to the value's length exactly (a cut message is refused).
      Table and column names are identifiers (at most 63 ASCII characters, no NUL), so
      the key is unambiguous. An event's partition is ``crc32(key) mod partitions``
      (``partition_of``, librdkafka's ``consistent`` partitioner).
    debezium: JSON envelopes and transaction records (described, with examples, in
      docs/kafka.md and in the Debezium section below).

    In both, each partition gets one epoch marker per epoch record, after that
    partition's events, with two headers holding EPOCH messages:
      HEADER_PARTITION "cdc-agent-epoch"        the partition's share (its counts and
                                                setsum, ``stream`` = the partition)
      HEADER_WHOLE     "cdc-agent-epoch-whole"  the record for the whole epoch
    (native: the value is the partition's EPOCH message and the key empty; debezium:
    the value is null and the key ``{"cdc_agent_epoch": "<domain>:<epoch_seq>"}``).
    A baseline chunk is one message in partition SNAPSHOT_PARTITION (0): native, its
    value is the SNAPSHOT message; debezium, the value is null, the SNAPSHOT message is
    in header HEADER_SNAPSHOT "cdc-agent-snapshot" and the key is
    ``{"cdc_agent_snapshot": "<domain>:<baseline_id>:<index>"}``, and each of the
    chunk's cells follows as an op "r" record in its cell's partition (header
    HEADER_READ "cdc-agent-read"; the Debezium section below has the layout).
"""

from __future__ import annotations

import functools
import itertools
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sequencer import ABSENT, NATIVE, Absent, ChangeEvent, EpochRecord, RowKey, Value
from sinks._ipc import BatchReader, WrongSchema
from sinks._setsum import Setsum

__all__ = [
    "EPOCHS_SCHEMA",
    "EVENT_SCHEMA",
    "FORMAT_VERSION",
    "SNAPSHOT_SCHEMA",
    "SEGMENT_BITS",
    "CodecError",
    "EpochRun",
    "EventBatch",
    "SnapshotChunk",
    "chunk_digest",
    "decode",
    "decode_key",
    "decode_value",
    "encode_epoch",
    "encode_epochs",
    "encode_events",
    "encode_key",
    "encode_keys",
    "encode_snapshot",
    "encode_value",
    "encode_values",
    "records",
    "segment_digests",
]

MAGIC: Final = b"CDC"
FORMAT_VERSION: Final = 3
READABLE_VERSIONS: Final = (1, 2, 3)
KIND_EVENTS: Final = 0x01
KIND_EPOCH: Final = 0x02
KIND_SNAPSHOT: Final = 0x03
KIND_EPOCHS: Final = 0x04
SEGMENT_BITS: Final = 16
_SEGMENT_MAGIC: Final = b"CDCSEG1\x00"

EVENT_SCHEMA: Final = pa.schema(
    [
        pa.field("domain_id", pa.uint64(), nullable=False),
        pa.field("batch_id", pa.uint64(), nullable=False),
        pa.field("seq", pa.uint32(), nullable=False),
        pa.field("table", pa.utf8(), nullable=False),
        pa.field("row", pa.binary(), nullable=False),
        pa.field("column", pa.utf8(), nullable=False),
        pa.field("old", pa.binary(), nullable=False),
        pa.field("new", pa.binary(), nullable=False),
    ],
    metadata={b"cdc-agent.format": b"1"},  # the event schema itself is unchanged since 1
)
_VAR_COLUMNS: Final = ("table", "row", "column", "old", "new")
_EVENTS_READER: Final = BatchReader(EVENT_SCHEMA)


class CodecError(ValueError):
    """Bytes that are not a valid cdc-agent message of a version this reader knows."""


# -- values ---------------------------------------------------------------------------

_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")
_NONE: Final = b"\x00"
_FALSE: Final = b"\x01\x00"
_TRUE: Final = b"\x01\x01"


def encode_value(value: Value | Absent) -> bytes:
    """The tagged bytes of a cell value (``b""`` for ABSENT)."""
    kind = type(value)
    if kind is str:
        return b"\x04" + value.encode()  # type: ignore[union-attr]
    if kind is int:
        return b"\x02" + _I64.pack(value)
    if kind is float:
        return b"\x03" + _F64.pack(value)
    if value is None:
        return _NONE
    if kind is bool:
        return _TRUE if value else _FALSE
    if kind is bytes:
        return b"\x05" + value  # type: ignore[operator]
    if value is ABSENT:
        return b""
    raise CodecError(f"cannot encode a value of type {kind.__name__}")


def decode_value(raw: bytes) -> Value | Absent:
    """Inverse of ``encode_value``."""
    if not raw:
        return ABSENT
    tag = raw[0]
    if tag == 0x04:
        try:
            return bytes(raw[1:]).decode()
        except UnicodeDecodeError as exc:
            raise CodecError(
                f"invalid tagged value {bytes(raw[:16])!r}: the str is not UTF-8 ({exc.reason})"
            ) from None
    if tag == 0x02 and len(raw) == 9:
        return int(_I64.unpack_from(raw, 1)[0])
    if tag == 0x03 and len(raw) == 9:
        return float(_F64.unpack_from(raw, 1)[0])
    if tag == 0x00 and len(raw) == 1:
        return None
    if tag == 0x01 and len(raw) == 2 and raw[1] in (0, 1):
        return raw[1] == 1
    if tag == 0x05:
        return bytes(raw[1:])
    raise CodecError(f"invalid tagged value {bytes(raw[:16])!r}")


def encode_values(values: Sequence[object]) -> pa.Array:
    """``encode_value`` over a list, as an Arrow binary array: the same bytes, but a
    column of one type (ABSENT allowed among them) is encoded in C, not value by value.
    """
    kinds = set(map(type, values))
    absent = Absent in kinds
    kinds.discard(Absent)
    kind = kinds.pop() if len(kinds) == 1 else None
    if kind not in _VECTOR_TAGS:  # mixed, empty, or None/bool (few distinct values)
        return pa.array([encode_value(v) for v in values], pa.binary())  # type: ignore[arg-type]
    if absent:  # encode a stand-in, then put ABSENT's empty bytes back
        mask = pa.array([v is ABSENT for v in values])
        stand_in = next(v for v in values if v is not ABSENT)
        values = [stand_in if v is ABSENT else v for v in values]
    tag = _VECTOR_TAGS[kind]
    if kind is str:
        encoded = _tagged(tag, pa.array(values, pa.string()).cast(pa.binary()))
    elif kind is bytes:
        encoded = _tagged(tag, pa.array(values, pa.binary()))
    else:  # int and float: big-endian 8 bytes; numpy keeps every bit of a float
        encoded = _tagged(tag, _fixed(np.array(values, dtype=">i8" if kind is int else ">f8")))
    if absent:
        encoded = pc.if_else(mask, pa.scalar(b"", pa.binary()), encoded)
    return encoded


_VECTOR_TAGS: Final = {str: b"\x04", bytes: b"\x05", int: b"\x02", float: b"\x03"}


def _fixed(array: np.ndarray) -> pa.Array:
    width = array.dtype.itemsize
    return pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(width), len(array), [None, pa.py_buffer(array.tobytes())]).cast(pa.binary())


def _tagged(tag: bytes, values: pa.Array) -> pa.Array:
    return pc.binary_join_element_wise(pa.scalar(tag, pa.binary()), values,
                                       pa.scalar(b"", pa.binary()))


def encode_keys(rows: Sequence[RowKey]) -> pa.Array:
    """``encode_key`` over a list, as an Arrow binary array (vectorised like
    ``encode_values``)."""
    return encode_values(rows)


def encode_key(row: RowKey) -> bytes:
    """The tagged bytes of a row key."""
    if type(row) is str:
        return b"\x04" + row.encode()
    if type(row) is int:
        return b"\x02" + _I64.pack(row)
    raise CodecError(f"cannot encode a row key of type {type(row).__name__}")


def decode_key(raw: bytes) -> RowKey:
    """Inverse of ``encode_key``."""
    value = decode_value(raw)
    if type(value) not in (str, int):
        raise CodecError(f"invalid row key {bytes(raw[:16])!r}")
    return value  # type: ignore[return-value]


# -- event batches ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EventBatch:
    """Change events as one Arrow record batch of ``EVENT_SCHEMA``.

    Within a batch, each segment's events are contiguous and in seq order (the agent
    ships them so); ``segment_digests`` relies on it.
    """

    data: pa.RecordBatch

    @classmethod
    def from_events(cls, events: Iterable[ChangeEvent]) -> EventBatch:
        cols: tuple[list[object], ...] = ([], [], [], [], [], [], [], [])
        d, b, s, t, r, c, o, n = (col.append for col in cols)
        for e in events:
            d(e.domain_id)
            b(e.batch_id)
            s(e.seq)
            t(e.table)
            r(encode_key(e.row))
            c(e.column)
            o(encode_value(e.old))
            n(encode_value(e.new))
        return cls(pa.RecordBatch.from_arrays(
            [pa.array(col, type=f.type) for col, f in zip(cols, EVENT_SCHEMA, strict=True)],
            schema=EVENT_SCHEMA,
        ))

    def __len__(self) -> int:
        return int(self.data.num_rows)

    def to_events(self) -> list[ChangeEvent]:
        cols = [self.data.column(i).to_pylist() for i in range(len(EVENT_SCHEMA))]
        return [
            ChangeEvent(dom, bat, seq, tab, decode_key(row), col, decode_value(old),
                        decode_value(new))
            for dom, bat, seq, tab, row, col, old, new in zip(*cols, strict=True)
        ]


def encode_events(batch: EventBatch | pa.RecordBatch | pa.Table) -> bytes:
    """One EVENTS message holding ``batch``'s events."""
    data = batch.data if isinstance(batch, EventBatch) else batch
    if not data.schema.equals(EVENT_SCHEMA):
        raise CodecError(f"events must have EVENT_SCHEMA, got {data.schema}")
    sink = pa.BufferOutputStream()
    sink.write(MAGIC + bytes((FORMAT_VERSION, KIND_EVENTS)))
    with pa.ipc.new_stream(sink, EVENT_SCHEMA) as writer:
        if isinstance(data, pa.Table):
            writer.write_table(data)
        else:
            writer.write_batch(data)
    return bytes(sink.getvalue().to_pybytes())


_EPOCH_HEAD = struct.Struct(">QQQQQBI32sH")
_NAME_LEN = struct.Struct(">H")
_COUNT = struct.Struct(">Q")


def encode_epoch(record: EpochRecord) -> bytes:
    """One EPOCH message."""
    flags = (1 if record.quiescent else 0) | (2 if record.stream is not None else 0)
    digest = bytes.fromhex(record.setsum) if record.setsum else bytes(32)
    parts = [
        MAGIC,
        bytes((FORMAT_VERSION, KIND_EPOCH)),
        _EPOCH_HEAD.pack(
            record.domain_id, record.epoch_seq, record.begin_id, record.end_id,
            record.event_count, flags, record.stream or 0, digest, len(record.table_counts),
        ),
    ]
    for name, count in record.table_counts:
        raw = name.encode()
        parts += [_NAME_LEN.pack(len(raw)), raw, _COUNT.pack(count)]
    return b"".join(parts)


def decode(message: bytes | memoryview) -> EventBatch | EpochRecord | SnapshotChunk | EpochRun:
    """Decode one message, checking its magic and version (``records`` expands a run)."""
    raw = memoryview(message)
    if len(raw) < 5 or bytes(raw[:3]) != MAGIC:
        raise CodecError(f"not a cdc-agent message (starts {bytes(raw[:8])!r})")
    version, kind = raw[3], raw[4]
    if version not in READABLE_VERSIONS:
        raise CodecError(
            f"message format version {version}; this reader knows versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}"
        )
    if kind == KIND_EVENTS:
        return _decode_events(raw[5:])
    if kind == KIND_EPOCH:
        return _decode_epoch(raw[5:])
    if kind == KIND_SNAPSHOT and version >= 2:
        from sinks._snapshot_codec import decode_snapshot

        return decode_snapshot(raw[5:])
    if kind == KIND_EPOCHS and version >= 3:
        from sinks._epochs_codec import decode_epochs

        return decode_epochs(raw[5:])
    raise CodecError(f"unknown message kind {kind:#x}")


def _decode_events(payload: memoryview) -> EventBatch:
    """Read and fully validate an EVENTS payload: the bytes are untrusted, and Arrow's
    cheap checks on read let a bad offset through to a crash in ``to_pylist``."""
    try:
        data = _EVENTS_READER.read(payload)
        _check_tags(data)
    except WrongSchema as exc:
        raise CodecError(f"EVENTS payload has schema {exc.found}, not EVENT_SCHEMA") from None
    except (pa.ArrowException, OSError, ValueError) as exc:  # CodecError is a ValueError
        if isinstance(exc, CodecError):
            raise
        raise CodecError(f"corrupt EVENTS payload: {type(exc).__name__}: {exc}") from exc
    return EventBatch(data)


def _check_tags(data: pa.RecordBatch, what: str = "EVENTS",
                values: tuple[str, ...] = ("old", "new"), absent_ok: bool = True) -> None:
    """Refuse nulls, row keys that are not tagged keys and cells that are not tagged
    values (so ``to_events`` and every reader of the columns can trust them)."""
    names = data.schema.names
    kinds = _tag_kinds(tuple(names), values, absent_ok)
    # The usual, sound batch in one C call over its export (a column's Python wrapper
    # alone costs a few us); a fault is named by the checks below.
    if _BATCH_FAULTS is not None and _BATCH_FAULTS(data.__arrow_c_array__()[1],
                                                   kinds) is None:
        return
    columns = [data.column(i) for i in range(len(names))]  # each costs a wrapper: once
    for name, col in zip(names, columns, strict=True):
        if col.null_count:
            raise CodecError(f"{what} column {name!r} holds nulls")
    for name in ("row", *values):
        col = columns[names.index(name)]
        kind = kinds[names.index(name)]
        _, raw_offsets, body = col.buffers()
        offsets = np.frombuffer(raw_offsets, dtype=np.int32, count=len(col) + 1,
                                offset=col.offset * 4)
        faults = (_TAG_FAULTS or tag_faults)(offsets, body if body is not None else b"",
                                             kind)
        if faults is None:
            continue
        bad, not_utf8 = faults
        if bad >= 0:
            raise CodecError(f"{what} row {bad}: {name} is not a tagged "
                             f"{'key' if name == 'row' else 'value'}: "
                             f"{col[bad].as_py()[:16]!r}")
        if not_utf8:  # the str payloads must be UTF-8, as decode_value will need
            raise CodecError(f"{what} column {name!r} holds a str that is not UTF-8")


# What tag_faults checks a column as: row keys, values (ABSENT allowed or not).
_KEYS, _VALUES, _PRESENT_VALUES = 0, 1, 2
# The same check in C, one pass per column (None: not built): numpy's dozen passes cost
# a few microseconds each, per message, which dominated decoding small messages.
_TAG_FAULTS: Final = NATIVE.tag_faults if NATIVE is not None else None
_BATCH_FAULTS: Final = getattr(NATIVE, "batch_faults", None)  # (absent from an old build)


@functools.lru_cache(maxsize=16)
def _tag_kinds(names: tuple[str, ...], values: tuple[str, ...], absent_ok: bool) -> bytes:
    """What ``batch_faults`` checks each column as (0xFF: nulls only)."""
    value_kind = _VALUES if absent_ok else _PRESENT_VALUES
    return bytes(_KEYS if name == "row" else value_kind if name in values else 0xFF
                 for name in names)


def tag_faults(offsets: np.ndarray, body: Any, kind: int) -> tuple[int, bool] | None:
    """A column of tagged row keys (``kind`` 0) or values (1: ABSENT allowed, 2: not),
    its int32 ``offsets`` and data ``body``: None if every entry is well formed, else
    (the first entry whose tag or length is wrong, or -1; whether a str is not UTF-8).
    The reference for ``sequencer.NATIVE.tag_faults``."""
    bounds = offsets.astype(np.int64)
    data = np.frombuffer(body, dtype=np.uint8)
    lengths = bounds[1:] - bounds[:-1]
    present = lengths > 0
    tags = np.full(len(lengths), -1, dtype=np.int64)
    tags[present] = data[bounds[:-1][present]]
    second = np.full(len(lengths), -1, dtype=np.int64)
    two = lengths >= 2
    second[two] = data[bounds[:-1][two] + 1]
    fixed = (tags == 0x02) | (tags == 0x03)
    if kind == _KEYS:
        ok = ((tags == 0x02) & (lengths == 9)) | (tags == 0x04)
    else:
        ok = ((~present & (kind == _VALUES)) | ((tags == 0x00) & (lengths == 1))
              | ((tags == 0x01) & (lengths == 2) & ((second == 0) | (second == 1)))
              | (fixed & (lengths == 9)) | (tags == 0x04) | (tags == 0x05))
    bad = np.flatnonzero(~ok)
    not_utf8 = False
    text = np.flatnonzero(tags == 0x04)
    if len(text):
        column = pa.Array.from_buffers(pa.binary(), len(lengths), [
            None, pa.py_buffer(offsets), pa.py_buffer(body)])
        try:
            pc.binary_slice(column.take(pa.array(text)), 1, 2**31 - 1).cast(pa.utf8())
        except pa.ArrowInvalid:
            not_utf8 = True
    if not len(bad) and not not_utf8:
        return None
    return (int(bad[0]) if len(bad) else -1), not_utf8


def _decode_epoch(payload: memoryview) -> EpochRecord:
    try:
        (domain, seq, begin, end, count, flags, stream, digest, n_tables) = (
            _EPOCH_HEAD.unpack_from(payload, 0))
        pos = _EPOCH_HEAD.size
        counts = []
        for _ in range(n_tables):
            (length,) = _NAME_LEN.unpack_from(payload, pos)
            pos += 2
            name = bytes(payload[pos : pos + length]).decode()
            pos += length
            (n,) = _COUNT.unpack_from(payload, pos)
            pos += 8
            counts.append((name, n))
    except (struct.error, UnicodeDecodeError) as exc:
        raise CodecError(f"corrupt EPOCH payload: {exc}") from exc
    if pos != len(payload):
        raise CodecError(f"EPOCH payload has {len(payload) - pos} trailing bytes")
    return EpochRecord(
        domain_id=domain, epoch_seq=seq, begin_id=begin, end_id=end, event_count=count,
        quiescent=bool(flags & 1), table_counts=tuple(counts),
        setsum=digest.hex(),
        stream=stream if flags & 2 else None,
    )


# -- setsum items ---------------------------------------------------------------------------


def segment_digest_array(
    data: pa.RecordBatch | pa.Table,
    digest_slices: Callable[[bytes, np.ndarray], bytes] | None = None,
) -> tuple[np.ndarray, bytes]:
    """Every segment of ``data`` at once: the row each segment starts at, and the SHA3
    digests of their items, 32 bytes each, in the same order. ``digest_slices(body,
    bounds)``, if given, hashes many items at once (the agent passes its C one,
    ``sequencer._native.sha3_slices``); the same digests as ``hashlib.sha3_256``.

    ``data`` must hold whole segments, each contiguous and in seq order. Each item is
    assembled in Arrow (one ``binary_join`` per column over the segments, then one
    element-wise join), so the only Python step per segment is its SHA3 call.
    """
    import hashlib

    if isinstance(data, pa.Table):
        data = (data.combine_chunks().to_batches()[0] if data.num_rows
                else pa.RecordBatch.from_pylist([], schema=data.schema))
    n = data.num_rows
    if n == 0:
        return np.zeros(0, dtype=np.int64), b""
    domains = data.column(0).to_numpy()
    batches = data.column(1).to_numpy()
    seqs = data.column(2).to_numpy()
    segments = seqs >> SEGMENT_BITS
    change = np.flatnonzero(
        (domains[1:] != domains[:-1]) | (batches[1:] != batches[:-1])
        | (segments[1:] != segments[:-1])
    ) + 1
    starts = np.concatenate(([0], change)).astype(np.int64)
    sha3 = hashlib.sha3_256
    if n <= _SMALL_ROWS:  # a few events: Arrow's fixed cost per call would dominate
        return starts, b"".join(sha3(item).digest() for item in _small_items(
            data, starts.tolist(), domains[starts].tolist(), batches[starts].tolist()))
    if n <= _GATHER_ROWS_PER_SEGMENT * len(starts) and n <= _GATHER_MAX_ROWS:
        # Many small segments (automatic batches): one gather of bytes in numpy.
        body, bounds = _gathered_items(data, starts, domains[starts], batches[starts])
        if digest_slices is not None:
            return starts, digest_slices(body, np.ascontiguousarray(bounds, np.int64))
        view = memoryview(body)
        return starts, b"".join([sha3(view[a:b]).digest()
                                 for a, b in itertools.pairwise(bounds.tolist())])
    digests: list[bytes] = []
    # Pieces of at most _ITEM_ROWS rows, cut where a segment starts (int32 offsets).
    cuts = [0]
    while cuts[-1] < len(starts):
        limit = starts[cuts[-1]] + _ITEM_ROWS
        cuts.append(max(cuts[-1] + 1, int(np.searchsorted(starts, limit, side="right")) - 1
                        if limit < n else len(starts)))
    for lo, hi in itertools.pairwise(cuts):
        first = int(starts[lo])
        last = int(starts[hi]) if hi < len(starts) else n
        items = _segment_items(data.slice(first, last - first), starts[lo:hi] - first,
                               domains[starts[lo:hi]], batches[starts[lo:hi]])
        offsets = np.frombuffer(items.buffers()[1], dtype=np.int32, count=len(items) + 1,
                                offset=items.offset * 4).tolist()
        body = items.buffers()[2]
        view = memoryview(body) if body is not None else memoryview(b"")
        digests += [sha3(view[a:b]).digest() for a, b in itertools.pairwise(offsets)]
    return starts, b"".join(digests)


_ITEM_ROWS: Final = 1 << 18
_SMALL_ROWS: Final = 32
_GATHER_ROWS_PER_SEGMENT: Final = 16  # segments this small on average: gather the items
_GATHER_MAX_ROWS: Final = 1 << 16  # (the gather's index takes 8 bytes per item byte)


def _gathered_items(data: pa.RecordBatch, starts: np.ndarray, domains: np.ndarray,
                    batches: np.ndarray) -> tuple[bytes, np.ndarray]:
    """Every segment's setsum item (the layout above), concatenated, and where each
    begins and ends: the pieces of all items are byte ranges of a few buffers, copied
    into place by one numpy gather (no Python step per segment or per event)."""
    n, m = data.num_rows, len(starts)
    ends = np.concatenate((starts[1:], [n])).astype(np.int64)
    head = np.empty(m, dtype=_ITEM_HEAD)
    head["magic"], head["domain"], head["batch"], head["n"] = (
        _SEGMENT_MAGIC, domains, batches, ends - starts)
    sources = [np.frombuffer(head.tobytes(), np.uint8),
               np.frombuffer(data.column(2).to_numpy().astype(">u4").tobytes(), np.uint8)]
    piece_starts = [np.arange(m, dtype=np.int64) * _ITEM_HEAD.itemsize, 4 * starts]
    piece_lengths = [np.full(m, _ITEM_HEAD.itemsize, dtype=np.int64), 4 * (ends - starts)]
    for name in _VAR_COLUMNS:
        col = data.column(name)
        offsets = np.frombuffer(col.buffers()[1], dtype=np.int32, count=n + 1,
                                offset=col.offset * 4).astype(np.int64)
        lengths = (offsets[1:] - offsets[:-1]).astype(">u4")
        sources.append(np.frombuffer(lengths.tobytes(), np.uint8))
        piece_starts.append(4 * starts)
        piece_lengths.append(4 * (ends - starts))
        raw = col.buffers()[2]
        values = (np.frombuffer(raw, np.uint8)[offsets[0]:offsets[-1]] if raw is not None
                  else np.zeros(0, np.uint8))
        sources.append(values)
        piece_starts.append(offsets[starts] - offsets[0])
        piece_lengths.append(offsets[ends] - offsets[starts])
    bases = np.cumsum([0] + [len(src) for src in sources[:-1]])
    first = np.stack([p + b for p, b in zip(piece_starts, bases, strict=True)], axis=1).ravel()
    lengths = np.stack(piece_lengths, axis=1).ravel()
    out_starts = np.cumsum(lengths) - lengths
    gather = np.repeat(first - out_starts, lengths) + np.arange(int(lengths.sum()))
    body = np.concatenate(sources)[gather].tobytes()
    sizes = np.stack(piece_lengths, axis=1).sum(axis=1)
    return body, np.concatenate(([0], np.cumsum(sizes)))


def _small_items(data: pa.RecordBatch, starts: list[int], domains: list[int],
                 batches: list[int]) -> Iterator[bytes]:
    """The setsum items of a few events, joined from slices in Python."""
    n = data.num_rows
    seq_be = data.column(2).to_numpy().astype(">u4").tobytes()
    columns = []
    for name in _VAR_COLUMNS:
        col = data.column(name)
        offsets = np.frombuffer(col.buffers()[1], dtype=np.int32, count=len(col) + 1,
                                offset=col.offset * 4)
        lengths = (offsets[1:] - offsets[:-1]).astype(">u4").tobytes()
        values = col.buffers()[2]
        columns.append((offsets.tolist(), lengths, bytes(values) if values is not None else b""))
    head = struct.Struct(">QQI").pack
    for k, i in enumerate(starts):
        j = starts[k + 1] if k + 1 < len(starts) else n
        parts = [_SEGMENT_MAGIC, head(domains[k], batches[k], j - i), seq_be[4 * i:4 * j]]
        for offsets, lengths, values in columns:
            parts += (lengths[4 * i:4 * j], values[offsets[i]:offsets[j]])
        yield b"".join(parts)
_ITEM_HEAD: Final = np.dtype([("magic", "S8"), ("domain", ">u8"), ("batch", ">u8"), ("n", ">u4")])


def _segment_items(data: pa.RecordBatch, starts: np.ndarray, domains: np.ndarray,
                   batches: np.ndarray) -> pa.Array:
    """One binary per segment: its setsum item, as the layout above says."""
    n, m = data.num_rows, len(starts)
    bounds = pa.array(np.concatenate((starts, [n])).astype(np.int32))
    head = np.empty(m, dtype=_ITEM_HEAD)
    head["magic"], head["domain"], head["batch"] = _SEGMENT_MAGIC, domains, batches
    head["n"] = np.diff(np.concatenate((starts, [n])))

    def fixed(raw: bytes, width: int, count: int) -> pa.Array:
        return pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(width), count, [None, pa.py_buffer(raw)]).cast(pa.binary())

    def per_segment(values: pa.Array) -> pa.Array:
        return pc.binary_join(pa.ListArray.from_arrays(bounds, values), b"")

    seqs = data.column(2).to_numpy().astype(">u4")
    parts = [fixed(head.tobytes(), _ITEM_HEAD.itemsize, m),
             per_segment(fixed(seqs.tobytes(), 4, n))]
    for name in _VAR_COLUMNS:
        column = data.column(name)
        if column.type != pa.binary():
            column = column.cast(pa.binary())
        lengths = pc.binary_length(column).to_numpy(zero_copy_only=False).astype(">u4")
        parts.append(per_segment(fixed(lengths.tobytes(), 4, n)))
        parts.append(per_segment(column))
    return pc.binary_join_element_wise(*parts, b"")


def segment_digests(data: pa.RecordBatch | pa.Table) -> Iterator[tuple[int, int, bytes]]:
    """Yield ``(domain_id, batch_id, sha3 digest)`` for each segment of ``data``.

    ``data`` must hold whole segments, each contiguous and in seq order (sort by
    domain, batch, seq first if unsure).
    """
    starts, digests = segment_digest_array(data)
    if not len(starts):
        return
    if isinstance(data, pa.Table):
        data = data.combine_chunks().to_batches()[0]
    domains = data.column(0).to_numpy()[starts].tolist()
    batches = data.column(1).to_numpy()[starts].tolist()
    for k, (domain, batch) in enumerate(zip(domains, batches, strict=True)):
        yield domain, batch, digests[32 * k: 32 * k + 32]


def digests_setsum(digests: Sequence[bytes]) -> Setsum:
    """The setsum of items given by their digests."""
    return Setsum().insert_digests(b"".join(digests))


def row_segment_digests(rows: Sequence[tuple[int, int, int, str, bytes, str, bytes, bytes]]
                        ) -> list[bytes]:
    """The SHA3 digests of the segments of a few events given as Python rows
    ``(domain_id, batch_id, seq, table, row, column, old, new)`` in (domain, batch, seq)
    order: the items of ``segment_digest_array``, with no Arrow call (whose fixed cost
    dominates a Kafka partition's share of a one-event epoch)."""
    import hashlib

    sha3, head, seq_be, length = (hashlib.sha3_256, _ROW_ITEM_HEAD.pack,
                                  _ROW_SEQ.pack, _ROW_SEQ.pack)
    digests: list[bytes] = []
    i, n = 0, len(rows)
    while i < n:
        domain, batch, seq = rows[i][0], rows[i][1], rows[i][2]
        j = i + 1
        while (j < n and rows[j][0] == domain and rows[j][1] == batch
               and rows[j][2] >> SEGMENT_BITS == seq >> SEGMENT_BITS):
            j += 1
        segment = rows[i:j]
        parts = [_SEGMENT_MAGIC, head(domain, batch, j - i), *(seq_be(r[2]) for r in segment)]
        for raw in ([r[3].encode() for r in segment], [r[4] for r in segment],
                    [r[5].encode() for r in segment], [r[6] for r in segment],
                    [r[7] for r in segment]):  # table, row, column, old, new
            parts += [length(len(v)) for v in raw]
            parts += raw
        digests.append(sha3(b"".join(parts)).digest())
        i = j
    return digests


_ROW_ITEM_HEAD: Final = struct.Struct(">QQI")
_ROW_SEQ: Final = struct.Struct(">I")


# -- snapshot chunks (kind 0x03; the layout lives in sinks._snapshot_codec) -------------

# -- Kafka: the native encoding (layout "Kafka messages" in the opening comment) ------------
import zlib  # noqa: E402 - this section's own imports, kept with it
from typing import NamedTuple  # noqa: E402

# -- snapshot chunks: the names the agent and the readers use ------------------------------
from sinks._snapshot_codec import (  # noqa: E402 - it needs this module's helpers above  # noqa: E402 - it needs this module's helpers above
    SNAPSHOT_SCHEMA,
    Bound,
    RowCells,
    SnapshotCell,
    SnapshotChunk,
    cells_batch,
    chunk_digest,
    decode_snapshot,
    encode_snapshot,
    row_order,
)

HEADER_PARTITION: Final = "cdc-agent-epoch"
HEADER_WHOLE: Final = "cdc-agent-epoch-whole"
HEADER_SNAPSHOT: Final = "cdc-agent-snapshot"
SNAPSHOT_PARTITION: Final = 0
NATIVE_MAGIC: Final = b"CDK"
NATIVE_VERSION: Final = 1
_NATIVE_HEAD: Final = struct.Struct(">3sBQQIBBIII")
_NATIVE_HEAD_DTYPE: Final = np.dtype([
    ("magic", "S3"), ("version", "u1"), ("domain_id", ">u8"), ("batch_id", ">u8"),
    ("seq", ">u4"), ("table_len", "u1"), ("column_len", "u1"), ("row_len", ">u4"),
    ("old_len", ">u4"), ("new_len", ">u4"),
])
assert _NATIVE_HEAD_DTYPE.itemsize == _NATIVE_HEAD.size


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


def _as_binary(column: pa.Array) -> pa.Array:
    return column if column.type == pa.binary() else column.cast(pa.binary())


def _byte_lengths(column: pa.Array) -> np.ndarray:
    return np.asarray(pc.binary_length(column).to_numpy(zero_copy_only=False))


def event_keys(data: pa.RecordBatch) -> list[bytes]:
    """The Kafka key of every event of ``data`` (an ``EVENT_SCHEMA`` batch)."""
    joined = pc.binary_join_element_wise(
        _as_binary(data.column("table")), _as_binary(data.column("column")),
        data.column("row"), b"\x00",
    )
    keys: list[bytes] = joined.to_pylist()
    return keys


def encode_native_events(data: pa.RecordBatch) -> list[bytes]:
    """The native message value of every event of ``data``, computed column-wise."""
    n = data.num_rows
    table, column = _as_binary(data.column("table")), _as_binary(data.column("column"))
    row, old, new = data.column("row"), data.column("old"), data.column("new")
    head = np.zeros(n, dtype=_NATIVE_HEAD_DTYPE)
    head["magic"] = NATIVE_MAGIC
    head["version"] = NATIVE_VERSION
    head["domain_id"] = data.column("domain_id").to_numpy()
    head["batch_id"] = data.column("batch_id").to_numpy()
    head["seq"] = data.column("seq").to_numpy()
    head["table_len"] = _byte_lengths(table)
    head["column_len"] = _byte_lengths(column)
    head["row_len"] = _byte_lengths(row)
    head["old_len"] = _byte_lengths(old)
    head["new_len"] = _byte_lengths(new)
    heads = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(_NATIVE_HEAD.size), n, [None, pa.py_buffer(head.tobytes())]
    ).cast(pa.binary())
    values: list[bytes] = pc.binary_join_element_wise(
        heads, table, column, row, old, new, b""
    ).to_pylist()
    return values


def _native_head(value: bytes) -> tuple[int, ...]:
    """The head fields ``(domain, batch, seq, table, column, row, old and new lengths)``
    of a native event message, after checking its magic, version and that its lengths
    add up to the message."""
    try:
        magic, version, *fields = _NATIVE_HEAD.unpack_from(value, 0)
    except struct.error as exc:
        raise CodecError(f"native event message too short ({len(value)} bytes)") from exc
    if magic != NATIVE_MAGIC:
        raise CodecError(f"not a native event message (starts {bytes(value[:8])!r})")
    if version != NATIVE_VERSION:
        raise CodecError(f"native event format version {version}; this reader knows "
                         f"version {NATIVE_VERSION}")
    size = _NATIVE_HEAD.size + sum(fields[3:])
    if size != len(value):
        raise CodecError(f"native event message truncated or padded ({len(value)} bytes, "
                         f"its lengths say {size})")
    return tuple(fields)


def decode_native_event(value: bytes) -> RawEvent:
    """Parse one native event message, checking magic, version and lengths."""
    domain, batch, seq, tl, cl, rl, ol, _nl = _native_head(value)
    pos = _NATIVE_HEAD.size
    end = pos + tl + cl + rl + ol
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
    columns = list(zip(*events, strict=True)) if events else [()] * 8
    return EventBatch(pa.RecordBatch.from_arrays(
        [pa.array(col, type=field.type) for col, field in zip(columns, EVENT_SCHEMA,
                                                               strict=True)],
        schema=EVENT_SCHEMA,
    ))


def native_event_head(value: bytes) -> tuple[int, int, int]:
    """``(domain_id, batch_id, seq)`` of a native event message, after checking its
    magic, version and that its lengths add up (the names' UTF-8 is checked when the
    message is decoded: ``decode_native_event``, ``native_events_batch``)."""
    domain, batch, seq, *_lengths = _native_head(value)
    return domain, batch, seq


def encode_native_event(event: RawEvent) -> bytes:
    """The native message value of one raw event (``encode_native_events`` for one)."""
    table, column = event.table.encode(), event.column.encode()
    return b"".join((_NATIVE_HEAD.pack(
        NATIVE_MAGIC, NATIVE_VERSION, event.domain_id, event.batch_id, event.seq, len(table),
        len(column), len(event.row), len(event.old), len(event.new)),
        table, column, event.row, event.old, event.new))


def native_events_batch(values: Sequence[bytes]) -> EventBatch:
    """Many native event messages decoded at once into an ``EventBatch`` (rows in the
    order given): heads parsed by one numpy gather over the joined messages, each field
    cut out by one Arrow ``take`` (no Python step per message). Raises ``CodecError``
    naming the first message that does not decode, as ``decode_native_event`` would."""
    n = len(values)
    if n == 0:
        return raw_events_batch([])
    head_size = _NATIVE_HEAD.size
    sizes = np.fromiter(map(len, values), dtype=np.int64, count=n)
    if int(sizes.min()) < head_size:
        return _first_bad(values)
    ends = np.cumsum(sizes)
    starts = ends - sizes
    joined = b"".join(values)
    raw = np.frombuffer(joined, dtype=np.uint8)
    heads = raw[starts[:, None] + np.arange(head_size)].view(_NATIVE_HEAD_DTYPE).ravel()
    lengths = [heads[name].astype(np.int64)
               for name in ("table_len", "column_len", "row_len", "old_len", "new_len")]
    if not ((heads["magic"] == NATIVE_MAGIC) & (heads["version"] == NATIVE_VERSION)
            & (head_size + sum(lengths) == sizes)).all():
        return _first_bad(values)
    # Each message is six consecutive pieces (head, table, column, row, old, new) of the
    # joined bytes: one binary array of 6n pieces, then every sixth piece per field.
    offsets = np.empty(6 * n + 1, dtype=np.int64)
    offsets[0:6 * n:6] = starts
    at = starts + head_size
    for k, length in enumerate(lengths[:4], start=1):
        offsets[k:6 * n:6] = at
        at = at + length
    offsets[5:6 * n:6] = at
    offsets[6 * n] = ends[-1]
    pieces = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), 6 * n, [None, pa.py_buffer(offsets), pa.py_buffer(joined)])
    try:
        fields = [pieces.take(pa.array(np.arange(k, 6 * n, 6))).cast(
            pa.string() if k in (1, 2) else pa.binary()) for k in range(1, 6)]
    except pa.ArrowInvalid:
        return _first_bad(values)
    table, column, row, old, new = fields
    return EventBatch(pa.RecordBatch.from_arrays(
        [pa.array(heads["domain_id"].astype(np.uint64)),
         pa.array(heads["batch_id"].astype(np.uint64)),
         pa.array(heads["seq"].astype(np.uint32)), table, row, column, old, new],
        schema=EVENT_SCHEMA))


def _first_bad(values: Sequence[bytes]) -> EventBatch:
    """Decode one at a time: raises the first message's ``CodecError``."""
    return raw_events_batch([decode_native_event(v) for v in values])


# -- Kafka: the Debezium-compatible JSON encoding (docs/kafka.md has examples) --------------
#
# One message per change event on the data topic: key ``{"table", "row", "column"}``,
# value the Debezium envelope without a ``schema`` wrapper. ``before``/``after`` are
# ``null`` when the cell does not exist, else ``{"$row": <row key>, "<column>": <value>}``;
# ``op`` is ``c``, ``u`` or ``d``; ``ts_ms`` is the write batch's time (its id is 32.32
# fixed-point seconds); ``source`` names connector, domain, write batch, seq, table, row
# and column; ``transaction`` is the write batch. On the transaction topic, each write
# batch gets a ``BEGIN`` and an ``END`` record once its epoch closes. Values keep every
# bit: JSON numbers carry ints within +-(2**53 - 1) and finite floats; anything else is
# ``{"$int64": "<decimal>"}``, ``{"$float64": "<16 hex digits of the bits>"}`` or
# ``{"$bytes": "<base64>"}``.

import base64  # noqa: E402 - this section's own imports, kept with it
import json  # noqa: E402
import math  # noqa: E402
from collections.abc import Mapping  # noqa: E402

DEBEZIUM_CONNECTOR: Final = "cdc-agent"
DEBEZIUM_VERSION: Final = "0.1.0"
DEBEZIUM_ROW_FIELD: Final = "$row"
_MAX_SAFE: Final = (1 << 53) - 1
_DEBEZIUM_F64: Final = struct.Struct(">d")
_json_dumps = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode


def encode_debezium_value(value: Value) -> Any:
    """The JSON-ready form of a cell value (see this section's comment)."""
    kind = type(value)
    if kind is str or value is None or kind is bool:
        return value
    if kind is int:
        return value if -_MAX_SAFE <= value <= _MAX_SAFE else {"$int64": str(value)}  # type: ignore[operator]
    if kind is float:
        if math.isfinite(value):  # type: ignore[arg-type]
            return value
        return {"$float64": _DEBEZIUM_F64.pack(value).hex()}
    if kind is bytes:
        return {"$bytes": base64.b64encode(value).decode("ascii")}  # type: ignore[arg-type]
    raise CodecError(f"cannot encode a value of type {kind.__name__}")


def decode_debezium_value(obj: Any) -> Value:
    """Inverse of ``encode_debezium_value``."""
    kind = type(obj)
    if kind in (str, bool, float) or obj is None:
        return obj  # type: ignore[no-any-return]
    if kind is int:
        return int(obj)
    if kind is dict and len(obj) == 1:
        ((tag, text),) = obj.items()
        try:
            if tag == "$int64":
                return int(text)
            if tag == "$float64" and len(text) == 16:
                return float(_DEBEZIUM_F64.unpack(bytes.fromhex(text))[0])
            if tag == "$bytes":
                return base64.b64decode(text, validate=True)
        except (ValueError, TypeError) as exc:
            raise CodecError(f"invalid {tag} value {text!r:.40}") from exc
    raise CodecError(f"not a cdc-agent JSON value: {obj!r:.80}")


def encode_debezium_key(row: RowKey) -> Any:
    if type(row) not in (str, int):
        raise CodecError(f"cannot encode a row key of type {type(row).__name__}")
    return encode_debezium_value(row)


def decode_debezium_key(obj: Any) -> RowKey:
    row = decode_debezium_value(obj)
    if type(row) not in (str, int):
        raise CodecError(f"invalid row key {obj!r:.80}")
    return row  # type: ignore[return-value]


def debezium_ts_ms(batch_id: int) -> int:
    """Milliseconds since the Unix epoch of a write batch id (32.32 fixed-point seconds)."""
    return (batch_id * 1000) >> 32


def debezium_transaction_id(domain_id: int, batch_id: int) -> str:
    return f"{domain_id}:{batch_id}"


def _debezium_image(row: Any, column: str, value: Value | Absent) -> dict[str, Any] | None:
    if value is ABSENT:
        return None
    return {DEBEZIUM_ROW_FIELD: row, column: encode_debezium_value(value)}  # type: ignore[arg-type]


def encode_debezium_event(event: ChangeEvent, *, name: str, data_collection_order: int
                 ) -> tuple[bytes, bytes]:
    """``(key, value)`` of one change event, as UTF-8 JSON."""
    row = encode_debezium_key(event.row)
    op = "c" if event.old is ABSENT else "d" if event.new is ABSENT else "u"
    ms = debezium_ts_ms(event.batch_id)
    envelope = {
        "before": _debezium_image(row, event.column, event.old),
        "after": _debezium_image(row, event.column, event.new),
        "op": op,
        "ts_ms": ms,
        "source": {
            "version": DEBEZIUM_VERSION,
            "connector": DEBEZIUM_CONNECTOR,
            "name": name,
            "ts_ms": ms,
            "snapshot": "false",
            "db": str(event.domain_id),
            "table": event.table,
            "domain": str(event.domain_id),
            "batch_id": str(event.batch_id),
            "seq": event.seq,
            "row": row,
            "column": event.column,
        },
        "transaction": {
            "id": debezium_transaction_id(event.domain_id, event.batch_id),
            "total_order": event.seq + 1,
            "data_collection_order": data_collection_order,
        },
    }
    key = {"table": event.table, "row": row, "column": event.column}
    return _json_dumps(key).encode(), _json_dumps(envelope).encode()


def decode_debezium_event(value: bytes | str) -> ChangeEvent:
    """The change event of one envelope written by ``encode_debezium_event``."""
    try:
        envelope = json.loads(value)
        source = envelope["source"]
        column = source["column"]
        before, after = envelope["before"], envelope["after"]
        return ChangeEvent(
            domain_id=int(source["domain"]),
            batch_id=int(source["batch_id"]),
            seq=int(source["seq"]),
            table=source["table"],
            row=decode_debezium_key(source["row"]),
            column=column,
            old=ABSENT if before is None else decode_debezium_value(before[column]),
            new=ABSENT if after is None else decode_debezium_value(after[column]),
        )
    # RecursionError: deep nesting; OverflowError: int() of a number JSON reads as inf
    except (ValueError, KeyError, TypeError, RecursionError, OverflowError) as exc:
        raise CodecError(f"not a cdc-agent Debezium envelope: {exc}") from exc


def debezium_transaction_records(domain_id: int, batch_id: int, event_count: int,
                        tables: Mapping[str, int]) -> list[tuple[bytes, bytes]]:
    """``(key, value)`` of the BEGIN and END transaction records of one write batch."""
    txid = debezium_transaction_id(domain_id, batch_id)
    ms = debezium_ts_ms(batch_id)
    key = _json_dumps({"id": txid}).encode()
    begin = {"status": "BEGIN", "id": txid, "ts_ms": ms, "event_count": None,
             "data_collections": None}
    end = {
        "status": "END", "id": txid, "ts_ms": ms, "event_count": event_count,
        "data_collections": [{"data_collection": table, "event_count": count}
                             for table, count in sorted(tables.items())],
    }
    return [(key, _json_dumps(begin).encode()), (key, _json_dumps(end).encode())]


# Baseline snapshots in the Debezium encoding (issue 9). Besides the chunk's own message
# (a tombstone carrying the SNAPSHOT message in a header, which cdc-agent's consumer
# verifies), each cell of the chunk is one read record, ``op`` "r", in the partition of
# its cell and after the chunk's message (so before every later event on that cell):
# key as for events, ``before`` null, ``after`` the cell's image, ``ts_ms`` the
# quiescence point's time, ``source.snapshot`` "true" ("last" on the baseline's last
# cell), ``source`` naming domain, baseline (16 hex digits), chunk index, quiescence
# point (epoch_seq, end_id as a decimal string), table, row and column; no
# ``transaction``. The header HEADER_READ "cdc-agent-read" (its value
# "<domain>:<baseline>:<index>", as in the chunk message's key) marks them: cdc-agent's
# consumer skips them, the chunk carries the same cells. ``source.read_version``
# (DEBEZIUM_READ_VERSION) versions this layout.

HEADER_READ: Final = "cdc-agent-read"
DEBEZIUM_READ_VERSION: Final = 1


def encode_debezium_read(chunk: SnapshotChunk, *, name: str) -> list[tuple[bytes, bytes]]:
    """``(key, value)`` of the op "r" record of every cell of ``chunk``, in its order."""
    point_ms = debezium_ts_ms(chunk.end_id or chunk.baseline_id)
    out = []
    cells = chunk.cells()
    for i, (table, row_key, column, value) in enumerate(cells):
        row = encode_debezium_key(row_key)
        last = chunk.last and i == len(cells) - 1
        envelope = {
            "before": None,
            "after": {DEBEZIUM_ROW_FIELD: row, column: encode_debezium_value(value)},
            "op": "r",
            "ts_ms": point_ms,
            "source": {
                "version": DEBEZIUM_VERSION,
                "connector": DEBEZIUM_CONNECTOR,
                "name": name,
                "ts_ms": point_ms,
                "snapshot": "last" if last else "true",
                "db": str(chunk.domain_id),
                "table": table,
                "domain": str(chunk.domain_id),
                "baseline": f"{chunk.baseline_id:016x}",
                "chunk": chunk.index,
                "epoch_seq": chunk.epoch_seq,
                "end_id": str(chunk.end_id),
                "read_version": DEBEZIUM_READ_VERSION,
                "row": row,
                "column": column,
            },
            "transaction": None,
        }
        key = {"table": table, "row": row, "column": column}
        out.append((_json_dumps(key).encode(), _json_dumps(envelope).encode()))
    return out


def decode_debezium_read(value: bytes | str) -> SnapshotCell:
    """The ``(table, row, column, value)`` of one op "r" record (``encode_debezium_read``)."""
    try:
        envelope = json.loads(value)
        source = envelope["source"]
        if envelope["op"] != "r" or envelope["before"] is not None:
            raise ValueError(f"op {envelope['op']!r} is not a read record")
        column = source["column"]
        return (source["table"], decode_debezium_key(source["row"]), column,
                decode_debezium_value(envelope["after"][column]))
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise CodecError(f"not a cdc-agent Debezium read record: {exc}") from exc


# The public names of the last three sections.
__all__ += [
    "DEBEZIUM_CONNECTOR",
    "DEBEZIUM_READ_VERSION",
    "DEBEZIUM_ROW_FIELD",
    "HEADER_PARTITION",
    "HEADER_READ",
    "HEADER_SNAPSHOT",
    "HEADER_WHOLE",
    "NATIVE_MAGIC",
    "NATIVE_VERSION",
    "SNAPSHOT_PARTITION",
    "Bound",
    "RawEvent",
    "RowCells",
    "SnapshotCell",
    "cell_key",
    "cells_batch",
    "debezium_transaction_id",
    "debezium_transaction_records",
    "debezium_ts_ms",
    "decode_debezium_event",
    "decode_debezium_key",
    "decode_debezium_read",
    "decode_debezium_value",
    "decode_native_event",
    "decode_snapshot",
    "encode_debezium_event",
    "encode_debezium_key",
    "encode_debezium_read",
    "encode_debezium_value",
    "encode_native_events",
    "event_keys",
    "partition_of",
    "partitions_of",
    "raw_events_batch",
    "row_order",
]


# -- epoch runs (kind 0x04; the layout lives in sinks._epochs_codec) ---------------------

from sinks._epochs_codec import (  # noqa: E402 - it needs this module's constants above
    EPOCHS_SCHEMA,
    EpochRun,
    encode_epochs,
)


def records(decoded: EventBatch | EpochRecord | SnapshotChunk | EpochRun,
            ) -> list[EventBatch | EpochRecord | SnapshotChunk]:
    """What a reader feeds on from one decoded message: an epoch run expanded into its
    ``EpochRecord``s, anything else as itself (``for r in records(decode(m))``)."""
    if type(decoded) is EpochRun:
        return decoded.records()  # type: ignore[return-value]
    return [decoded]  # type: ignore[list-item]
