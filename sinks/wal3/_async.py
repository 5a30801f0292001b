"""An asyncio facade over ``LogWriter``.

All I/O runs on the writer's own threads, which no asyncio cancellation reaches: a
caller cancelled while awaiting an append only stops waiting. Its record still becomes
durable (or fails) in order, and every other caller proceeds: the log is never wedged.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from sinks.wal3._errors import LogBackpressure
from sinks.wal3._manifest import LogPosition, Manifest
from sinks.wal3._writer import LogWriter

__all__ = ["AsyncLogWriter"]

T = TypeVar("T")


async def _wait(fut: Future[T]) -> T:
    """Await a writer future without ever cancelling it."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[T] = loop.create_future()

    def transfer(done: Future[T]) -> None:
        def settle() -> None:
            if waiter.done():
                return  # the caller was cancelled; the record goes on regardless
            exc = done.exception()
            if exc is not None:
                waiter.set_exception(exc)
            else:
                waiter.set_result(done.result())

        with contextlib.suppress(RuntimeError):  # the loop is gone; nobody waits any more
            loop.call_soon_threadsafe(settle)

    fut.add_done_callback(transfer)
    return await waiter


class AsyncLogWriter:
    """``await log.append(body)``; open with ``await AsyncLogWriter.open(...)``."""

    def __init__(self, writer: LogWriter) -> None:
        self.writer = writer

    @classmethod
    async def open(cls, *args: Any, **kwargs: Any) -> AsyncLogWriter:
        return cls(await asyncio.to_thread(LogWriter.open, *args, **kwargs))

    @classmethod
    async def open_or_initialize(cls, *args: Any, **kwargs: Any) -> AsyncLogWriter:
        return cls(await asyncio.to_thread(LogWriter.open_or_initialize, *args, **kwargs))

    async def append(self, body: bytes) -> LogPosition:
        """Append one record; return its position once durable."""
        try:
            fut = self.writer.submit(body, timeout=0)
        except LogBackpressure:
            # The queue is full: wait for room on a thread, not on the event loop.
            fut = await asyncio.to_thread(self.writer.submit, body)
        return await _wait(fut)

    async def append_many(self, bodies: Sequence[bytes]) -> list[LogPosition]:
        """Append records in order; return their positions once all are durable."""
        try:
            fut = self.writer.submit_batch(bodies, timeout=0)
        except LogBackpressure:
            fut = await asyncio.to_thread(self.writer.submit_batch, bodies)
        return await _wait(fut)

    async def flush(self) -> None:
        await asyncio.to_thread(self.writer.flush)

    async def seal(self) -> Manifest:
        return await asyncio.to_thread(self.writer.seal)

    async def close(self) -> None:
        await asyncio.to_thread(self.writer.close)

    async def __aenter__(self) -> AsyncLogWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
