"""The Agent for asyncio: the same capture over a store whose operations are coroutines.

Batches are scoped by the same ``ContextVar``, so each task sees its own batch
(``asyncio`` copies the context into every task). ``async with agent.batch():``
waits for forced quiescence without blocking the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping

from agent._agent import _Batch, _Capture, check_conditional, check_update
from agent._baseline import BaselineReport, SnapshotProgress, atake_baseline
from agent._store import AsyncRelaxedStore
from sequencer import ABSENT, Absent, RowKey, Value, check_name, check_row, check_write
from sinks import Sink

__all__ = ["AsyncAgent"]


class AsyncAgent(_Capture):
    """``Agent`` for asyncio: ``await agent.set(...)``, ``async with agent.batch(): ...``."""

    def __init__(self, store: AsyncRelaxedStore, sink: Sink, **options: object) -> None:
        super().__init__(sink, **options)  # type: ignore[arg-type]
        self.store = store

    async def snapshot(self, *, chunk_rows: int = 10_000,
                       progress: Callable[[SnapshotProgress], None] | None = None
                       ) -> BaselineReport:
        """``Agent.snapshot`` for asyncio: the store's ``list_cells`` is awaited and the
        wait for quiescence does not block the event loop."""
        return await atake_baseline(self, self.store, chunk_rows=chunk_rows,
                                    progress=progress)

    async def _batch_here(self) -> tuple[_Batch, bool]:
        """The batch in force, or a fresh automatic one (``True``: close it after)."""
        batch = self._current.get()
        if batch is not None:
            return batch, False
        return await self._aopen(), True

    async def set(self, table: str, row: RowKey, column: str, value: Value) -> Value | Absent:
        check_write(table, row, column, value)
        batch, auto = await self._batch_here()
        try:
            old = await self.store.exchange(table, row, column, value)
            self._record(batch, (table, row, column, old, value))
            return old
        finally:
            if auto:
                self._close(batch)

    async def delete(self, table: str, row: RowKey, column: str) -> Value | Absent:
        check_name("table", table)
        check_row(row)
        check_name("column", column)
        batch, auto = await self._batch_here()
        try:
            old = await self.store.exchange(table, row, column, ABSENT)
            if old is not ABSENT:
                self._record(batch, (table, row, column, old, ABSENT))
            return old
        finally:
            if auto:
                self._close(batch)

    async def clear_row(self, table: str, row: RowKey) -> dict[str, Value]:
        check_name("table", table)
        check_row(row)
        removed: dict[str, Value] = {}
        batch, auto = await self._batch_here()
        try:
            for column in await self.store.read_row(table, row):
                old = await self.store.exchange(table, row, column, ABSENT)
                if old is not ABSENT:
                    removed[column] = old  # type: ignore[assignment]
                    self._record(batch, (table, row, column, old, ABSENT))
            return removed
        finally:
            if auto:
                self._close(batch)

    async def update(self, table: str, rows: Iterable[RowKey],
                     values: Mapping[str, Value]) -> None:
        rows = check_update(table, rows, values)
        batch, auto = await self._batch_here()
        try:
            for row in rows:
                for column, value in values.items():
                    old = await self.store.exchange(table, row, column, value)
                    self._record(batch, (table, row, column, old, value))
        finally:
            if auto:
                self._close(batch)

    async def conditional_set(
        self, table: str,
        changes: Mapping[RowKey, Mapping[str, tuple[Value | Absent, Value | Absent]]],
    ) -> dict[RowKey, bool]:
        check_conditional(table, changes)
        results: dict[RowKey, bool] = {}
        batch, auto = await self._batch_here()
        try:
            for row, cells in changes.items():
                ok = True
                for column, (expected, new) in cells.items():
                    swapped, old = await self.store.compare_exchange(table, row, column,
                                                                     expected, new)
                    if not swapped:
                        ok = False
                        break
                    if not (old is ABSENT and new is ABSENT):
                        self._record(batch, (table, row, column, old, new))
                results[row] = ok
            return results
        finally:
            if auto:
                self._close(batch)

    async def get(self, table: str, row: RowKey, column: str) -> Value | Absent:
        return await self.store.get(table, row, column)

    async def aflush(self, timeout: float | None = None) -> None:
        """``flush`` without blocking the event loop."""
        await asyncio.to_thread(self.flush, timeout)

    async def aclose(self, timeout: float | None = None) -> None:
        """``close`` without blocking the event loop."""
        await asyncio.to_thread(self.close, timeout)
