"""Write-batch scoping by ContextVar, shared by the Agent, AsyncAgent and the sidecar's
client: one implementation of "open or join, and the outermost block closes"."""

from __future__ import annotations

from contextvars import ContextVar
from types import TracebackType
from typing import Any, Protocol

__all__ = ["BatchScope", "ScopeOwner", "ScopedBatch"]


class ScopedBatch(Protocol):
    depth: int  # how many nested blocks hold this batch


class ScopeOwner(Protocol):
    """What a ``BatchScope`` needs of the object whose batches it scopes."""

    _current: ContextVar[Any]

    def _open(self) -> Any: ...

    async def _aopen(self) -> Any: ...

    def _close(self, batch: Any) -> None: ...


class BatchScope:
    """``with owner.batch():`` (also ``async with``): opens or joins a write batch.

    The batch in force lives in ``owner._current`` (a ContextVar), so each thread and
    each asyncio task sees its own; a nested block joins the outer batch (its ``depth``
    counts the blocks); the outermost block closes it, even when its body raised: the
    writes that took effect are real.
    """

    __slots__ = ("_batch", "_owner", "_token")

    def __init__(self, owner: ScopeOwner) -> None:
        self._owner = owner
        self._batch: ScopedBatch | None = None

    def __enter__(self) -> None:
        owner = self._owner
        current = owner._current.get()
        if current is not None:
            current.depth += 1  # nested: join the outer batch
            self._batch = current
            return
        batch = owner._open()
        self._batch = batch
        self._token = owner._current.set(batch)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        batch = self._batch
        assert batch is not None
        batch.depth -= 1
        if batch.depth:
            return
        self._owner._current.reset(self._token)
        self._owner._close(batch)

    async def __aenter__(self) -> None:
        owner = self._owner
        current = owner._current.get()
        if current is not None:
            current.depth += 1
            self._batch = current
            return
        batch = await owner._aopen()
        self._batch = batch
        self._token = owner._current.set(batch)

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.__exit__(exc_type, exc, tb)
