"""The executor side: fetch fragments, decode record bodies through ``sinks.codec``.

These functions run inside Spark's Python workers (``mapInArrow``); they use pyarrow and
numpy only, never a SparkSession. Two passes over the same fragments:

1. ``_epoch_rows.metadata_rows``: every record that is not an EVENTS message: epoch
   records as rows (an EPOCHS run's columns as they are), a SNAPSHOT chunk as its
   header only, with the setsum its cells add up to (``_baselines.chunk_header``): its
   cells stay in the executors.
2. ``event_rows``: every event, placed in its epoch and quiescent interval with the
   epoch index the driver built from pass 1, plus one row per *segment* carrying its
   SHA3 digest and the digest's 8 setsum lanes, so Spark sums setsums as plain integers,
   and one row per cell of each chunk the driver accepted (kind ``b``: ``batch`` is the
   baseline id, ``seq`` the chunk index, ``q`` its quiescence point, ``new`` the value).

Every fragment is fetched with ``LogReader.fetch``, which checks it against the manifest
(setsum, offsets): an altered or truncated fragment fails the job, naming the file.
Ids are unsigned 64-bit; Spark has no such type, so they travel as int64 *bit views*
(the same 8 bytes): equality and grouping are exact, ordering is done here in uint64.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replay._epoch_columns import segment_digests_at
from replay.spark._source import fragment_records
from sinks.codec import SEGMENT_BITS, EventBatch, SnapshotChunk, decode
from sinks.wal3 import LogReader

__all__ = [
    "EVENT_ROWS",
    "FRAGMENTS",
    "KIND_BASELINE",
    "KIND_EVENT",
    "KIND_SEGMENT",
    "DomainEpochs",
    "EpochIndex",
    "fragment_records_of",
    "signed_bits",
    "event_rows",
]

KIND_EVENT: Final = "e"
KIND_SEGMENT: Final = "s"
KIND_BASELINE: Final = "b"
_KIND_BYTE_EVENTS: Final = 0x01  # sinks.codec: MAGIC (3) | version (1) | kind (1)
_KIND_BYTE_SNAPSHOT: Final = 0x03

FRAGMENTS: Final = pa.schema([pa.field("fragment", pa.string())])
_LANES: Final = [pa.field(f"l{i}", pa.int64()) for i in range(8)]
EVENT_ROWS: Final = pa.schema([
    pa.field("kind", pa.string()),
    pa.field("domain", pa.int64()),
    pa.field("batch", pa.int64()),
    pa.field("seq", pa.int64()),  # the event's seq; a segment's number (seq >> SEGMENT_BITS)
    pa.field("epoch", pa.int64()),  # null: past the verified log (its tail)
    pa.field("q", pa.int64()),  # the quiescence point closing the interval; null: tail
    pa.field("table", pa.string()),
    pa.field("row", pa.binary()),
    pa.field("column", pa.string()),
    pa.field("old", pa.binary()),
    pa.field("new", pa.binary()),
    pa.field("offset", pa.int64()),
    pa.field("digest", pa.binary()),
    *_LANES,
])


@dataclass(frozen=True)
class DomainEpochs:
    """One domain's verified epochs, as arrays: epoch i covers ids [ends[i-1], ends[i])
    (the first from 0); ``q[i]`` is the quiescence point closing its interval (-1: none
    yet, the epoch is in the log's tail)."""

    ends: np.ndarray  # uint64, strictly increasing
    seqs: np.ndarray  # int64
    q: np.ndarray  # int64
    floor: int = 0  # ids below were applied before (a collected log, a resumed stream)

    def locate(self, batch_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each batch id's epoch and interval (-1 where it is past the known epochs, or
        below ``floor``: a late copy of an event applied before)."""
        index = np.searchsorted(self.ends, batch_ids, side="right")
        inside = index < len(self.ends)
        if self.floor:
            inside &= batch_ids >= np.uint64(self.floor)
        safe = np.where(inside, index, 0)
        epoch = np.where(inside, self.seqs[safe] if len(self.seqs) else -1, -1)
        q = np.where(inside, self.q[safe] if len(self.q) else -1, -1)
        return epoch, q


@dataclass(frozen=True)
class EpochIndex:
    """Every domain's ``DomainEpochs`` (shipped to the executors with the function)."""

    domains: dict[int, DomainEpochs] = field(default_factory=dict)
    # (domain, baseline, index) of the SNAPSHOT chunks to replay (``_baselines``)
    chunks: frozenset[tuple[int, int, int]] = frozenset()

    def locate(self, domain_id: int, batch_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        found = self.domains.get(domain_id)
        if found is None:
            none = np.full(len(batch_ids), -1, dtype=np.int64)
            return none, none
        return found.locate(batch_ids)


def fragment_records_of(batches: Iterable[pa.RecordBatch], reader: LogReader
                        ) -> Iterator[tuple[str, list[tuple[int, bytes]]]]:
    for batch in batches:
        for text in batch.column("fragment").to_pylist():
            # a fragment, the part of one from an offset, or a checkpoint's carried
            # records (``_source.list_fragments``)
            yield text, fragment_records(text, reader)


def event_rows(uri: str, prefix: str, endpoint_url: str | None, index: EpochIndex
               ) -> Callable[[Iterable[pa.RecordBatch]], Iterable[pa.RecordBatch]]:
    """Pass 2: one row per event and one per segment, placed with ``index``."""

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        reader = LogReader(uri, prefix, endpoint_url=endpoint_url)
        for _, records in fragment_records_of(batches, reader):
            out = []
            for offset, body in records:
                chunk = _chunk(body)
                if chunk is not None:
                    if (chunk.domain_id, chunk.baseline_id, chunk.index) in index.chunks:
                        out.append(_chunk_cells(chunk, offset))
                    continue
                if len(body) < 5 or body[4] != _KIND_BYTE_EVENTS:
                    continue
                message = decode(body)
                assert isinstance(message, EventBatch)
                if message.data.num_rows:
                    out.append(_events(message.data, offset, index))
                    out.append(_segments(message.data, offset, index))
            if out:
                yield from pa.Table.from_batches(out, schema=EVENT_ROWS).to_batches()

    return run


def _chunk(body: bytes) -> SnapshotChunk | None:
    """The SNAPSHOT chunk ``body`` holds (decoded and validated), else None."""
    if len(body) < 5 or body[4] != _KIND_BYTE_SNAPSHOT:
        return None
    message = decode(body)
    return message if isinstance(message, SnapshotChunk) else None


def signed_bits(value: int) -> int:
    """The int64 bit view of a uint64 (how ids travel in Spark columns)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _chunk_cells(chunk: SnapshotChunk, offset: int) -> pa.RecordBatch:
    """One row per cell of a chunk, placed at the chunk's quiescence point."""
    data = chunk.data
    n = data.num_rows
    nothing_bin = pa.nulls(n, pa.binary())
    nothing_int = pa.nulls(n, pa.int64())
    point = pa.array(np.full(n, chunk.epoch_seq, dtype=np.int64))
    return pa.RecordBatch.from_arrays([
        pa.array([KIND_BASELINE] * n, pa.string()),
        pa.array(np.full(n, signed_bits(chunk.domain_id), dtype=np.int64)),
        pa.array(np.full(n, signed_bits(chunk.baseline_id), dtype=np.int64)),
        pa.array(np.full(n, chunk.index, dtype=np.int64)),
        point, point,
        data.column("table"), data.column("row"), data.column("column"),
        nothing_bin, data.column("value"),
        pa.array(np.full(n, offset, dtype=np.int64)),
        nothing_bin, *([nothing_int] * 8),
    ], schema=EVENT_ROWS)


def _as_int64(column: pa.Array) -> pa.Array:
    """A uint64 column's bit view as int64 (the same 8 bytes)."""
    return pa.array(column.to_numpy(zero_copy_only=False).view(np.int64), pa.int64())


def _place(domains: np.ndarray, batch_ids: np.ndarray, index: EpochIndex
           ) -> tuple[np.ndarray, np.ndarray]:
    epoch = np.empty(len(batch_ids), dtype=np.int64)
    q = np.empty(len(batch_ids), dtype=np.int64)
    for domain_id in np.unique(domains).tolist():
        mask = domains == domain_id
        e, i = index.locate(int(domain_id), batch_ids[mask])
        epoch[mask], q[mask] = e, i
    return epoch, q


def _nullable(values: np.ndarray) -> pa.Array:
    return pa.array(values, pa.int64(), mask=values < 0)


def _events(data: pa.RecordBatch, offset: int, index: EpochIndex) -> pa.RecordBatch:
    n = data.num_rows
    domains = data.column("domain_id").to_numpy()
    batch_ids = data.column("batch_id").to_numpy()
    epoch, q = _place(domains, batch_ids, index)
    nothing_bin = pa.nulls(n, pa.binary())
    nothing_int = pa.nulls(n, pa.int64())
    return pa.RecordBatch.from_arrays([
        pa.array([KIND_EVENT] * n, pa.string()),
        _as_int64(data.column("domain_id")),
        _as_int64(data.column("batch_id")),
        pc.cast(data.column("seq"), pa.int64()),
        _nullable(epoch), _nullable(q),
        data.column("table"), data.column("row"), data.column("column"),
        data.column("old"), data.column("new"),
        pa.array(np.full(n, offset, dtype=np.int64)),
        nothing_bin, *([nothing_int] * 8),
    ], schema=EVENT_ROWS)


def _segments(data: pa.RecordBatch, offset: int, index: EpochIndex) -> pa.RecordBatch:
    """One row per segment: its identity, digest and setsum lanes (sinks.codec)."""
    starts, digests = segment_digests_at(data)
    m = len(starts)
    domains = data.column("domain_id").to_numpy()[starts]
    batch_ids = data.column("batch_id").to_numpy()[starts]
    seqs = data.column("seq").to_numpy()
    lanes = np.frombuffer(digests, dtype="<u4").reshape(m, 8).astype(np.int64)
    epoch, q = _place(domains, batch_ids, index)
    nothing_str = pa.nulls(m, pa.string())
    nothing_bin = pa.nulls(m, pa.binary())
    return pa.RecordBatch.from_arrays([
        pa.array([KIND_SEGMENT] * m, pa.string()),
        pa.array(domains.view(np.int64)), pa.array(batch_ids.view(np.int64)),
        pa.array((seqs[starts] >> SEGMENT_BITS).astype(np.int64)),
        _nullable(epoch), _nullable(q),
        nothing_str, nothing_bin, nothing_str, nothing_bin, nothing_bin,
        pa.array(np.full(m, offset, dtype=np.int64)),
        pa.Array.from_buffers(pa.binary(), m, [None, pa.py_buffer(
            np.arange(0, 32 * m + 1, 32, dtype=np.int32)), pa.py_buffer(digests)]),
        *(pa.array(lanes[:, i]) for i in range(8)),
    ], schema=EVENT_ROWS)
