"""The driver side of epochs: check how the records pass 1 found tile, as columns.

There is one epoch record per epoch (about one per write batch): hundreds of thousands
in a log of millions of events. The driver gets only the columns it checks
(``EpochColumns``: domain, epoch, ids, quiescent, and a fingerprint of the whole record)
as numpy arrays, never a Python object per record. It drops duplicated records, refuses
two different records for one epoch, checks that each domain's epochs tile the id space
from 0 with no gap, and numbers the quiescent intervals. The result, ``EpochTable``, is
shipped to the executors to place each event and epoch record (``_decode.EpochIndex``);
what the verification compares (counts, setsums) never leaves Spark (``_epoch_rows``).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from replay._errors import InconsistentLog
from replay._position import Position
from replay.spark._baselines import ChunkHeader
from replay.spark._decode import DomainEpochs, EpochIndex
from sequencer import EpochRecord

__all__ = ["EpochColumns", "EpochTable", "Points", "Prefix", "UnsupportedRecord",
           "build_epoch_table", "read_metadata"]


class UnsupportedRecord(ValueError):
    """A record kind replay.spark does not handle (yet): it refuses rather than skip it."""


Describe = Callable[[int, int], str]  # (domain, epoch) -> its different records, named


@dataclass(frozen=True, eq=False)
class EpochColumns:
    """Epoch records as the driver checks them, in log order: one entry per copy.

    ``fingerprint``: equal for equal records (a hash of every field); ``describe``
    names the records of one epoch when two differ (fetched only then)."""

    domain: np.ndarray  # uint64
    epoch: np.ndarray  # int64
    begin: np.ndarray  # uint64
    end: np.ndarray  # uint64
    quiescent: np.ndarray  # bool
    fingerprint: np.ndarray  # int64
    offset: np.ndarray  # int64: the record's offset in the log (-1: not from a log)
    describe: Describe

    @classmethod
    def from_records(cls, records: Sequence[EpochRecord]) -> EpochColumns:
        """Records decoded on the driver (a topic's vouched records, tests)."""
        ids = {r: i for i, r in enumerate(dict.fromkeys(records))}

        def describe(domain_id: int, epoch_seq: int) -> str:
            found = dict.fromkeys(r for r in records
                                  if (r.domain_id, r.epoch_seq) == (domain_id, epoch_seq))
            return " and ".join(map(str, found))

        for r in records:
            if r.epoch_seq >= 1 << 63:
                raise _epoch_out_of_range(r.domain_id, r.epoch_seq, "a record")
        return cls(np.array([r.domain_id for r in records], dtype=np.uint64),
                   np.array([r.epoch_seq for r in records], dtype=np.int64),
                   np.array([r.begin_id for r in records], dtype=np.uint64),
                   np.array([r.end_id for r in records], dtype=np.uint64),
                   np.array([r.quiescent for r in records], dtype=bool),
                   np.array([ids[r] for r in records], dtype=np.int64),
                   np.full(len(records), -1, dtype=np.int64), describe)

    def quiescent_offsets(self) -> PointOffsets:
        """The offset of each quiescence point's first record (where a stream resumes)."""
        quiet = np.flatnonzero(self.quiescent)
        order = quiet[np.lexsort((self.offset[quiet], self.epoch[quiet],
                                  self.domain[quiet]))]
        key_d, key_e = self.domain[order], self.epoch[order]
        first = np.ones(len(order), dtype=bool)
        first[1:] = (key_d[1:] != key_d[:-1]) | (key_e[1:] != key_e[:-1])
        return PointOffsets(key_d[first], key_e[first], self.offset[order][first])


@dataclass(frozen=True, eq=False)
class PointOffsets:
    """(domain, epoch) -> offset, as sorted arrays (``get`` like a dict's)."""

    domain: np.ndarray  # uint64, sorted with epoch
    epoch: np.ndarray  # int64
    offset: np.ndarray  # int64

    def get(self, key: tuple[int, int]) -> int | None:
        lo = int(np.searchsorted(self.domain, np.uint64(key[0]), side="left"))
        hi = int(np.searchsorted(self.domain, np.uint64(key[0]), side="right"))
        at = lo + int(np.searchsorted(self.epoch[lo:hi], key[1]))
        if at < hi and int(self.epoch[at]) == key[1]:
            return int(self.offset[at])
        return None


def read_metadata(table: pa.Table, describe: Describe
                  ) -> tuple[EpochColumns, list[ChunkHeader]]:
    """Pass 1's rows as collected (``_epoch_rows.METADATA_ROWS``' offset, chunk,
    problem, domain, epoch, begin_id, end_id, quiescent and a ``fingerprint``): the
    first refused record (by offset) raises ``UnsupportedRecord``."""
    table = table.sort_by("offset")
    problems = table.column("problem")
    if problems.null_count < len(table):
        raise UnsupportedRecord(next(p for p in problems.to_pylist() if p is not None))
    chunk = table.column("chunk")
    chunks = [ChunkHeader.parse(c) for c in chunk.drop_null().to_pylist()]
    records = table.filter(chunk.is_null())

    def column(name: str, dtype: type) -> np.ndarray:
        return np.asarray(records.column(name).to_numpy(), dtype=dtype)

    epochs = column("epoch", np.int64)
    wrapped = np.flatnonzero(epochs < 0)  # an epoch seq past 2**63, as an int64
    if len(wrapped):
        i = int(wrapped[0])
        raise _epoch_out_of_range(
            int(column("domain", np.int64).view(np.uint64)[i]),
            int(epochs[i:i + 1].view(np.uint64)[0]),
            f"the record at offset {int(column('offset', np.int64)[i])} of the log")
    return EpochColumns(
        column("domain", np.int64).view(np.uint64), epochs,
        column("begin_id", np.int64).view(np.uint64), column("end_id", np.int64).view(
            np.uint64), column("quiescent", bool), column("fingerprint", np.int64),
        column("offset", np.int64), describe), chunks


def _epoch_out_of_range(domain_id: int, epoch_seq: int, where: str) -> InconsistentLog:
    return InconsistentLog(f"{where} numbers its epoch {epoch_seq}, past 2**63: no writer "
                           "gets there (a damaged or foreign record)",
                           domain_id=domain_id, epoch_seq=epoch_seq)


@dataclass(frozen=True, eq=False)
class Prefix:
    """One domain's verified epochs, in order (seqs consecutive)."""

    seqs: np.ndarray  # int64
    ends: np.ndarray  # uint64
    quiescent: np.ndarray  # bool

    def __len__(self) -> int:
        return len(self.seqs)

    def last_seq(self) -> int:
        return int(self.seqs[-1]) if len(self.seqs) else 0


@dataclass(frozen=True, eq=False)
class Points:
    """One domain's quiescence points, in order: where its intervals end."""

    domain_id: int
    seqs: np.ndarray  # int64, increasing
    ends: np.ndarray  # uint64

    def __len__(self) -> int:
        return len(self.seqs)

    def __iter__(self) -> Iterator[Position]:
        for seq, end in zip(self.seqs.tolist(), self.ends.tolist(), strict=True):
            yield Position(self.domain_id, seq, end)

    def find(self, epoch_seq: int) -> Position | None:
        at = bisect.bisect_left(self.seqs, epoch_seq)
        if at < len(self.seqs) and int(self.seqs[at]) == epoch_seq:
            return Position(self.domain_id, epoch_seq, int(self.ends[at]))
        return None

    def last_before(self, epoch_seq: int) -> int | None:
        """The last point before ``epoch_seq``."""
        at = int(np.searchsorted(self.seqs, epoch_seq, side="left"))
        return int(self.seqs[at - 1]) if at else None


@dataclass(frozen=True)
class EpochTable:
    """Each domain's verified prefix of epochs (seq 1.., tiling from id 0; on a collected
    log or a resumed stream, from the start point's seq and end id: ``floors``)."""

    epochs: dict[int, Prefix]  # domain -> its epochs 1..k, in order
    intervals: dict[int, Points]  # domain -> its quiescence points, in order
    floors: dict[int, int] = field(default_factory=dict)  # domain -> its first id read
    copies: bool = False  # some epoch came more than once (identical copies)

    def index(self, chunks: frozenset[tuple[int, int, int]] = frozenset()) -> EpochIndex:
        domains = {}
        for domain_id, prefix in self.epochs.items():
            # each epoch's interval: the first quiescent epoch at or after it (-1: none)
            closing = np.where(prefix.quiescent, prefix.seqs, np.iinfo(np.int64).max)
            q = np.minimum.accumulate(closing[::-1])[::-1]
            q[q == np.iinfo(np.int64).max] = -1
            domains[domain_id] = DomainEpochs(prefix.ends, prefix.seqs, q,
                                              self.floors.get(domain_id, 0))
        return EpochIndex(domains, chunks)

    def position(self, domain_id: int, epoch_seq: int) -> Position:
        """The position token of quiescence point ``epoch_seq`` of ``domain_id``."""
        points = self.intervals.get(domain_id)
        found = None if points is None else points.find(epoch_seq)
        if found is None:
            raise ValueError(
                f"epoch {epoch_seq} of domain {domain_id:016x} is not a quiescence point of "
                "this log (see verify() for the points it has)")
        return found

    def last_positions(self) -> list[Position]:
        return [Position(d, int(p.seqs[-1]), int(p.ends[-1]))
                for d, p in sorted(self.intervals.items()) if len(p)]


def _points(domain_id: int, positions: Sequence[Position], prefix: Prefix) -> Points:
    seqs = np.concatenate([np.array([p.epoch_seq for p in positions], dtype=np.int64),
                           prefix.seqs[prefix.quiescent]])
    ends = np.concatenate([np.array([p.end_id for p in positions], dtype=np.uint64),
                           prefix.ends[prefix.quiescent]])
    return Points(domain_id, seqs, ends)


def build_epoch_table(columns: EpochColumns,
                      starts: Mapping[int, Position] | None = None,
                      retained: Mapping[int, Sequence[Position]] | None = None) -> EpochTable:
    """Deduplicate, check tiling and gaps per domain, number the intervals.

    ``starts``: on a collected log, where each domain's epochs resume (the newest
    retained point's frontier); ``retained``: the quiescence points the checkpoint and
    stripes stand for, listed before the log's own (``_checkpoint``)."""
    starts = starts or {}
    retained = retained or {}
    c = columns
    # Each domain's records after its start, sorted by epoch (copies in log order): one
    # sort for all domains, then split where the domain changes.
    order = np.lexsort((np.arange(len(c.domain)), c.epoch, c.domain))
    cuts = np.flatnonzero(c.domain[order][1:] != c.domain[order][:-1]) + 1
    found = {int(c.domain[part[0]]): part for part in np.split(order, cuts) if len(part)}
    rows: dict[int, np.ndarray] = {}
    conflicts = []
    for domain_id in sorted({*starts, *found}):
        start = starts.get(domain_id)
        base = 0 if start is None else start.epoch_seq
        mine = found.get(domain_id, np.zeros(0, dtype=np.int64))
        mine = mine[c.epoch[mine] > base]
        rows[domain_id] = mine
        seq = c.epoch[mine]
        first = np.ones(len(mine), dtype=bool)
        first[1:] = seq[1:] != seq[:-1]
        first_copy = mine[np.maximum.accumulate(np.where(first, np.arange(len(mine)), 0))]
        conflicts.extend(mine[c.fingerprint[mine] != c.fingerprint[first_copy]].tolist())
    if conflicts:  # as a reader meets them: the first copy that differs, in log order
        at = min(conflicts)
        domain_id, epoch_seq = int(c.domain[at]), int(c.epoch[at])
        raise InconsistentLog(
            f"two different records for one epoch: {c.describe(domain_id, epoch_seq)}",
            domain_id=domain_id, epoch_seq=epoch_seq)
    epochs: dict[int, Prefix] = {}
    intervals: dict[int, Points] = {}
    copies = False
    for domain_id, mine in rows.items():
        start = starts.get(domain_id)
        base = 0 if start is None else start.epoch_seq
        seq = c.epoch[mine]
        again = np.flatnonzero(seq[1:] == seq[:-1]) + 1  # later (identical) copies
        copies = copies or bool(len(again))
        mine = np.delete(mine, again)
        seq = c.epoch[mine]
        gap = np.flatnonzero(seq != base + 1 + np.arange(len(seq)))
        length = int(gap[0]) if len(gap) else len(seq)
        held, after = mine[:length], mine[length:]
        begins, ends = c.begin[held], c.end[held]
        previous = np.concatenate([np.array([0 if start is None else start.end_id],
                                            dtype=np.uint64), ends[:-1]])
        torn = np.flatnonzero(begins != previous)
        if len(torn):
            i = int(torn[0])
            raise InconsistentLog(
                f"epoch begins at id {int(begins[i]):#x}, but the previous one ended at "
                f"{int(previous[i]):#x}: epochs must tile the id space",
                domain_id=domain_id, epoch_seq=int(seq[i]))
        beyond = c.epoch[after][c.quiescent[after]]
        if len(beyond):
            raise InconsistentLog(
                f"epoch {base + length + 1} never arrived, but quiescence point "
                f"{int(beyond.min())} after it did", domain_id=domain_id,
                epoch_seq=base + length + 1)
        prefix = Prefix(c.epoch[held], ends, c.quiescent[held])
        epochs[domain_id] = prefix
        intervals[domain_id] = _points(domain_id, retained.get(domain_id, ()), prefix)
    return EpochTable(epochs, intervals, {d: p.end_id for d, p in starts.items()}, copies)
