"""Per-partition epoch records: what each partition received of each epoch (pure, no I/O).

Every epoch record goes to every partition, carrying that partition's share of the
epoch: its event count, per-table counts and setsum, with ``stream`` set to the
partition. The setsum of a partition is the ``Setsum`` of its segments' digests, where
a segment is the events of one write batch in one partition whose ``seq >> SEGMENT_BITS``
agree, in seq order (``sinks.codec.segment_digests`` on the partition's share of one
shipment). A consumer rebuilds the same items from the partition's events alone.

Events arrive before the epoch that covers them is known (two epochs may be open), so
the tally is kept per write batch and summed when an epoch record covers the batch.
"""

from __future__ import annotations

import heapq
import struct
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from sequencer import EpochRecord
from sinks._setsum import Setsum
from sinks.kafka._digests import partition_segment_digests

__all__ = ["BatchTotal", "PartitionTally", "partition_records"]

_RING = 1 << 64
_VECTOR_ROWS = 64
_LANES = struct.Struct("<8I")


class BatchTotal(NamedTuple):
    """All the events of one write batch, over every partition."""

    domain_id: int
    batch_id: int
    event_count: int
    tables: dict[str, int]


@dataclass(slots=True)
class _Share:
    """One write batch's events in one partition."""

    count: int = 0
    tables: Counter[str] = field(default_factory=Counter)
    digests: list[bytes] = field(default_factory=list)


class PartitionTally:
    """Counts and segment digests per (domain, write batch, partition), until an epoch closes."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self._open: dict[tuple[int, int], dict[int, _Share]] = {}
        # Per domain, the open batch ids in a heap ordered on the id ring (relative to a
        # base), so closing an epoch costs O(k log n) however many batches wait behind it.
        self._heaps: dict[int, tuple[int, list[int]]] = {}

    def __len__(self) -> int:
        """How many write batches are waiting for their epoch record."""
        return len(self._open)

    def add(self, data: pa.RecordBatch, parts: np.ndarray) -> None:
        """Account for ``data``'s events, event i going to partition ``parts[i]``."""
        if data.num_rows >= _VECTOR_ROWS:  # count with one group-by, not a loop per event
            counted = pa.table({
                "d": data.column("domain_id"), "b": data.column("batch_id"),
                "p": pa.array(parts), "t": data.column("table"),
            }).group_by(["d", "b", "p", "t"], use_threads=False).aggregate([([], "count_all")])
            rows: Iterable[tuple[int, int, int, str, int]] = zip(
                *(counted.column(name).to_pylist()
                  for name in ("d", "b", "p", "t", "count_all")), strict=True)
        else:
            rows = ((d, b, p, t, 1) for d, b, p, t in zip(
                data.column("domain_id").to_pylist(), data.column("batch_id").to_pylist(),
                parts.tolist(), data.column("table").to_pylist(), strict=True))
        for dom, bat, part, table, count in rows:
            share = self._share(dom, bat, part)
            share.count += count
            share.tables[table] += count
        for part, dom, bat, digest in partition_segment_digests(data, parts):
            self._share(dom, bat, part).digests.append(digest)

    def _share(self, domain_id: int, batch_id: int, part: int) -> _Share:
        shares = self._open.get((domain_id, batch_id))
        if shares is None:
            shares = self._open[(domain_id, batch_id)] = {}
            base, heap = self._heap(domain_id, batch_id)
            heapq.heappush(heap, (batch_id - base) % _RING)
        share = shares.get(part)
        if share is None:
            share = shares[part] = _Share()
        return share

    def _heap(self, domain_id: int, batch_id: int) -> tuple[int, list[int]]:
        entry = self._heaps.get(domain_id)
        if entry is None:
            entry = self._heaps[domain_id] = ((batch_id - (1 << 63)) % _RING, [])
        return entry

    def close_epoch(self, record: EpochRecord) -> tuple[list[EpochRecord], list[BatchTotal]]:
        """One record per partition for ``record``, and the totals of the batches it covers.

        The covered batches are forgotten; batches are listed in id order.
        """
        covered = []
        if record.domain_id in self._heaps:
            base, heap = self._heaps[record.domain_id]
            limit = (record.end_id - base) % _RING
            while heap and heap[0] < limit:
                covered.append((record.domain_id, (heapq.heappop(heap) + base) % _RING))
        shares: list[list[_Share]] = [[] for _ in range(self.partitions)]
        totals = []
        for key in covered:
            tables: Counter[str] = Counter()
            count = 0
            for part, share in self._open.pop(key).items():
                shares[part].append(share)
                tables.update(share.tables)
                count += share.count
            totals.append(BatchTotal(key[0], key[1], count, dict(tables)))
        return partition_records(record, shares), totals


def partition_records(record: EpochRecord, shares: list[list[_Share]]) -> list[EpochRecord]:
    """``record`` split into one copy per partition from each partition's shares."""
    out = []
    head = (record.domain_id, record.epoch_seq, record.begin_id, record.end_id)
    for part, part_shares in enumerate(shares):
        if not part_shares:  # nothing of this epoch went to this partition
            out.append(EpochRecord(*head, 0, record.quiescent, (), "", part))
            continue
        tables: Counter[str] = Counter()
        digests = []
        for share in part_shares:
            tables.update(share.tables)
            digests.extend(share.digests)
        out.append(EpochRecord(
            *head, sum(share.count for share in part_shares), record.quiescent,
            tuple(sorted(tables.items())), _setsum_hex(digests), part))
    return out


def _setsum_hex(digests: list[bytes]) -> str:
    """The setsum hexdigest of items given by their digests ("" for none)."""
    if len(digests) > 16:
        total = Setsum().insert_digests(b"".join(digests))
    else:  # a few digests: plain integers beat numpy's set-up cost
        lanes = [0] * 8
        for digest in digests:
            for i, lane in enumerate(_LANES.unpack(digest)):
                lanes[i] += lane
        total = Setsum(lanes)
    return total.hexdigest() if total else ""
