"""Epoch records as rows, in the executors: pass 1's output, and each epoch's interval.

A log holds one epoch record per epoch (about one per write batch), so a log of
millions of events holds hundreds of thousands of them. They stay columns from the
message to Spark: an EPOCHS run's Arrow columns become rows as they are, with no
Python object per record. The driver collects only what it checks (domain, epoch, ids,
quiescent, a fingerprint: ``_epochs.EpochColumns``); what the verification compares
(counts, per-table counts, setsum lanes) stays in Spark and meets the driver's epoch
index in ``place_epochs``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Final

import numpy as np
import pyarrow as pa

from replay.spark._baselines import chunk_header
from replay.spark._decode import EpochIndex, fragment_records_of, signed_bits
from sequencer import EpochRecord
from sinks.codec import CodecError, EpochRun, SnapshotChunk, decode
from sinks.wal3 import LogReader

__all__ = [
    "EPOCH_FIELDS",
    "METADATA_ROWS",
    "PLACED_EPOCHS",
    "metadata_batch",
    "metadata_rows",
    "place_epochs",
    "record_rows",
    "rows_to_records",
]

_TABLE_COUNTS: Final = pa.list_(pa.struct([pa.field("table", pa.string()),
                                           pa.field("events", pa.int64())]))
_LANE_FIELDS: Final = [pa.field(f"e{i}", pa.int64()) for i in range(8)]
# The record's own fields (ids as int64 bit views), what its fingerprint covers.
EPOCH_FIELDS: Final = ["domain", "epoch", "begin_id", "end_id", "quiescent", "events",
                       "stream", "setsum", "tables"]
METADATA_ROWS: Final = pa.schema([
    pa.field("offset", pa.int64()),
    pa.field("chunk", pa.string()),  # a SNAPSHOT chunk's header (JSON), else null
    pa.field("problem", pa.string()),  # a record this reader refuses: why; else null
    pa.field("domain", pa.int64()),
    pa.field("epoch", pa.int64()),
    pa.field("begin_id", pa.int64()),
    pa.field("end_id", pa.int64()),
    pa.field("quiescent", pa.bool_()),
    pa.field("events", pa.int64()),
    pa.field("stream", pa.int64()),
    pa.field("setsum", pa.binary()),
    pa.field("tables", _TABLE_COUNTS),  # as the record lists them
    *_LANE_FIELDS,  # the setsum's 8 little-endian 32-bit lanes (-1: not 32 bytes)
])
PLACED_EPOCHS: Final = pa.schema([pa.field("q", pa.int64()), *METADATA_ROWS])

_KIND_BYTE_EVENTS: Final = 0x01  # sinks.codec: MAGIC (3) | version (1) | kind (1)
_KIND_BYTE_SNAPSHOT: Final = 0x03
_SUPPORTED: Final = "replay.spark handles events, epoch records and snapshot chunks only"


def _lanes(digest: bytes) -> list[int]:
    return list(struct.unpack("<8I", digest)) if len(digest) == 32 else [-1] * 8


def _as_int64(column: pa.Array) -> pa.Array:
    """A uint64 (or narrower) column as int64: the bit view, no range check."""
    return column.cast(pa.int64(), safe=False)


def _run_batch(offset: int, run: EpochRun) -> pa.RecordBatch:
    """An EPOCHS run's records as rows, straight from its columns."""
    data = run.data
    n = len(run)
    digests = data.column("setsum")
    body = digests.buffers()[1]
    raw = np.frombuffer(body, dtype="<u4", count=(digests.offset + n) * 8) if n else (
        np.zeros(0, dtype="<u4"))
    lanes = raw[digests.offset * 8:].reshape(n, 8).astype(np.int64)
    counts = data.column("table_counts")
    items = counts.values
    tables = pa.ListArray.from_arrays(counts.offsets, pa.StructArray.from_arrays(
        [items.field("table").cast(pa.string()), _as_int64(items.field("count"))],
        names=["table", "events"]))
    nulls = pa.nulls(n, pa.string())
    return pa.RecordBatch.from_arrays([
        pa.array(np.full(n, offset, dtype=np.int64)), nulls, nulls,
        _as_int64(data.column("domain_id")), _as_int64(data.column("epoch_seq")),
        _as_int64(data.column("begin_id")), _as_int64(data.column("end_id")),
        data.column("quiescent"), _as_int64(data.column("event_count")),
        data.column("stream").cast(pa.int64()), digests.cast(pa.binary()), tables,
        *(pa.array(lanes[:, i]) for i in range(8)),
    ], schema=METADATA_ROWS)


class _Rows:
    """Single rows (chunks, refused records, lone epoch records) gathered as lists."""

    def __init__(self) -> None:
        self.columns: dict[str, list[object]] = {f.name: [] for f in METADATA_ROWS}

    def add(self, offset: int, *, chunk: str | None = None, problem: str | None = None,
            record: EpochRecord | None = None) -> None:
        c = self.columns
        c["offset"].append(offset)
        c["chunk"].append(chunk)
        c["problem"].append(problem)
        if record is None:
            for name in ("domain", "epoch", "begin_id", "end_id", "quiescent", "events",
                         "stream", "setsum", "tables", *(f"e{i}" for i in range(8))):
                c[name].append(None)
            return
        digest = bytes.fromhex(record.setsum) if record.setsum else bytes(32)  # as the codec
        for name, value in (("domain", record.domain_id), ("epoch", record.epoch_seq),
                            ("begin_id", record.begin_id), ("end_id", record.end_id),
                            ("events", record.event_count)):
            c[name].append(signed_bits(value))
        c["quiescent"].append(record.quiescent)
        c["stream"].append(record.stream)
        c["setsum"].append(digest)
        c["tables"].append([{"table": t, "events": signed_bits(n)}
                            for t, n in record.table_counts])
        for i, lane in enumerate(_lanes(digest)):
            c[f"e{i}"].append(lane)

    def batch(self) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays(
            [pa.array(self.columns[f.name], f.type) for f in METADATA_ROWS],
            schema=METADATA_ROWS)


def metadata_batch(records: Iterable[tuple[int, bytes]]) -> list[pa.RecordBatch]:
    """Pass 1 for one fragment's records: a row per epoch record (runs expanded as
    columns), per SNAPSHOT chunk (its header only: its cells stay in the executors)
    and per record this reader refuses (``problem`` says why; the driver raises it)."""
    singles = _Rows()
    out = []
    for offset, body in records:
        if len(body) >= 5 and body[4] == _KIND_BYTE_EVENTS:
            continue
        try:
            decoded = decode(body)
        except CodecError as exc:
            if body[4:5] == bytes((_KIND_BYTE_SNAPSHOT,)):
                raise  # a damaged chunk: the job fails with the codec's error
            singles.add(offset, problem=f"record at offset {offset} of the log: {exc}; "
                        f"{_SUPPORTED} (upgrade cdc-agent to read this log)")
            continue
        if isinstance(decoded, EpochRun):
            out.append(_run_batch(offset, decoded))
        elif isinstance(decoded, EpochRecord):
            singles.add(offset, record=decoded)
        elif isinstance(decoded, SnapshotChunk):
            singles.add(offset, chunk=chunk_header(decoded))
        else:
            singles.add(offset, problem=(
                f"record at offset {offset} of the log is a {type(decoded).__name__}; "
                f"{_SUPPORTED} (checkpoints are not supported yet)"))
    if singles.columns["offset"]:
        out.append(singles.batch())
    return out


def metadata_rows(uri: str, prefix: str, endpoint_url: str | None
                  ) -> Callable[[Iterable[pa.RecordBatch]], Iterable[pa.RecordBatch]]:
    """Pass 1 over fragments (``FRAGMENTS`` rows): ``metadata_batch`` of each."""

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        reader = LogReader(uri, prefix, endpoint_url=endpoint_url)
        for _, records in fragment_records_of(batches, reader):
            yield from metadata_batch(records)

    return run


def record_rows(records: Sequence[EpochRecord]) -> pa.Table:
    """Epoch records made on the driver (a topic's vouched records) as pass 1's rows."""
    rows = _Rows()
    for record in records:
        rows.add(-1, record=record)
    return pa.Table.from_batches([rows.batch()])


def rows_to_records(table: pa.Table) -> list[EpochRecord]:
    """Rows of ``METADATA_ROWS`` back as records (to name them in an error)."""
    def unsigned(v: int) -> int:
        return v % (1 << 64)

    return [EpochRecord(unsigned(r["domain"]), r["epoch"], unsigned(r["begin_id"]),
                        unsigned(r["end_id"]), unsigned(r["events"]), r["quiescent"],
                        tuple((t["table"], unsigned(t["events"])) for t in r["tables"]),
                        r["setsum"].hex(), r["stream"])
            for r in table.to_pylist() if r["domain"] is not None]


def place_epochs(index: EpochIndex) -> Callable[[Iterable[pa.RecordBatch]],
                                                 Iterator[pa.RecordBatch]]:
    """Each epoch record's quiescent interval (``q``) from the driver's index; records
    outside the verified prefix, or in its tail (no point closes them yet), are left
    out: only complete intervals are checked."""

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            domains = batch.column("domain").to_numpy(zero_copy_only=False).view(np.uint64)
            epochs = batch.column("epoch").to_numpy(zero_copy_only=False)
            q = np.full(len(batch), -1, dtype=np.int64)
            for domain_id in np.unique(domains).tolist():
                known = index.domains.get(domain_id)
                if known is None or not len(known.seqs):
                    continue
                mine = np.flatnonzero(domains == np.uint64(domain_id))
                at = epochs[mine] - known.seqs[0]  # the prefix's seqs are consecutive
                inside = (at >= 0) & (at < len(known.seqs))
                q[mine[inside]] = known.q[at[inside]]
            keep = np.flatnonzero(q >= 0)
            if len(keep):
                yield pa.RecordBatch.from_arrays(
                    [pa.array(q[keep]), *batch.take(pa.array(keep)).columns],
                    schema=PLACED_EPOCHS)

    return run
