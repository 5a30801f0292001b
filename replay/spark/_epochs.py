"""The driver side of epochs: decode the records pass 1 found, check how they tile.

Epoch records are few (one per epoch, however many events it holds), so they come to
the driver: it drops duplicated records, refuses two different records for one epoch,
checks that each domain's epochs tile the id space from 0 with no gap, and numbers the
quiescent intervals. The result, ``EpochTable``, is shipped to the executors to place
each event (``_decode.EpochIndex``) and becomes small DataFrames the checks join on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from replay._errors import InconsistentLog
from replay._position import Position
from replay.spark._baselines import ChunkHeader
from replay.spark._decode import DomainEpochs, EpochIndex
from sequencer import EpochRecord
from sinks.codec import CodecError, decode
from sinks.codec import records as expand

__all__ = ["EpochTable", "UnsupportedRecord", "build_epoch_table"]


class UnsupportedRecord(ValueError):
    """A record kind replay.spark does not handle (yet): it refuses rather than skip it."""


@dataclass(frozen=True)
class EpochTable:
    """Each domain's verified prefix of epochs (seq 1.., tiling from id 0; on a collected
    log or a resumed stream, from the start point's seq and end id: ``floors``)."""

    epochs: dict[int, list[EpochRecord]]  # domain -> its epochs 1..k, in order
    intervals: dict[int, list[EpochRecord]]  # domain -> its quiescence points, in order
    floors: dict[int, int] = field(default_factory=dict)  # domain -> its first id read

    def index(self, chunks: frozenset[tuple[int, int, int]] = frozenset()) -> EpochIndex:
        domains = {}
        for domain_id, epochs in self.epochs.items():
            q = np.full(len(epochs), -1, dtype=np.int64)
            closing = -1
            for i in range(len(epochs) - 1, -1, -1):
                if epochs[i].quiescent:
                    closing = epochs[i].epoch_seq
                q[i] = closing
            domains[domain_id] = DomainEpochs(
                np.array([r.end_id for r in epochs], dtype=np.uint64),
                np.array([r.epoch_seq for r in epochs], dtype=np.int64), q,
                self.floors.get(domain_id, 0))
        return EpochIndex(domains, chunks)

    def position(self, domain_id: int, epoch_seq: int) -> Position:
        """The position token of quiescence point ``epoch_seq`` of ``domain_id``."""
        for record in self.intervals.get(domain_id, []):
            if record.epoch_seq == epoch_seq:
                return Position(domain_id, epoch_seq, record.end_id)
        raise ValueError(
            f"epoch {epoch_seq} of domain {domain_id:016x} is not a quiescence point of "
            "this log (see verify() for the points it has)")

    def last_positions(self) -> list[Position]:
        return [Position(d, points[-1].epoch_seq, points[-1].end_id)
                for d, points in sorted(self.intervals.items()) if points]


def decode_metadata(rows: Iterable[tuple[int, bytes | None, str | None]],
                    offsets: dict[tuple[int, int], int] | None = None
                    ) -> tuple[list[EpochRecord], list[ChunkHeader]]:
    """Decode pass 1's bodies and chunk headers; refuse a record kind this reader does
    not handle. ``offsets`` gets the offset of each quiescence point's first record
    ((domain, epoch) -> offset: where a stream resumes, ``_stream``)."""
    records = []
    chunks = []
    for offset, body, chunk in rows:
        if chunk is not None:
            chunks.append(ChunkHeader.parse(chunk))
            continue
        assert body is not None
        try:
            decoded = decode(body)
        except CodecError as exc:
            raise UnsupportedRecord(
                f"record at offset {offset} of the log: {exc}; replay.spark handles "
                "events, epoch records and snapshot chunks only (upgrade cdc-agent to "
                "read this log)") from exc
        for record in expand(decoded):  # a run of epoch records: each one
            if not isinstance(record, EpochRecord):
                raise UnsupportedRecord(
                    f"record at offset {offset} of the log is a {type(record).__name__}; "
                    "replay.spark handles events, epoch records and snapshot chunks only "
                    "(checkpoints are not supported yet)")
            records.append(record)
            if offsets is not None and record.quiescent:
                offsets.setdefault((record.domain_id, record.epoch_seq), offset)
    return records, chunks


def build_epoch_table(records: Iterable[EpochRecord],
                      starts: Mapping[int, Position] | None = None,
                      retained: Mapping[int, list[EpochRecord]] | None = None) -> EpochTable:
    """Deduplicate, check tiling and gaps per domain, number the intervals.

    ``starts``: on a collected log, where each domain's epochs resume (the newest
    retained point's frontier); ``retained``: the quiescence points the checkpoint and
    stripes stand for, listed before the log's own (``_checkpoint``)."""
    starts = starts or {}
    by_domain: dict[int, dict[int, EpochRecord]] = {d: {} for d in starts}
    for record in records:
        start = starts.get(record.domain_id)
        if start is not None and record.epoch_seq <= start.epoch_seq:
            continue  # a late copy of a compacted epoch
        held = by_domain.setdefault(record.domain_id, {})
        known = held.get(record.epoch_seq)
        if known is not None and known != record:
            raise InconsistentLog(f"two different records for one epoch: {known} and {record}",
                                  domain_id=record.domain_id, epoch_seq=record.epoch_seq)
        held[record.epoch_seq] = record
    epochs: dict[int, list[EpochRecord]] = {}
    intervals: dict[int, list[EpochRecord]] = {}
    for domain_id, held in sorted(by_domain.items()):
        prefix: list[EpochRecord] = []
        start = starts.get(domain_id)
        base = 0 if start is None else start.epoch_seq
        begin = 0 if start is None else start.end_id
        while (following := held.get(base + len(prefix) + 1)) is not None:
            if following.begin_id != begin:
                raise InconsistentLog(
                    f"epoch begins at id {following.begin_id:#x}, but the previous one ended "
                    f"at {begin:#x}: epochs must tile the id space",
                    domain_id=domain_id, epoch_seq=following.epoch_seq)
            prefix.append(following)
            begin = following.end_id
        beyond = [r.epoch_seq for r in held.values()
                  if r.epoch_seq > base + len(prefix) and r.quiescent]
        if beyond:
            missing = base + len(prefix) + 1
            raise InconsistentLog(
                f"epoch {missing} never arrived, but quiescence point {min(beyond)} after "
                "it did", domain_id=domain_id, epoch_seq=missing)
        epochs[domain_id] = prefix
        intervals[domain_id] = [*(retained or {}).get(domain_id, []),
                                *(r for r in prefix if r.quiescent)]
    return EpochTable(epochs, intervals, {d: p.end_id for d, p in starts.items()})
