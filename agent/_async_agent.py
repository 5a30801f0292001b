"""The Agent for asyncio: the same capture over a store whose operations are coroutines.

Batches are scoped by the same ``ContextVar``, so each task sees its own batch
(``asyncio`` copies the context into every task). ``async with agent.batch():``
waits for forced quiescence without blocking the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from agent import _operations as operations
from agent._agent import _Capture
from agent._baseline import BaselineReport, SnapshotProgress, atake_baseline
from agent._baseline_journal import BaselineJournal
from agent._store import AsyncRelaxedStore
from sequencer import Absent, RowKey, Value, check_write
from sinks import Sink

__all__ = ["AsyncAgent"]

T = TypeVar("T")


class AsyncAgent(_Capture):
    """``Agent`` for asyncio: ``await agent.set(...)``, ``async with agent.batch(): ...``."""

    def __init__(self, store: AsyncRelaxedStore, sink: Sink, **options: object) -> None:
        super().__init__(sink, **options)  # type: ignore[arg-type]
        self.store = store

    async def snapshot(self, *, chunk_rows: int = 10_000,
                       progress: Callable[[SnapshotProgress], None] | None = None,
                       journal: BaselineJournal | str | None = None) -> BaselineReport:
        """``Agent.snapshot`` for asyncio: the store's ``list_cells`` is awaited and the
        wait for quiescence does not block the event loop. ``journal`` as for
        ``Agent.snapshot`` (``agent._baseline_journal``): a clean ``close()`` or
        ``aclose()`` marks it closed, so call it at every start."""
        return await atake_baseline(self, self.store, chunk_rows=chunk_rows,
                                    progress=progress, journal=journal)

    async def set(self, table: str, row: RowKey, column: str, value: Value) -> Value | Absent:
        # ``operations.set_cell``'s steps inlined, as in ``Agent.set`` (the hot path);
        # tests/agent/test_operations.py holds both to the same calls, events and result.
        check_write(table, row, column, value)
        batch = self._current.get()
        if batch is not None:
            old = await self.store.exchange(table, row, column, value)
            self._record(batch, (table, row, column, old, value))
            return old
        auto = await self._aopen()  # an automatic batch: no scope, no ContextVar
        try:
            old = await self.store.exchange(table, row, column, value)
            self._record(auto, (table, row, column, old, value))
            return old
        finally:
            self._close(auto)

    async def delete(self, table: str, row: RowKey, column: str) -> Value | Absent:
        return await self._apply(operations.delete_cell(table, row, column))

    async def clear_row(self, table: str, row: RowKey) -> dict[str, Value]:
        return await self._apply(operations.clear_row(table, row))

    async def update(self, table: str, rows: Iterable[RowKey],
                     values: Mapping[str, Value]) -> None:
        await self._apply(operations.update(table, rows, values))

    async def conditional_set(
        self, table: str,
        changes: Mapping[RowKey, Mapping[str, tuple[Value | Absent, Value | Absent]]],
    ) -> dict[RowKey, bool]:
        return await self._apply(operations.conditional_set(table, changes))

    async def _apply(self, op: operations.Operation[T]) -> T:
        """Drive one operation (agent._operations) in the batch in force, or in an
        automatic batch of its own, opened only once the operation's checks passed."""
        try:
            step = next(op)  # the checks: no batch opened, the store not touched yet
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        batch = self._current.get()
        if batch is not None:
            return await operations.arun(self.store, op, step,
                                         lambda event: self._record(batch, event))
        auto = await self._aopen()
        try:
            return await operations.arun(self.store, op, step,
                                         lambda event: self._record(auto, event))
        finally:
            self._close(auto)

    async def get(self, table: str, row: RowKey, column: str) -> Value | Absent:
        return await self.store.get(table, row, column)

    async def aflush(self, timeout: float | None = None) -> None:
        """``flush`` without blocking the event loop."""
        await asyncio.to_thread(self.flush, timeout)

    async def aclose(self, timeout: float | None = None) -> None:
        """``close`` without blocking the event loop."""
        await asyncio.to_thread(self.close, timeout)
