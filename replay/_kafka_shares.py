"""Partitions' shares of epochs checked in bulk: per-table counts and setsums of many
shares in one vectorised pass (``KafkaLog(bulk=True)``, at each ``drain``).

A share is one partition's events of one epoch, which its marker vouches for with a
count, per-table counts and a setsum (``sinks.kafka``). ``KafkaLog`` checks the count at
the marker (so it knows the epoch is complete); the rest is checked here for every share
of every epoch completed since the last drain: their event messages decoded at once into
one Arrow batch (``sinks.codec.native_events_batch``),
sorted by (partition, share, batch, seq), one ``segment_digests_at`` per partition,
lanes summed per share in numpy, table counts by one ``bincount``. The same checks as
``_kafka_log._check_partition`` does one share at a time, with the same messages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import pyarrow as pa

from replay._epoch_columns import segment_digests_at
from replay._errors import InconsistentLog
from sequencer import EpochRecord
from sinks import SETSUM_PRIMES, Setsum
from sinks.codec import CodecError, EventBatch, native_events_batch

__all__ = ["CheckedShares", "Share", "check_shares"]

Share = tuple[int, EpochRecord, list[bytes]]  # (partition, its marker's record, messages)

_PRIMES: Final = np.array(SETSUM_PRIMES, dtype=np.uint64)


@dataclass(frozen=True, slots=True)
class CheckedShares:
    """What ``check_shares`` found: ``fault`` is the index of the first share that does
    not match its marker (None: all do) and ``error`` says why; ``batch`` holds every
    share's events (rows of share i where ``share_of_row == i``)."""

    batch: pa.RecordBatch | None
    share_of_row: np.ndarray
    fault: int | None = None
    error: InconsistentLog | None = None

    def first(self, count: int) -> EventBatch:
        """The events of the shares before ``count``."""
        assert self.batch is not None
        if self.fault is None:
            return EventBatch(self.batch)
        return EventBatch(self.batch.filter(pa.array(self.share_of_row < count)))


def check_shares(shares: list[Share]) -> CheckedShares:
    """Check every share's per-table counts and setsum against its marker's record."""
    if not shares:
        return CheckedShares(None, np.zeros(0, dtype=np.int64))
    sizes = np.fromiter((len(events) for _p, _r, events in shares), dtype=np.int64,
                        count=len(shares))
    try:
        data = native_events_batch([v for _p, _r, share in shares for v in share]).data
    except CodecError:
        return _first_corrupt(shares)
    share_of = np.repeat(np.arange(len(shares), dtype=np.int64), sizes)
    partition_of = np.repeat(np.array([p for p, _r, _e in shares], dtype=np.int64), sizes)
    # Rows by (partition, share, batch, seq): each partition's segments contiguous, in
    # seq order, never running into another partition's share of the same write batch.
    order = np.lexsort((data.column(2).to_numpy(), data.column(1).to_numpy(), share_of,
                        partition_of))
    data = data.take(pa.array(order))
    share_of, partition_of = share_of[order], partition_of[order]
    faults: dict[int, InconsistentLog] = {}
    _check_tables(shares, data, share_of, faults)
    _check_setsums(shares, data, share_of, partition_of, faults)
    if not faults:
        return CheckedShares(data, share_of)
    first = min(faults)
    return CheckedShares(data, share_of, first, faults[first])


def _first_corrupt(shares: list[Share]) -> CheckedShares:
    """Some event message does not decode: the shares before the first such share are
    checked as usual, that share is the fault."""
    for i, (partition, record, values) in enumerate(shares):
        try:
            native_events_batch(values)
        except CodecError as exc:
            checked = check_shares(shares[:i])
            error = InconsistentLog(
                f"partition {partition} holds a corrupt event message of this epoch: {exc}",
                domain_id=record.domain_id, epoch_seq=record.epoch_seq)
            if checked.fault is not None:
                return checked
            return CheckedShares(checked.batch, checked.share_of_row, i, error)
    raise AssertionError("no share holds the corrupt message")  # pragma: no cover


def _check_tables(shares: list[Share], data: pa.RecordBatch, share_of: np.ndarray,
                  faults: dict[int, InconsistentLog]) -> None:
    encoded = data.column(3).dictionary_encode()
    names: list[str] = encoded.dictionary.to_pylist()
    width = len(names)
    counts = np.bincount(share_of * width + encoded.indices.to_numpy(),
                         minlength=len(shares) * width).reshape(len(shares), width)
    # Each distinct list of per-table counts once (shares of small epochs repeat a few):
    # as a row over the names found; a list naming another table, or a table with no
    # events, matches no row of counts.
    column = {name: k for k, name in enumerate(names)}
    lists = [record.table_counts for _p, record, _e in shares]
    rows: dict[tuple[tuple[str, int], ...], int] = {}
    expected: list[np.ndarray] = []
    for listed in lists:
        if listed not in rows:
            rows[listed] = len(expected)
            wanted = dict(listed)
            row = np.zeros(width, dtype=np.int64)
            if all(0 < n < 1 << 62 and name in column for name, n in wanted.items()):
                row[[column[name] for name in wanted]] = list(wanted.values())
            else:
                row[:] = -1  # no share's counts are negative: always a fault
            expected.append(row)
    which = np.fromiter(map(rows.__getitem__, lists), dtype=np.int64, count=len(lists))
    differs = (counts != np.stack(expected)[which]).any(axis=1)
    for i in np.flatnonzero(differs).tolist():
        partition, record, _events = shares[i]
        actual = {name: int(n) for name, n in zip(names, counts[i].tolist(), strict=True)
                  if n}
        if actual != dict(record.table_counts):
            faults[i] = InconsistentLog(
                f"partition {partition}: per-table counts {actual} differ from the "
                f"marker's {dict(record.table_counts)}", domain_id=record.domain_id,
                epoch_seq=record.epoch_seq)


def _check_setsums(shares: list[Share], data: pa.RecordBatch, share_of: np.ndarray,
                   partition_of: np.ndarray, faults: dict[int, InconsistentLog]) -> None:
    sums = np.zeros((len(shares), 8), dtype=np.uint64)
    cuts = np.flatnonzero(np.diff(partition_of)) + 1
    for lo, hi in zip(np.concatenate(([0], cuts)).tolist(),
                      np.concatenate((cuts, [len(partition_of)])).tolist(), strict=True):
        starts, digests = segment_digests_at(data.slice(lo, hi - lo))
        lanes = np.frombuffer(digests, dtype="<u4").reshape(-1, 8).astype(np.uint64)
        np.add.at(sums, share_of[lo + starts], lanes)
    sums %= _PRIMES
    expected = np.frombuffer(b"".join(bytes.fromhex(record.setsum) if record.setsum
                                      else bytes(32) for _p, record, _e in shares),
                             dtype="<u4").reshape(-1, 8).astype(np.uint64)
    for i in np.flatnonzero((sums != expected).any(axis=1)).tolist():
        if i in faults:
            continue  # its table counts already differ (reported first, as one at a time)
        partition, record, _events = shares[i]
        actual = Setsum(sums[i].tolist())
        faults[i] = InconsistentLog(
            f"partition {partition}: setsum of its events of this epoch is "
            f"{actual.hexdigest()}, the marker says {record.setsum or 'zero'} (an event "
            "was altered or lost)", domain_id=record.domain_id, epoch_seq=record.epoch_seq)
