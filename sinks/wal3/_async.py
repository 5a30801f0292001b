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
from typing import Any

from sinks.wal3._errors import LogBackpressure
from sinks.wal3._manifest import LogPosition, Manifest
from sinks.wal3._writer import LogWriter

__all__ = ["AsyncLogWriter"]


async def _wait(fut: Future[LogPosition]) -> LogPosition:
    """Await a writer future without ever cancelling it."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[LogPosition] = loop.create_future()

    def transfer(done: Future[LogPosition]) -> None:
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

    async def _submit(self, bodies: Sequence[bytes]) -> list[Future[LogPosition]]:
        try:
            return self.writer.submit_many(bodies, timeout=0)
        except LogBackpressure:
            # The queue is full: wait for room on a thread, not on the event loop.
            return await asyncio.to_thread(self.writer.submit_many, bodies)

    async def append(self, body: bytes) -> LogPosition:
        """Append one record; return its position once durable."""
        (fut,) = await self._submit([body])
        return await _wait(fut)

    async def append_many(self, bodies: Sequence[bytes]) -> list[LogPosition]:
        futures = await self._submit(bodies)
        return [await _wait(f) for f in futures]

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
