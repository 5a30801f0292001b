"""Relaxed stores: the protocol the Agent wraps, and a really relaxed in-memory one.

A relaxed store guarantees one thing: each single-cell operation is atomic. Nothing
spans cells: two writers' batches interleave freely, and a conditional store can
succeed for some cells and fail for others.
"""

from __future__ import annotations

import asyncio
import bisect
import struct
import threading
from collections.abc import Mapping
from itertools import chain, repeat
from operator import itemgetter
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from sequencer import ABSENT, Absent, RowKey, Value
from sinks.codec import Bound, RowCells, row_order

if TYPE_CHECKING:
    from agent._baseline import CellChunk

__all__ = ["AsyncMemoryStore", "AsyncRelaxedStore", "Cell", "MemoryStore", "RelaxedStore"]

Cell = tuple[str, RowKey, str]
_NO_CELLS: dict[str, Value] = {}


@runtime_checkable
class RelaxedStore(Protocol):
    """What the Agent needs of a store. Each method is atomic for one cell only."""

    def exchange(self, table: str, row: RowKey, column: str,
                 value: Value | Absent) -> Value | Absent:
        """Store ``value`` (ABSENT deletes the cell); return the value it replaced."""
        ...

    def compare_exchange(self, table: str, row: RowKey, column: str,
                         expected: Value | Absent,
                         value: Value | Absent) -> tuple[bool, Value | Absent]:
        """If the cell holds ``expected`` (bit for bit), store ``value``.

        Returns ``(swapped, old)``; ``old`` is the value found.
        """
        ...

    def get(self, table: str, row: RowKey, column: str) -> Value | Absent: ...

    def read_row(self, table: str, row: RowKey) -> dict[str, Value]:
        """The row's present cells (not atomic across them)."""
        ...

    def snapshot(self) -> dict[Cell, Value]:
        """Every present cell (only meaningful while no one writes)."""
        ...


class AsyncRelaxedStore(Protocol):
    """``RelaxedStore`` as coroutines, for stores driven from asyncio."""

    async def exchange(self, table: str, row: RowKey, column: str,
                       value: Value | Absent) -> Value | Absent: ...

    async def compare_exchange(self, table: str, row: RowKey, column: str,
                               expected: Value | Absent,
                               value: Value | Absent) -> tuple[bool, Value | Absent]: ...

    async def get(self, table: str, row: RowKey, column: str) -> Value | Absent: ...

    async def read_row(self, table: str, row: RowKey) -> dict[str, Value]: ...

    async def snapshot(self) -> dict[Cell, Value]: ...


def same_value(a: object, b: object) -> bool:
    """Bit-for-bit equality of cell values: 1 != True, -0.0 != 0.0, NaN == same NaN."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return struct.pack("<d", a) == struct.pack("<d", b)
    return a == b


class MemoryStore:
    """An in-memory relaxed store, safe under threads.

    Every cell operation is one atomic step under a single lock (like a hardware
    atomic exchange); nothing is atomic across cells. ``snapshot()`` returns
    ``{(table, row, column): value}``.
    """

    def __init__(self, cells: Mapping[Cell, Value] | None = None) -> None:
        self._rows: dict[tuple[str, RowKey], dict[str, Value]] = {}
        self._lock = threading.Lock()
        # While list_cells walks the store: its sorted row index, and the rows created
        # since it was built (merged in at the next call).
        self._index: list[tuple[str, RowKey]] | None = None
        self._created: list[tuple[str, RowKey]] | None = None
        for (table, row, column), value in (cells or {}).items():
            self._rows.setdefault((table, row), {})[column] = value

    def exchange(self, table: str, row: RowKey, column: str,
                 value: Value | Absent) -> Value | Absent:
        rows = self._rows
        key = (table, row)
        with self._lock:
            cells = rows.get(key)
            if value is ABSENT:
                if cells is None:
                    return ABSENT
                old = cells.pop(column, ABSENT)
                if not cells:
                    del rows[key]
                return old
            if cells is None:
                rows[key] = {column: value}  # type: ignore[dict-item]
                if self._created is not None:
                    self._created.append(key)
                return ABSENT
            old = cells.get(column, ABSENT)
            cells[column] = value  # type: ignore[assignment]
            return old

    def compare_exchange(self, table: str, row: RowKey, column: str,
                         expected: Value | Absent,
                         value: Value | Absent) -> tuple[bool, Value | Absent]:
        with self._lock:
            cells = self._rows.get((table, row))
            current = ABSENT if cells is None else cells.get(column, ABSENT)
            if not same_value(current, expected):
                return False, current
            if value is ABSENT:
                if cells is not None and column in cells:
                    del cells[column]
                    if not cells:
                        del self._rows[(table, row)]
            elif cells is None:
                self._rows[(table, row)] = {column: value}  # type: ignore[dict-item]
                if self._created is not None:
                    self._created.append((table, row))
            else:
                cells[column] = value  # type: ignore[assignment]
            return True, current

    def get(self, table: str, row: RowKey, column: str) -> Value | Absent:
        cells = self._rows.get((table, row))
        return ABSENT if cells is None else cells.get(column, ABSENT)

    def read_row(self, table: str, row: RowKey) -> dict[str, Value]:
        with self._lock:
            return dict(self._rows.get((table, row), ()))

    def snapshot(self) -> dict[Cell, Value]:
        with self._lock:
            return {
                (table, row, column): value
                for (table, row), cells in self._rows.items()
                for column, value in cells.items()
            }


    def list_cells(self, start: Bound | None, limit: int) -> CellChunk:
        """The cells of ``limit`` rows from ``start`` on, in snapshot row order (for
        ``Agent.snapshot``, which calls it while no write runs), as ``RowCells``
        columns: no tuple per cell, since this runs while writers wait.

        ``start=None`` sorts the rows once; later calls continue from that index, with
        the rows created since merged in, so a whole walk costs one sort.
        """
        from agent._baseline import CellChunk

        with self._lock:
            if start is None or self._index is None:
                self._index = _sorted_rows(self._rows)
                self._created = []
            index = self._index
            assert self._created is not None
            for key in self._created:
                at = bisect.bisect_left(index, _row_sort_key(key), key=_row_sort_key)
                if at == len(index) or index[at] != key:
                    index.insert(at, key)
            self._created = []
            pos = 0 if start is None else bisect.bisect_left(
                index, row_order(*start), key=_row_sort_key)
            end = min(pos + limit, len(index))
            keys = index[pos:end]
            found = list(map(self._rows.get, keys, repeat(_NO_CELLS)))  # {}: deleted since
            widths = list(map(len, found))
            if 0 in widths:
                keys = [k for k, w in zip(keys, widths, strict=True) if w]
                found = [cells for cells in found if cells]
                widths = [w for w in widths if w]
            out = RowCells(list(map(itemgetter(0), keys)), list(map(itemgetter(1), keys)),
                           widths, list(chain.from_iterable(found)),
                           list(chain.from_iterable(map(dict.values, found))))
            if end >= len(index):
                self._index = self._created = None
                return CellChunk(out, None)
            return CellChunk(out, index[end])


def _sorted_rows(rows: dict[tuple[str, RowKey], dict[str, Value]]) -> list[tuple[str, RowKey]]:
    """The row dict's own (table, row) keys in snapshot row order. Plain tuple order is
    that order (and several times faster) unless a table mixes int and str keys: then
    the sort meets an int beside a str (it compares every pair it leaves adjacent) and
    raises TypeError, and the explicit key is used."""
    try:
        return sorted(rows)
    except TypeError:
        return sorted(rows, key=_row_sort_key)


def _row_sort_key(key: tuple[str, RowKey]) -> tuple[str, bool, RowKey]:
    """A row's place in snapshot row order, as ``sinks.codec.row_order`` (False == 0)."""
    return (key[0], type(key[1]) is str, key[1])


class AsyncMemoryStore:
    """``MemoryStore`` behind coroutines, yielding to the loop before each operation so
    tasks interleave between cell writes (as they would against a real server)."""

    def __init__(self, store: MemoryStore | None = None) -> None:
        self.sync = store or MemoryStore()

    async def exchange(self, table: str, row: RowKey, column: str,
                       value: Value | Absent) -> Value | Absent:
        await asyncio.sleep(0)
        return self.sync.exchange(table, row, column, value)

    async def compare_exchange(self, table: str, row: RowKey, column: str,
                               expected: Value | Absent,
                               value: Value | Absent) -> tuple[bool, Value | Absent]:
        await asyncio.sleep(0)
        return self.sync.compare_exchange(table, row, column, expected, value)

    async def get(self, table: str, row: RowKey, column: str) -> Value | Absent:
        return self.sync.get(table, row, column)

    async def read_row(self, table: str, row: RowKey) -> dict[str, Value]:
        await asyncio.sleep(0)
        return self.sync.read_row(table, row)

    async def snapshot(self) -> dict[Cell, Value]:
        return self.sync.snapshot()

    async def list_cells(self, start: Bound | None, limit: int) -> CellChunk:
        await asyncio.sleep(0)
        return self.sync.list_cells(start, limit)
