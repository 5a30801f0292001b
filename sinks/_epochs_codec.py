"""Runs of epoch records (codec kind 0x04 EPOCHS, version 3): many records, one message.

An automatic write batch closes two epochs (its own and the quiescence marker), so a
busy agent publishes epoch records at the rate of its batches. Sent one message each,
their framing, encoding and hashing cost more than the batch itself; a run carries
every record a shipment produced as one Arrow record batch, one row per record, and
readers expand it back (``EpochRun.records``, ``sinks.codec.records``). The layout is
documented in ``sinks.codec``'s opening comment; everything here is reached through it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import pyarrow as pa

from sequencer import EpochRecord
from sinks._ipc import BatchReader, WrongSchema
from sinks.codec import KIND_EPOCHS, MAGIC, CodecError

__all__ = ["EPOCHS_SCHEMA", "EPOCHS_VERSION", "EpochRun", "decode_epochs", "encode_epochs"]

EPOCHS_VERSION: Final = 3  # the first codec version with kind 0x04

TABLE_COUNT: Final = pa.struct([
    pa.field("table", pa.utf8(), nullable=False),
    pa.field("count", pa.uint64(), nullable=False),
])

EPOCHS_SCHEMA: Final = pa.schema(
    [
        pa.field("domain_id", pa.uint64(), nullable=False),
        pa.field("epoch_seq", pa.uint64(), nullable=False),
        pa.field("begin_id", pa.uint64(), nullable=False),
        pa.field("end_id", pa.uint64(), nullable=False),
        pa.field("event_count", pa.uint64(), nullable=False),
        pa.field("quiescent", pa.bool_(), nullable=False),
        pa.field("stream", pa.uint32(), nullable=True),  # null: a whole log's record
        pa.field("setsum", pa.binary(32), nullable=False),
        pa.field("table_counts", pa.list_(pa.field("item", TABLE_COUNT, nullable=False)),
                 nullable=False),
    ],
    metadata={b"cdc-agent.format": str(EPOCHS_VERSION).encode()},
)
_EPOCHS_READER: Final = BatchReader(EPOCHS_SCHEMA)


@dataclass(frozen=True, slots=True)
class EpochRun:
    """Epoch records as one Arrow record batch of ``EPOCHS_SCHEMA``, in log order."""

    data: pa.RecordBatch

    def __len__(self) -> int:
        return int(self.data.num_rows)

    @classmethod
    def from_records(cls, records: Sequence[EpochRecord]) -> EpochRun:
        """The run of ``records`` (their setsums must be filled in, or empty)."""
        counts = [[{"table": t, "count": n} for t, n in r.table_counts] for r in records]
        columns = [
            [r.domain_id for r in records], [r.epoch_seq for r in records],
            [r.begin_id for r in records], [r.end_id for r in records],
            [r.event_count for r in records], [r.quiescent for r in records],
            [r.stream for r in records],
            [bytes.fromhex(r.setsum) if r.setsum else bytes(32) for r in records], counts,
        ]
        return cls(pa.RecordBatch.from_arrays(
            [pa.array(c, type=f.type) for c, f in zip(columns, EPOCHS_SCHEMA, strict=True)],
            schema=EPOCHS_SCHEMA))

    @classmethod
    def from_columns(cls, domain_id: int, columns: Sequence[Sequence[object]],
                     digests: bytes, count_offsets: np.ndarray, count_tables: pa.Array,
                     counts: np.ndarray) -> EpochRun:
        """The shipper's way, with no Python step per record: see ``build_run``."""
        return build_run(domain_id, columns, digests, count_offsets, count_tables, counts)

    def records(self) -> list[EpochRecord]:
        """One ``EpochRecord`` per row, in order (what a reader feeds on)."""
        data = self.data
        simple = [data.column(i).to_pylist() for i in range(7)]
        digests = data.column(7)
        body = digests.buffers()[1]
        raw = (bytes(body)[digests.offset * 32: (digests.offset + len(digests)) * 32]
               if body is not None else b"")
        counts = data.column(8).to_pylist()
        return [
            EpochRecord(dom, seq, begin, end, n, quiet,
                        tuple((c["table"], c["count"]) for c in tables),
                        raw[32 * k: 32 * k + 32].hex(), stream)
            for k, (dom, seq, begin, end, n, quiet, stream, tables) in enumerate(
                zip(*simple, counts, strict=True))
        ]


def encode_epochs(run: EpochRun) -> bytes:
    """One EPOCHS message holding ``run``'s records."""
    if not run.data.schema.equals(EPOCHS_SCHEMA):
        raise CodecError(f"an epoch run must have EPOCHS_SCHEMA, got {run.data.schema}")
    sink = pa.BufferOutputStream()
    sink.write(MAGIC + bytes((EPOCHS_VERSION, KIND_EPOCHS)))
    with pa.ipc.new_stream(sink, EPOCHS_SCHEMA) as writer:
        writer.write_batch(run.data)
    return bytes(sink.getvalue().to_pybytes())


def decode_epochs(payload: memoryview) -> EpochRun:
    """Read and fully validate an EPOCHS payload (untrusted bytes)."""
    try:
        data = _EPOCHS_READER.read(payload)
        _check_nulls(data)
    except WrongSchema as exc:
        raise CodecError(f"EPOCHS payload has schema {exc.found}, not EPOCHS_SCHEMA"
                         ) from None
    except (pa.ArrowException, OSError, ValueError) as exc:  # CodecError is a ValueError
        if isinstance(exc, CodecError):
            raise
        raise CodecError(f"corrupt EPOCHS payload: {type(exc).__name__}: {exc}") from exc
    return EpochRun(data)


def _check_nulls(data: pa.RecordBatch) -> None:
    """Refuse nulls where the schema says none (Arrow's reader does not enforce it)."""
    for i, name in enumerate(data.schema.names):
        if name != "stream" and data.column(i).null_count:
            raise CodecError(f"EPOCHS column {name!r} holds nulls")
    items = data.column(8).flatten()
    if items.null_count or any(items.field(i).null_count for i in range(2)):
        raise CodecError("EPOCHS column 'table_counts' holds nulls")


def build_run(domain_id: int, columns: Sequence[Sequence[object]], digests: bytes,
              count_offsets: np.ndarray, count_tables: pa.Array,
              counts: np.ndarray) -> EpochRun:
    """A run from the shipper's columns, with no Python step per record.

    ``columns`` are the records' ``epoch_seq, begin_id, end_id, event_count,
    quiescent`` (``EpochClosed``'s fields, transposed); ``digests`` their setsum
    digests (32 bytes each); record k's per-table counts are
    ``count_tables[count_offsets[k]:count_offsets[k + 1]]``, with ``counts`` alike.
    """
    seqs, begins, ends, events, quiet = columns
    n = len(seqs)
    u64 = pa.uint64()
    list_type = EPOCHS_SCHEMA.field("table_counts").type
    arrays = [
        pa.array(np.full(n, domain_id, dtype=np.uint64)),
        pa.array(seqs, u64), pa.array(begins, u64), pa.array(ends, u64),
        pa.array(events, u64), pa.array(quiet, pa.bool_()), pa.nulls(n, pa.uint32()),
        pa.FixedSizeBinaryArray.from_buffers(pa.binary(32), n,
                                             [None, pa.py_buffer(digests)]),
        pa.ListArray.from_arrays(
            pa.array(count_offsets.astype(np.int32)),
            pa.StructArray.from_arrays([count_tables, pa.array(counts, u64)],
                                       fields=list(TABLE_COUNT)), type=list_type),
    ]
    return EpochRun(pa.RecordBatch.from_arrays(arrays, schema=EPOCHS_SCHEMA))
