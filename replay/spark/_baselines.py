"""Baselines (SNAPSHOT records) in Spark: chunk headers on the driver, cells in executors.

A chunk says: right after quiescence point ``Q`` of its domain, the rows ``lo <= row <
hi`` held exactly these cells (``docs/state.md``). Spark replays it per cell as a
*reset*: at ``Q`` the cell takes the chunk's value, or ABSENT when the chunk covers its
row without listing it; the cell's later events chain from there.

- Executors (pass 1) decode each chunk, recompute its setsum and send only its header
  (``chunk_header``) to the driver: a baseline's cells never pass through the driver.
- The driver (``build_baselines``) drops duplicated chunks, refuses two different
  copies of one, a chunk whose setsum does not add up, a missing chunk, chunks that do
  not tile the rows, and a chunk placed at a point that is not a quiescence point.
- Executors (``covering_chunks``) find, for each row the events touch, the chunk of
  each baseline that covers it (a range lookup in snapshot row order).

A consumer that starts from nothing (every Spark replay does) cannot check events on
cells the store held before the agent started: like the Python assembler, it forgives a
cell's broken chain in the intervals up to its row's chunk of the domain's *first*
baseline, and the domain's states are whole only from that baseline's last chunk on
(``BaselineTable.whole_from``).
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pyarrow as pa

from replay._errors import InconsistentLog
from replay.spark._decode import signed_bits
from sinks.codec import SnapshotChunk, decode_key, encode_key

__all__ = ["COVERS", "Baseline", "BaselineTable", "ChunkHeader", "build_baselines",
           "chunk_header", "covering_chunks", "points_a_cut_needs", "row_order"]

# One row per (row of the events, baseline covering it): the chunk's quiescence point.
COVERS: Final = pa.schema([
    pa.field("domain", pa.int64()), pa.field("table", pa.string()),
    pa.field("row", pa.binary()), pa.field("cq", pa.int64()), pa.field("first", pa.bool_()),
])

Order = tuple[str, int, Any]


def row_order(table: str, row: Any) -> Order:
    """Snapshot row order (``docs/state.md``): by table, then int keys numerically
    before str keys by code point; ``row=None`` is the start of the table."""
    if row is None:
        return (table, -1, 0)
    return (table, 0, row) if type(row) is int else (table, 1, row)


def _bound(bound: tuple[str, Any] | None) -> list[Any] | None:
    if bound is None:
        return None
    table, row = bound
    return [table, None if row is None else encode_key(row).hex()]


def points_a_cut_needs(points: list[tuple[int, int]], start: int | None
                       ) -> list[tuple[int, int]]:
    """Of one domain's quiescence points ``(epoch_seq, end_id)`` (in order), those a
    stream's cut can still use: the last one, and the last one before the start of the
    domain's first baseline (``start``: its first chunk's point). ``start`` None (no
    chunk of the domain seen yet): the last two, since a log holds a chunk right after
    its point and before the next point, so a first chunk seen later starts at the last
    point or after it. The streams keep only these (``_stream``, ``_kafka_points``)."""
    if start is None:
        return points[-2:]
    before = bisect.bisect_left(points, (start,))
    return sorted({*points[max(before - 1, 0):before], *points[-1:]})


def chunk_header(chunk: SnapshotChunk) -> str:
    """The chunk without its cells, as JSON, with the setsum its cells add up to."""
    return json.dumps({
        "domain": chunk.domain_id, "epoch_seq": chunk.epoch_seq, "end_id": chunk.end_id,
        "baseline": chunk.baseline_id, "index": chunk.index, "last": chunk.last,
        "lo": _bound(chunk.lo), "hi": _bound(chunk.hi), "cells": chunk.cell_count,
        "setsum": chunk.setsum, "actual": chunk.actual_setsum()})


@dataclass(frozen=True)
class ChunkHeader:
    domain_id: int
    epoch_seq: int
    end_id: int
    baseline_id: int
    index: int
    last: bool
    lo: tuple[str, Any] | None
    hi: tuple[str, Any] | None
    cells: int
    setsum: str
    actual: str

    @classmethod
    def parse(cls, text: str) -> ChunkHeader:
        obj = json.loads(text)

        def bound(b: list[Any] | None) -> tuple[str, Any] | None:
            if b is None:
                return None
            return (b[0], None if b[1] is None else decode_key(bytes.fromhex(b[1])))

        return cls(obj["domain"], obj["epoch_seq"], obj["end_id"], obj["baseline"],
                   obj["index"], obj["last"], bound(obj["lo"]), bound(obj["hi"]),
                   obj["cells"], obj["setsum"], obj["actual"])

    def name(self) -> str:
        return f"snapshot chunk {self.index} of baseline {self.baseline_id:#x}"


@dataclass(frozen=True)
class Baseline:
    """One baseline's chunks that the log holds, in order (0.. without a gap)."""

    domain_id: int
    baseline_id: int
    chunks: tuple[ChunkHeader, ...]

    @property
    def complete(self) -> bool:
        return bool(self.chunks) and self.chunks[-1].last

    @property
    def start(self) -> int:
        return self.chunks[0].epoch_seq

    @property
    def end(self) -> int:
        return self.chunks[-1].epoch_seq

    def ranges(self) -> tuple[list[Order], list[int]]:
        """Each chunk's upper row bound (sorted; the last open) and quiescence point."""
        his = [row_order(*c.hi) if c.hi is not None else ("\U0010ffff" * 8, 9, 0)
               for c in self.chunks]
        return his, [c.epoch_seq for c in self.chunks]


@dataclass(frozen=True)
class BaselineTable:
    """Every domain's baselines, ordered by their first chunk's quiescence point."""

    baselines: dict[int, list[Baseline]]

    def __bool__(self) -> bool:
        return any(self.baselines.values())

    def first(self, domain_id: int) -> Baseline | None:
        found = self.baselines.get(domain_id)
        return found[0] if found else None

    def whole_from(self, domain_id: int, points: np.ndarray) -> int | None:
        """The first quiescence point (of the domain's, ``points``: their seqs in order)
        at or after the domain's first baseline's last chunk (from there its states are
        the store's); None: no baseline. -1: the baseline is not complete in this log
        (its states are partial from its start)."""
        first = self.first(domain_id)
        if first is None:
            return None
        if not first.complete:
            return -1
        at = int(np.searchsorted(points, first.end, side="left"))
        return int(points[at]) if at < len(points) else -1

    def accepted(self) -> frozenset[tuple[int, int, int]]:
        """(domain, baseline, index) of every chunk placed in the replay."""
        return frozenset((b.domain_id, b.baseline_id, c.index)
                         for bs in self.baselines.values() for b in bs for c in b.chunks)


def build_baselines(headers: Iterable[ChunkHeader],
                    points: Mapping[int, np.ndarray]) -> BaselineTable:
    """Check the chunks' setsums, order and tiling; keep those at known points.

    ``points`` are each domain's quiescence points (seqs, in order) in the verified
    log: a chunk placed after the last of them (the log's tail) waits, as its interval
    does.
    """
    by_key: dict[tuple[int, int, int], ChunkHeader] = {}
    for h in headers:
        if h.actual != h.setsum:
            raise InconsistentLog(
                f"{h.name()}: setsum of its cells is {h.actual}, the chunk says {h.setsum} "
                "(a cell was altered, lost or foreign)",
                domain_id=h.domain_id, epoch_seq=h.epoch_seq)
        key = (h.domain_id, h.baseline_id, h.index)
        known = by_key.get(key)
        if known is not None and known != h:
            raise InconsistentLog(f"two different copies of {h.name()}",
                                  domain_id=h.domain_id, epoch_seq=h.epoch_seq)
        by_key[key] = h
    grouped: dict[tuple[int, int], list[ChunkHeader]] = {}
    for h in by_key.values():
        grouped.setdefault((h.domain_id, h.baseline_id), []).append(h)
    result: dict[int, list[Baseline]] = {}
    for (domain_id, baseline_id), chunks in grouped.items():
        seqs = points.get(domain_id, np.zeros(0, dtype=np.int64))
        known_points = set(seqs.tolist())
        last_point = int(seqs[-1]) if len(seqs) else 0
        chunks.sort(key=lambda c: c.index)
        kept: list[ChunkHeader] = []
        for c in chunks:
            if c.epoch_seq > last_point:
                break  # the log's tail: applied once its quiescence point arrives
            if c.epoch_seq and c.epoch_seq not in known_points:
                raise InconsistentLog(
                    f"{c.name()} names epoch {c.epoch_seq}, which is not a quiescence point",
                    domain_id=domain_id, epoch_seq=c.epoch_seq)
            due = len(kept)
            if c.index != due:
                raise InconsistentLog(
                    f"{c.name()} came where chunk {due} was due (a chunk is missing)",
                    domain_id=domain_id, epoch_seq=c.epoch_seq)
            expect_lo = kept[-1].hi if kept else None
            if c.lo != expect_lo or (kept and kept[-1].last) or (
                    kept and c.epoch_seq < kept[-1].epoch_seq):
                raise InconsistentLog(
                    f"{c.name()} starts at {c.lo!r}, but the previous one ended at "
                    f"{expect_lo!r}: chunks must tile the rows, in order",
                    domain_id=domain_id, epoch_seq=c.epoch_seq)
            kept.append(c)
        if kept:
            result.setdefault(domain_id, []).append(
                Baseline(domain_id, baseline_id, tuple(kept)))
    for domain_id, baselines in result.items():
        baselines.sort(key=lambda b: (b.start, b.end))
        for b in baselines[:-1]:
            if not b.complete:
                raise InconsistentLog(
                    f"baseline {b.baseline_id:#x} stops after chunk {b.chunks[-1].index} "
                    "and another baseline follows (a chunk is missing)",
                    domain_id=domain_id, epoch_seq=b.end)
    return BaselineTable(result)


def covering_chunks(table: BaselineTable
                    ) -> Callable[[Iterable[pa.RecordBatch]], Iterable[pa.RecordBatch]]:
    """Executor side: for each (domain, table, row), each baseline's covering chunk."""
    ranges = {d: [(i == 0, *b.ranges()) for i, b in enumerate(bs)]
              for d, bs in table.baselines.items()}
    signed = {signed_bits(d): r for d, r in ranges.items()}

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            out: dict[str, list[Any]] = {f.name: [] for f in COVERS}
            for domain, tname, raw in zip(batch.column("domain").to_pylist(),
                                          batch.column("table").to_pylist(),
                                          batch.column("row").to_pylist(), strict=True):
                found = signed.get(domain)
                if not found:
                    continue
                order = row_order(tname, decode_key(raw))
                for first, his, qs in found:
                    i = bisect.bisect_right(his, order)
                    if i < len(his):
                        for name, value in (("domain", domain), ("table", tname),
                                            ("row", raw), ("cq", qs[i]), ("first", first)):
                            out[name].append(value)
            yield pa.RecordBatch.from_pydict(out, schema=COVERS)

    return run
