"""The sidecar server: the capture core behind a Unix socket.

Applications write their legacy store themselves (an atomic exchange, which returns
the old value) and report each write here; the sidecar owns the sequencer and the
sink, exactly as an in-process ``Agent`` would, and never touches the store.

Each connection's requests are handled one at a time, in order, right in the event
loop's callback that received them: a request that needs no waiting (``events``, a
plain ``close``, an ``open`` whose batch can open at once) is answered there, with no
hand-off to a task. A request that must wait (an ``open`` held back by forced
quiescence or a full queue, a durable ``close``, ``flush``, a baseline's hold) runs as
a task, and the connection's later requests wait behind it. A connection may hold
several open batches; they belong to it alone. When a connection
ends (the client closed it, or crashed) with batches still open, the sidecar closes
them: their reported events are real writes, and an open batch left behind would hold
the sequencer back forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import socket
import stat
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import structlog

from agent._agent import SEGMENT_EVENTS, AgentClosed, QuiescenceTimeout, _Batch, _Capture
from agent._shipper import ShippingBackpressure, ShippingFailed
from agent.sidecar import _protocol as p
from sinks import Sink

__all__ = [
    "DEFAULT_MAX_QUIESCENCE_INTERVAL",
    "SOCKET_MODE",
    "Sidecar",
    "SidecarAddressInUse",
    "SidecarSocketError",
]

log = structlog.get_logger()

MAX_LINE: Final = 16 << 20  # bytes per request line; longer ends the connection
MAX_BUFFERED: Final = 64 << 20  # bytes of unhandled requests held across all connections
# Owner and group may connect (connecting needs write permission on the socket file):
# put the clients' users in the sidecar's group, or pass socket_mode=0o666.
SOCKET_MODE: Final = 0o660
_MAX_SOCKET_PATH: Final = 107  # bytes in sockaddr_un.sun_path, less the final NUL
# Forced quiescence is on by default here (the Agent's default is off). Clients pipeline
# a batch's close with their next open, and the sidecar handles the two back to back, so
# busy clients leave no moment without an open batch: without it a loaded sidecar may
# never reach a quiescence point, and consumers, who cut only there, would see nothing.
DEFAULT_MAX_QUIESCENCE_INTERVAL: Final = 0.1  # seconds


class _Budget:
    """Bytes received but not yet handled, across all connections, against a limit.

    Over the limit, a connection that sends more is paused (the kernel then holds the
    client's writes back) until the total falls to half the limit. If no connection
    holds a whole request that would free bytes, the one holding the largest
    unfinished request is refused (``memory_limit``) and closed, so the sidecar never
    waits on itself.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.readers: set[_Session] = set()
        self.paused: set[_Session] = set()

    def release(self, count: int) -> None:
        self.used -= count
        # Resume below half the limit, or when no connection holds a whole request any
        # more (the bytes held are paused connections' unfinished lines: waiting for
        # the total to fall would wait for ever; resumed, one that sends more goes
        # over the limit again and over() refuses the largest).
        if self.paused and (self.used <= self.limit // 2
                            or not any(r.has_request() for r in self.readers)):
            paused, self.paused = self.paused, set()
            for reader in paused:
                reader.resume()

    def over(self, reader: _Session) -> None:
        if any(other.has_request() for other in self.readers):
            reader.pause()  # others will free bytes as they handle their requests
            self.paused.add(reader)
            return
        victim = max(self.readers, key=lambda r: r.buffered())
        victim.refuse_over_budget()


_HOLD_REPLIES: Final = 256  # replies to pipelined requests written together at most


class _Session(asyncio.Protocol):
    """One client connection: splits the bytes it receives into request lines and has
    the sidecar answer them in order, in this callback when they need no waiting.

    The bytes received but not yet handled count against the sidecar's global budget.
    A client that dies with replies unread in its socket makes the kernel report
    ECONNRESET: the requests already received are real writes, so they are still
    handled (their replies dropped) before the connection's batches close.
    """

    def __init__(self, sidecar: Sidecar, number: int) -> None:
        self._sidecar = sidecar
        self._budget = sidecar._budget
        self._max_line = sidecar.max_line
        self.connection = _Connection(number)
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._waiting: asyncio.Task[None] | None = None  # a request that waits; later
                                                         # lines wait behind it
        self._ended = False  # no more requests: end of stream, reset, or refused
        self._finished = False  # its batches are closed, it left the sidecar's list
        self._detached = False  # its bytes are given back, its socket closed
        self._paused = False  # by the budget
        self._writes_paused = False  # the client does not read its replies

    # -- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._sidecar._connections[self.connection] = self
        self._budget.readers.add(self)

    def data_received(self, data: bytes) -> None:
        if self._detached:
            return
        self._buffer += data
        budget = self._budget
        budget.used += len(data)
        if budget.used > budget.limit:
            budget.over(self)
        if self._waiting is None and not self._detached:
            self._handle_lines()

    def eof_received(self) -> bool:
        self._ended = True
        if self._waiting is None:
            self._handle_lines()
        return True  # keep the transport: replies may still be written

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None  # replies have nowhere to go; requests are still handled
        if not self._ended:
            self._ended = True
            if self._waiting is None:
                self._handle_lines()

    def pause_writing(self) -> None:
        self._writes_paused = True  # read no more requests until the client reads
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        self._writes_paused = False
        if self._transport is not None and not self._paused:
            self._transport.resume_reading()

    # -- the budget's view -----------------------------------------------------------

    def buffered(self) -> int:
        return len(self._buffer)

    def has_request(self) -> bool:
        return self._buffer.find(b"\n") >= 0

    def pause(self) -> None:
        if not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()

    def resume(self) -> None:
        if self._paused:
            self._paused = False
            if self._transport is not None and not self._writes_paused:
                self._transport.resume_reading()

    def refuse_over_budget(self) -> None:
        """The budget is spent and this connection holds the largest unfinished
        request: refuse it and end the connection."""
        self._refuse(p.encode_error(
            None, p.MEMORY_LIMIT, f"the sidecar holds at most {self._budget.limit} "
            "bytes of unhandled requests over all connections, and this "
            f"connection's unfinished request ({self.buffered()} bytes so far) was the "
            "largest when that was spent; the connection closes (its open batches "
            "too): send smaller requests (split events over several)"))

    # -- requests --------------------------------------------------------------------

    def _handle_lines(self) -> None:
        """Answer the complete lines buffered, in order, until one must wait."""
        buffer = self._buffer
        sidecar = self._sidecar
        connection = self.connection
        replies: list[bytes] = []
        position = 0
        try:
            while not self._detached:
                end = buffer.find(b"\n", position)
                if end < 0:
                    if len(buffer) - position > self._max_line:
                        return self._too_long(replies)
                    if not self._ended:
                        break
                    end = len(buffer) - 1  # a last request without its newline
                    if end < position:
                        break
                if end - position > self._max_line:
                    return self._too_long(replies)
                line = bytes(buffer[position:end + 1])
                position = end + 1
                if not line.strip():
                    continue
                reply = sidecar._answer(connection, line)
                if type(reply) is not bytes:  # it must wait: later lines wait behind it
                    self._waiting = asyncio.ensure_future(self._wait(reply))  # type: ignore[arg-type]
                    sidecar._handlers.add(self._waiting)
                    return
                if reply:  # empty: a protocol 2 success that needs no reply
                    replies.append(reply)
                    if len(replies) >= _HOLD_REPLIES:
                        self._write(replies)
        finally:
            if replies:
                self._write(replies)
            if position and not self._detached:  # else given back with the rest
                del buffer[:position]
                self._budget.release(position)
        if self._ended and self._waiting is None:
            self._finish()

    async def _wait(self, pending: Coroutine[object, object, bytes]) -> None:
        try:
            reply = await pending
        finally:
            task = self._waiting
            self._waiting = None
            self._sidecar._handlers.discard(task)
        if reply:
            self._write([reply])
        if self._detached:  # refused meanwhile: nothing more to read
            self._finish()
        else:
            self._handle_lines()

    def _write(self, replies: list[bytes]) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(replies[0] if len(replies) == 1 else b"".join(replies))
        replies.clear()

    def _too_long(self, replies: list[bytes]) -> None:
        if replies:  # the answers to the lines before it go first
            self._write(replies)
        self._refuse(p.encode_error(None, p.LINE_TOO_LONG, "a request line is limited to "
                                    f"{self._max_line} bytes; the connection closes (its "
                                    "open batches too)"))

    def _refuse(self, reply: bytes) -> None:
        self._write([reply])
        self._ended = True
        self._detach()
        if self._waiting is None:
            self._finish()

    def _finish(self) -> None:
        """No more requests: close the connection's open batches, then the socket."""
        if self._finished:
            return
        self._finished = True
        self._detach()
        sidecar = self._sidecar
        try:
            if sidecar._snapshot_holds:
                from agent.sidecar._snapshot_ops import release_hold

                release_hold(sidecar, sidecar._snapshot_holds, self.connection)
            sidecar._close_batches(self.connection, "the client disconnected")
        finally:
            sidecar._connections.pop(self.connection, None)

    def _detach(self) -> None:
        """Give the buffered bytes back to the budget and close the socket."""
        if self._detached:
            return
        self._detached = True
        budget = self._budget
        budget.readers.discard(self)
        budget.paused.discard(self)
        left = len(self._buffer)
        self._buffer.clear()
        budget.release(left)
        if self._transport is not None:
            self._transport.close()

    def close(self) -> None:
        """Shutdown: read no more requests; close once the one waiting (if any) ends."""
        self._ended = True
        if self._waiting is None:
            self._finish()
        elif self._transport is not None:
            self._transport.pause_reading()


class SidecarSocketError(OSError):
    """The socket path cannot be listened on; the message says why and what to do."""


class SidecarAddressInUse(SidecarSocketError):
    """Another sidecar already listens on the socket path."""


@dataclass(eq=False)
class _Connection:
    number: int
    client: str = ""
    greeted: bool = False
    durable: bool = False  # closes answer once durable in the sink (hello's "durable")
    quiet: bool = False  # protocol 2: no reply to a successful events or plain close
    batches: dict[str, _Batch] = field(default_factory=dict)


class Sidecar(_Capture):
    """The capture core (sequencer, shipping) serving clients on a Unix socket.

    ``Sidecar(sink, on_quiescence=..., grace_period=5.0, max_line=16 MiB,
    **agent_options)`` takes the options of ``Agent`` (no store), except that
    ``max_quiescence_interval`` defaults to ``DEFAULT_MAX_QUIESCENCE_INTERVAL`` (0.1 s;
    ``None`` turns forced quiescence off).
    ``await sidecar.serve(path)`` serves until ``stop()`` (thread-safe) or, with
    ``handle_signals=True``, SIGTERM or SIGINT.
    """

    def __init__(self, sink: Sink, *, grace_period: float = 5.0, max_line: int = MAX_LINE,
                 max_buffered: int = MAX_BUFFERED, **options: object) -> None:
        if max_buffered < max_line:
            raise ValueError(f"max_buffered ({max_buffered}) must be at least max_line "
                             f"({max_line}): one whole request must fit")
        options.setdefault("max_quiescence_interval", DEFAULT_MAX_QUIESCENCE_INTERVAL)
        super().__init__(sink, **options)  # type: ignore[arg-type]
        self._budget = _Budget(max_buffered)
        self._shipper.put_wait = 0.0  # never block the loop; open waits for room instead
        self.grace_period = grace_period
        self.max_line = max_line
        self._connections: dict[_Connection, _Session] = {}
        self._handlers: set[asyncio.Future[None]] = set()  # requests that wait
        self._snapshot_holds: set[int] = set()  # connections holding writers (baselines)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._batch_closed: asyncio.Event | None = None
        self._next_connection = 0
        self.stopping = threading.Event()  # set once shutdown refuses new batches

    # -- lifecycle -----------------------------------------------------------------------

    async def serve(self, socket_path: str | os.PathLike[str], *,
                    started: Callable[[], None] | None = None,
                    handle_signals: bool = False, socket_mode: int = SOCKET_MODE) -> None:
        """Listen on ``socket_path`` until ``stop()``, then shut down gracefully.

        A stale socket file (nothing listening) is replaced; a live one raises
        ``SidecarAddressInUse``, a path that cannot be a socket ``SidecarSocketError``.
        The socket file gets ``socket_mode`` (default 0o660: owner and group may
        connect) before it accepts connections. ``started()`` runs once the socket
        accepts connections.

        Shutdown order:
        # Step 1. Stop accepting connections.
        # Step 2. Refuse new batches (``open`` answers ``closing``).
        # Step 3. Wait up to ``grace_period`` for the open batches to close.
        # Step 4. Close the batches still open (a warning names them) and every
        #         connection.
        # Step 5. Flush the sink and close it.
        # Step 6. Remove the socket file.
        """
        path = Path(socket_path)
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._stop_event = asyncio.Event()
        self._batch_closed = asyncio.Event()
        _remove_stale_socket(path)

        def connection_protocol() -> _Session:
            self._next_connection += 1
            return _Session(self, self._next_connection)

        listener = _bind(path, socket_mode)
        try:
            server = await loop.create_unix_server(connection_protocol, sock=listener)
        except BaseException:
            listener.close()
            with contextlib.suppress(OSError):
                path.unlink()
            raise
        inode = path.stat().st_ino
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._stop_event.set)
        log.info("cdc.sidecar_listening", socket=str(path), domain_id=f"{self.domain_id:016x}")
        try:
            if started is not None:
                started()
            await self._stop_event.wait()
            log.info("cdc.sidecar_stopping", open_batches=self._open_batch_names())
        finally:
            if handle_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
            # Step 1.
            server.close()
            await asyncio.sleep(0)  # connections accepted just now: let their tasks start
            # Step 2.
            with self._cond:
                self._closing = True
                self._cond.notify_all()
                self._wake_async_waiters()
            self.stopping.set()
            try:
                # Step 3.
                await self._wait_for_batches(self.grace_period)
                # Step 4.
                for connection in list(self._connections):
                    self._close_batches(connection, "the sidecar is shutting down")
                for session in list(self._connections.values()):
                    session.close()
                if self._handlers:
                    await asyncio.wait(set(self._handlers), timeout=self.grace_period + 5)
                # Step 5.
                try:
                    await loop.run_in_executor(
                        None, functools.partial(self.close, self.grace_period + 60))
                except BaseException:
                    # Shipping failed, or a batch could not close: the log is incomplete.
                    # Release the sink anyway; the caller sees the error.
                    self._shipper.stop(5.0)
                    with contextlib.suppress(Exception):
                        self._sink.close()
                    raise
            finally:
                # Step 6.
                with contextlib.suppress(OSError):
                    if path.stat().st_ino == inode:
                        path.unlink()
                log.info("cdc.sidecar_stopped", socket=str(path), **self.stats)

    @property
    def buffered_bytes(self) -> int:
        """Bytes of requests received and not yet handled, over all connections."""
        return self._budget.used

    def stop(self) -> None:
        """Ask ``serve()`` to shut down (from any thread)."""
        loop, event = self._loop, self._stop_event
        if loop is None or event is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop already ended
            loop.call_soon_threadsafe(event.set)

    async def _wait_for_batches(self, timeout: float) -> None:
        assert self._batch_closed is not None
        deadline = time.monotonic() + timeout
        while any(c.batches for c in self._connections):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._batch_closed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._batch_closed.wait(), remaining)

    def _open_batch_names(self) -> list[str]:
        return [name for c in self._connections for name in c.batches]

    # -- connections ---------------------------------------------------------------------

    def _answer(self, connection: _Connection,
                line: bytes) -> bytes | Coroutine[object, object, bytes]:
        """The reply line to one request line (errors become error replies), or, for a
        request that must wait, a coroutine that returns it."""
        try:
            request = p.parse_request(line)
        except p.ProtocolError as exc:
            if connection.batches:  # maybe a report of writes made: now lost
                self._log_may_lack_writes(f"a request was refused: {exc.message}")
            return p.encode_error(exc.request_id, exc.code, exc.message)
        except Exception as exc:  # a parser bug: still one reply, the connection stays
            log.exception("cdc.sidecar_internal_error", connection=connection.number)
            self._log_may_lack_writes(f"a request failed to parse: {exc!r}")
            return p.encode_error(None, p.INTERNAL, f"the sidecar failed to parse the "
                                  f"request: {exc!r}")
        try:
            reply = self._handle(connection, request)
        except Exception as exc:
            if type(request) is p.Events or type(request) is p.Close:
                self._log_may_lack_writes(f"a report of writes was refused: {exc!r}")
            return self._error_reply(connection, request.id, exc)
        if type(reply) is bytes:
            return reply
        return self._answer_later(connection, request.id, reply)  # type: ignore[arg-type]

    async def _answer_later(self, connection: _Connection, request_id: p.RequestId,
                            pending: Coroutine[object, object, bytes]) -> bytes:
        try:
            return await pending
        except Exception as exc:
            return self._error_reply(connection, request_id, exc)

    def _error_reply(self, connection: _Connection, request_id: p.RequestId,
                     exc: Exception) -> bytes:
        """The failure reply for ``exc``, raised handling a request."""
        if isinstance(exc, p.ProtocolError):
            return p.encode_error(request_id, exc.code, exc.message)
        for kind, code in ((AgentClosed, p.CLOSING), (QuiescenceTimeout, p.QUIESCENCE_TIMEOUT),
                           (ShippingFailed, p.SHIPPING_FAILED),
                           (ShippingBackpressure, p.BACKPRESSURE)):
            if isinstance(exc, kind):
                return p.encode_error(request_id, code, str(exc))
        # A sidecar bug: answer it, keep the connection.
        log.error("cdc.sidecar_internal_error", connection=connection.number,
                  exc_info=exc)
        return p.encode_error(request_id, p.INTERNAL, f"the sidecar failed: {exc!r}")

    def _handle(self, connection: _Connection,
                request: p.Request) -> bytes | Coroutine[object, object, bytes]:
        """The reply to ``request``, or a coroutine returning it if it must wait."""
        kind = type(request)
        if kind is p.Events or kind is p.Close:
            if not connection.greeted:
                raise self._hello_required()
            return self._report(connection, request)  # type: ignore[arg-type]
        if kind is p.Open:
            if not connection.greeted:
                raise self._hello_required()
            batch = self._try_open()
            if batch is None:  # held back (forced quiescence, a baseline, a full queue)
                return self._open_later(connection, request.id)
            return self._opened(connection, request.id, batch)
        if kind is p.Health:
            return self._health(request)  # type: ignore[arg-type]
        if kind is p.Hello:
            assert isinstance(request, p.Hello)
            if request.protocol not in p.SUPPORTED_PROTOCOLS:
                raise p.ProtocolError(p.UNSUPPORTED_PROTOCOL,
                                      f"protocol {request.protocol} is not supported; this "
                                      "sidecar speaks "
                                      f"{' and '.join(map(str, p.SUPPORTED_PROTOCOLS))}")
            connection.greeted = True
            connection.client = request.client
            connection.durable = request.durable
            connection.quiet = request.protocol >= 2
            return p.encode_reply(request.id, protocol=request.protocol,
                                  domain_id=f"{self.domain_id:016x}", server="cdc-agent")
        if not connection.greeted:
            raise self._hello_required()
        if kind is p.Ping:
            return p.encode_reply(request.id)
        if kind is p.Flush:
            return self._flushed(request.id)
        from agent.sidecar._snapshot_ops import handle_snapshot  # a baseline's request

        return handle_snapshot(self, self._snapshot_holds, connection,
                               request)  # type: ignore[arg-type]

    @staticmethod
    def _hello_required() -> p.ProtocolError:
        return p.ProtocolError(p.HELLO_REQUIRED, "send {\"op\": \"hello\", \"protocol\": "
                               f"{p.PROTOCOL_VERSION}}} first")

    def _try_open(self) -> _Batch | None:
        """A new batch if one may open now, else ``None`` (``_aopen`` waits for it)."""
        self._check_shipping()
        if not self._shipper.has_room():
            return None
        with self._cond:
            self._check_open()
            ticket = (None if self._hold
                      else self._sequencer.open_batch(self._next_id(), self._clock_ns()))
            if ticket is None:
                return None
            self.stats["batches"] += 1
        return _Batch(ticket)

    async def _open_later(self, connection: _Connection, request_id: p.RequestId) -> bytes:
        return self._opened(connection, request_id, await self._aopen())

    @staticmethod
    def _opened(connection: _Connection, request_id: p.RequestId, batch: _Batch) -> bytes:
        name = f"{batch.ticket.batch_id:016x}"
        connection.batches[name] = batch
        return p.encode_reply(request_id, batch=name)

    def _report(self, connection: _Connection,
                request: p.Events | p.Close) -> bytes | Coroutine[object, object, bytes]:
        target = connection.batches.get(request.batch)
        if target is None:
            raise p.ProtocolError(p.UNKNOWN_BATCH, f"batch {request.batch!r} is not open "
                                  "on this connection (closed already, or opened on "
                                  "another one?)")
        events = target.events
        for event in request.events:  # Agent._record, inlined: the hot path
            events.append(event)
            if len(events) == SEGMENT_EVENTS:
                self._ship_segment(target)
                events = target.events
        count = target.seq_start + len(target.events)
        if type(request) is p.Close:
            del connection.batches[request.batch]
            self._close_batch(target)
            durable = connection.durable if request.durable is None else request.durable
            if durable:  # answer once the batch's records are durable in the sink
                return self._durably_closed(request.id, count)
        if connection.quiet:
            return b""  # protocol 2: success needs no reply
        return p.encode_reply(request.id, events=count)

    async def _durably_closed(self, request_id: p.RequestId, count: int) -> bytes:
        await self._durable()
        return p.encode_reply(request_id, events=count, durable=True)

    async def _flushed(self, request_id: p.RequestId) -> bytes:
        await self._durable()
        return p.encode_reply(request_id)

    def health_problem(self) -> str | None:
        """Why the sidecar cannot capture now, or ``None`` when it can."""
        shipper = self._shipper
        if shipper.error is not None:
            return (f"shipping to the sink failed ({shipper.error!r}); the log misses "
                    "records from then on: restart the sidecar with a working sink")
        if self.stopping.is_set():
            return "the sidecar is shutting down"
        if not shipper.alive:
            return "the shipping thread is not running"
        behind = shipper.behind_since
        if behind is not None and time.monotonic() - behind > self._backpressure_timeout:
            return (f"the sink has refused records for {time.monotonic() - behind:.0f}s "
                    f"({shipper.pending()} queued); new batches are refused: check the "
                    "sink (its store or brokers)")
        return None

    def _health(self, request: p.Health) -> bytes:
        problem = self.health_problem()
        if problem is not None:
            raise p.ProtocolError(p.UNHEALTHY, problem)
        shipper = self._shipper
        return p.encode_reply(
            request.id, healthy=True, open_batches=sum(len(c.batches) for c in
                                                       self._connections),
            connections=len(self._connections), queue_depth=shipper.pending(),
            last_quiescence_age=round(time.monotonic() - shipper.last_quiescent_at, 3),
            batches=self._batches_closed, events=shipper.shipped_events)

    async def _durable(self) -> None:
        """Wait, without blocking the loop, until every record handed to the shipper so
        far is durable in the sink (concurrent waits share one sink flush)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def settle(error: BaseException | None) -> None:
            if done.done():
                return
            if error is None:
                done.set_result(None)
            else:
                done.set_exception(ShippingFailed(
                    f"shipping to the sink failed ({error!r}); the records of this batch "
                    "may not be durable"))

        def flushed(error: BaseException | None) -> None:  # on the shipping thread
            with contextlib.suppress(RuntimeError):  # the loop ended: nobody waits
                loop.call_soon_threadsafe(settle, error)

        self._shipper.request_flush(flushed)
        await done

    def _close_batch(self, batch: _Batch) -> None:
        self._close(batch)
        assert self._batch_closed is not None
        self._batch_closed.set()

    def _close_batches(self, connection: _Connection, reason: str) -> None:
        """Close the connection's open batches: their reported events are real writes."""
        if not connection.batches:
            return
        batches, connection.batches = connection.batches, {}
        events = sum(b.seq_start + len(b.events) for b in batches.values())
        for name, batch in batches.items():  # first close them, then say so
            try:
                self._close_batch(batch)
            except Exception:  # shipping failed, or an on_quiescence hook: logged, go on
                log.exception("cdc.sidecar_close_failed", batch=name)
        log.warning("cdc.sidecar_closed_orphaned_batches", reason=reason,
                    connection=connection.number, client=connection.client,
                    batches=sorted(batches), events=events)
        # Its client may have written the store and died before reporting: the log may
        # lack writes, so no journal may say closed (one adopted later neither).
        self._log_may_lack_writes(f"a batch was left open: {reason}")


def _bind(path: Path, mode: int) -> socket.socket:
    """A Unix socket bound at ``path`` with ``mode``, not yet listening (so no client
    connects before the mode is set)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
    except FileNotFoundError:
        sock.close()
        raise SidecarSocketError(f"cannot create the socket {path}: the folder "
                                 f"{path.parent} does not exist; create it first") from None
    except PermissionError:
        sock.close()
        raise SidecarSocketError(f"cannot create the socket {path}: no permission to write "
                                 f"in {path.parent}; choose a folder this user can write "
                                 "(or fix its permissions)") from None
    except OSError as exc:
        sock.close()
        raise SidecarSocketError(f"cannot create the socket {path}: {exc.strerror or exc}"
                                 ) from exc
    try:
        os.chmod(path, mode)
    except OSError as exc:
        sock.close()
        with contextlib.suppress(OSError):
            path.unlink()
        raise SidecarSocketError(f"cannot set mode {mode:o} on the socket {path}: "
                                 f"{exc.strerror or exc}") from exc
    sock.setblocking(False)
    return sock


def _remove_stale_socket(path: Path) -> None:
    """Remove a socket file nobody listens on; refuse a live one or a non-socket."""
    if len(os.fsencode(path)) > _MAX_SOCKET_PATH:
        raise SidecarSocketError(f"socket path {path} is {len(os.fsencode(path))} bytes; "
                                 f"Unix sockets allow at most {_MAX_SOCKET_PATH}: choose a "
                                 "shorter path (e.g. under /run or /tmp)")
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    except OSError as exc:  # a parent is not a folder, or may not be searched
        raise SidecarSocketError(f"cannot use the socket path {path}: "
                                 f"{exc.strerror or exc}") from exc
    if not stat.S_ISSOCK(mode):
        raise SidecarAddressInUse(f"{path} exists and is not a socket; choose another path "
                                  "or remove it")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            path.unlink(missing_ok=True)  # stale: its sidecar is gone
            return
        except PermissionError:
            raise SidecarSocketError(f"the socket {path} exists and this user may not "
                                     "connect to it (another user's sidecar?); choose "
                                     "another --socket") from None
    raise SidecarAddressInUse(f"a sidecar already listens on {path}; stop it first or "
                              "choose another --socket")
