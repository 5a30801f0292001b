"""The executor side of the cell check: each cell's events walked in interval order.

Runs inside Spark's Python workers (``mapInArrow``) on a partition clustered by cell and
sorted by (cell, interval, domain, batch, seq): one shuffle and one sort, where the same
check as Spark SQL aggregates and windows took a sort per aggregate (binary values
cannot sit in Spark's hash aggregation buffers) and a sort for the window.

Per (cell, interval) it drops duplicated events (same domain, batch, seq), nets the
events as a Z-set (+new, -old) and checks the net against the value the cell held
(see ``_replay.LogReplay._cells``); a baseline chunk's value (a *reset* row) then
replaces the value. It also counts the kept events per (domain, epoch, table) for the
per-epoch report, so no other pass dedups the events again.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["CELL_INPUT", "CELL_ROWS", "KIND_CELL", "KIND_COUNT", "KIND_RESET",
           "walk_cells"]

KIND_CELL: Final = "c"  # an output row: one (cell, interval)
KIND_COUNT: Final = "t"  # an output row: events kept per (domain, epoch, table)
KIND_RESET: Final = "r"  # an input row: a baseline chunk's value for a cell at a point
_ABSENT: Final = b""  # sinks.codec's tagged ABSENT
_OUT_BATCH: Final = 8192

# The input columns, in this order (events: reset and fq null; resets: the event
# columns null).
CELL_INPUT: Final = ("kind", "domain", "q", "epoch", "table", "row", "column", "batch",
                     "seq", "old", "new", "reset", "fq")
CELL_ROWS: Final = pa.schema([
    pa.field("kind", pa.string()),
    pa.field("domain", pa.int64()),
    pa.field("q", pa.int64()),
    pa.field("epoch", pa.int64()),
    pa.field("table", pa.string()),
    pa.field("row", pa.binary()),
    pa.field("column", pa.string()),
    pa.field("changed", pa.bool_()),
    pa.field("before", pa.binary()),
    pa.field("after", pa.binary()),
    pa.field("why", pa.string()),
    pa.field("forgiven", pa.bool_()),
    pa.field("events", pa.int64()),
])

_NO_CHAIN: Final = ("its events do not chain from the value held to one final value "
                    "(an event is missing or altered)")
_NOT_HELD: Final = "its first event did not replace the value the cell held"
_NEVER: Final = "its events never replaced the value held"
_TWO_DOMAINS: Final = ("the cell is written by two domains; replay.spark needs each cell "
                       "owned by one domain")

# One input row, in ``CELL_INPUT`` order.
_Row = tuple[str, int, int, int | None, str, bytes, str, int | None, int | None,
             bytes | None, bytes | None, bytes | None, int | None]
_Cell = tuple[str, bytes, str]
_KIND: Final = 0
_DOMAIN: Final = 1
_Q: Final = 2
_EPOCH: Final = 3
_BATCH: Final = 7
_SEQ: Final = 8
_OLD: Final = 9
_NEW: Final = 10
_RESET: Final = 11
_FQ: Final = 12


def _walk(cell: _Cell, rows: list[_Row], out: list[tuple[object, ...]],
          counts: dict[tuple[int, int, str], int]) -> None:
    """Check one cell's rows (sorted by q, domain, then resets, batch, seq) interval by
    interval, appending one ``CELL_ROWS`` row per interval to ``out``."""
    table, row, column = cell
    first = rows[0][_DOMAIN]
    two = any(r[_DOMAIN] != first for r in rows)
    fqs = [r[_FQ] for r in rows if r[_FQ] is not None]
    fq = max(fqs) if fqs else None
    held = _ABSENT
    i, n = 0, len(rows)
    point: tuple[int, int] | None = None
    while i < n:
        r = rows[i]
        domain, q = r[_DOMAIN], r[_Q]
        if point is not None and (q, domain) < point:
            raise RuntimeError(f"rows of cell {cell!r} out of order: the cell check needs "
                               "them sorted by interval")
        point = (q, domain)
        j = i + 1
        while j < n and rows[j][_Q] == q and rows[j][_DOMAIN] == domain:
            j += 1
        final: bytes | None
        why: str | None = None
        if j == i + 1 and r[_KIND] != KIND_RESET:
            # One event (most intervals): it moves the cell from `old` to `new`, or, if
            # they are equal, rewrites the value it must have held.
            old, new, epoch = r[_OLD], r[_NEW], r[_EPOCH]
            assert old is not None and new is not None and epoch is not None
            key = (domain, epoch, table)
            counts[key] = counts.get(key, 0) + 1
            final = new if old != new else None
            if old != held:
                why = _NOT_HELD if old != new else _NEVER
            elif two:
                why = _TWO_DOMAINS
        else:
            final, why, epoch = _interval(rows[i:j], held, table, two, counts)
        out.append((KIND_CELL, domain, q, epoch, table, row, column,
                    final is not None and final != held, held, final, why,
                    fq is not None and q <= fq, None))
        if final is not None:
            held = final
        i = j


def _interval(rows: list[_Row], held: bytes, table: str, two: bool,
              counts: dict[tuple[int, int, str], int]
              ) -> tuple[bytes | None, str | None, int]:
    """The general case: several events and/or a baseline reset in one interval.
    Returns (final value or None, why it fails or None, the epoch to name)."""
    domain, q = rows[0][_DOMAIN], rows[0][_Q]
    reset: bytes | None = None
    net: dict[bytes, int] = {}
    replaced: set[bytes] = set()
    epoch: int | None = None
    last: tuple[int | None, int | None] | None = None
    for r in rows:
        if r[_KIND] == KIND_RESET:
            value = r[_RESET]
            assert value is not None
            reset = value if reset is None or value > reset else reset
            continue
        if (r[_BATCH], r[_SEQ]) == last:
            continue  # a duplicated delivery of the event just kept
        last = (r[_BATCH], r[_SEQ])
        old, new, e = r[_OLD], r[_NEW], r[_EPOCH]
        assert old is not None and new is not None and e is not None
        net[new] = net.get(new, 0) + 1
        net[old] = net.get(old, 0) - 1
        replaced.add(old)
        epoch = e if epoch is None or e < epoch else epoch
        key = (domain, e, table)
        counts[key] = counts.get(key, 0) + 1
    if last is None:  # a baseline chunk's reset alone
        return reset, None, q
    assert epoch is not None
    nonzero = [(v, w) for v, w in net.items() if w]
    moved = len(nonzero) == 2 and sum(abs(w) for _, w in nonzero) == 2
    after = initial = None
    if moved:
        after = max(v for v, w in nonzero if w > 0)
        initial = max(v for v, w in nonzero if w < 0)
    final = reset if reset is not None else after
    why: str | None = None
    if nonzero and not moved:
        why = _NO_CHAIN
    elif moved and initial != held:
        why = _NOT_HELD
    elif not nonzero and held not in replaced:
        why = _NEVER
    elif two:
        why = _TWO_DOMAINS
    return final, why, epoch


def _batch(rows: list[tuple[object, ...]]) -> pa.RecordBatch:
    columns = zip(*rows, strict=True)
    return pa.RecordBatch.from_arrays(
        [pa.array(c, f.type) for c, f in zip(columns, CELL_ROWS, strict=True)],
        schema=CELL_ROWS)


def _cell_starts(batch: pa.RecordBatch) -> list[int]:
    """The rows of ``batch`` where a cell begins (its first row, then each change)."""
    n = batch.num_rows
    if n < 2:
        return [0]
    change = None
    for name in ("table", "row", "column"):
        c = batch.column(name)
        differs = pc.not_equal(c.slice(1), c.slice(0, n - 1))
        change = differs if change is None else pc.or_(change, differs)
    assert change is not None
    flags = change.to_numpy(zero_copy_only=False)
    return [0, *(np.flatnonzero(flags) + 1).tolist()]


def walk_cells(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body: ``CELL_INPUT`` rows sorted by (table, row, column, q, domain,
    batch, seq) in, ``CELL_ROWS`` out (one row per cell and interval, then the counts).

    Refuses input out of that order rather than check a cell on part of its events."""
    out: list[tuple[object, ...]] = []
    counts: dict[tuple[int, int, str], int] = {}
    cell: _Cell | None = None
    rows: list[_Row] = []
    for batch in batches:
        n = batch.num_rows
        if not n:
            continue
        records: list[_Row] = list(zip(*(batch.column(name).to_pylist()
                                         for name in CELL_INPUT), strict=True))
        bounds = [*_cell_starts(batch), n]
        for start, end in itertools.pairwise(bounds):
            r = records[start]
            here = (r[4], r[5], r[6])
            if cell is not None and here != cell:
                if here < cell:
                    raise RuntimeError(f"cell {here!r} after {cell!r}: the cell check "
                                       "needs its rows sorted by cell")
                _walk(cell, rows, out, counts)
                rows = []
                if len(out) >= _OUT_BATCH:
                    yield _batch(out)
                    out = []
            cell = here
            rows.extend(records[start:end])
    if cell is not None:
        _walk(cell, rows, out, counts)
    out.extend((KIND_COUNT, domain, None, epoch, table, None, None, None, None, None, None,
                None, events) for (domain, epoch, table), events in counts.items())
    for i in range(0, len(out), _OUT_BATCH):
        yield _batch(out[i:i + _OUT_BATCH])
