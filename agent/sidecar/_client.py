"""The Python client of the sidecar: the ``Agent`` API over a store the caller owns.

``SidecarClient(socket_path, store)`` wraps a local relaxed store. Each write does the
store's atomic exchange itself, then reports the event to the sidecar, which sequences
and ships it. Batches are scoped by a ``ContextVar`` exactly like the library's:
``with client.batch():`` opens or joins a batch, a write outside any batch gets an
automatic one.

Each thread talks over its own connection (the sidecar answers a connection's requests
in order, and a batch waiting on forced quiescence must not hold up another thread's
batch); connections of threads that ended are closed when a new thread connects. A
batch belongs to the connection that opened it; its writes go there even from another
thread that copied the context.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TypeVar

from agent import _operations as operations
from agent._agent import AgentClosed, QuiescenceTimeout
from agent._scope import BatchScope
from agent._shipper import ShippingBackpressure, ShippingFailed
from agent._store import RelaxedStore
from agent.sidecar import _protocol as p
from sequencer import Absent, InvalidWrite, RowKey, Value

if TYPE_CHECKING:
    from agent._baseline import SnapshotProgress

__all__ = ["SidecarClient", "SidecarError", "SidecarUnavailable"]

T = TypeVar("T")


class SidecarError(RuntimeError):
    """The sidecar refused a request; ``code`` is its error code (docs/sidecar.md)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class SidecarUnavailable(SidecarError):
    """The sidecar cannot be reached, or the connection broke.

    Writes already made to the store stay made; events of a batch whose connection
    broke after they were reported are in the log (the sidecar closed the batch).
    """

    def __init__(self, message: str) -> None:
        super().__init__("unavailable", message)


_MAPPED: dict[str, Callable[[str], Exception]] = {
    p.INVALID_WRITE: InvalidWrite,
    p.CLOSING: AgentClosed,
    p.QUIESCENCE_TIMEOUT: QuiescenceTimeout,
    p.SHIPPING_FAILED: ShippingFailed,
    p.BACKPRESSURE: ShippingBackpressure,
}


_MAX_UNREAD = 512  # pipelined replies left unread at most (they are ~30 bytes each)


class _Connection:
    """One socket to the sidecar, under a lock. ``call`` waits for its reply; ``post``
    pipelines a request whose reply is read later (its error, if any, is raised by the
    next ``call``).

    Protocol 2 is asked for first (a sidecar that speaks only 1 refuses it, and the
    connection says hello again with 1): then a posted request that succeeds gets no
    reply at all, and a waited-for request carries an id, so that the lines read before
    its reply are the failures of posted requests.
    """

    def __init__(self, path: str, client: str, timeout: float | None,
                 durable: bool = False) -> None:
        self.path = path
        self.broken = False
        self._lock = threading.Lock()
        self._unread = 0  # protocol 1: replies of posted requests not read yet
        self._quiet = False  # protocol 2: posted requests that succeed get no reply
        self._posted = 0  # protocol 2: posted since the last waited-for request
        self._next_id = 0
        self._deferred: dict[str, Any] | None = None  # the first failed pipelined reply
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(path)
        except OSError as exc:
            sock.close()
            raise SidecarUnavailable(f"cannot connect to the sidecar at {path}: {exc}; "
                                     "is `cdc-agent sidecar` running there?") from exc
        self._sock = sock
        self._file = sock.makefile("rb")
        extra = {"durable": True} if durable else {}
        try:
            hello = self.call("hello", protocol=p.PROTOCOL_VERSION, client=client, **extra)
        except SidecarError as exc:
            if exc.code != p.UNSUPPORTED_PROTOCOL:
                raise
            hello = self.call("hello", protocol=1, client=client, **extra)  # an older sidecar
        self.protocol = int(hello.get("protocol", 1))
        self._quiet = self.protocol >= 2
        self.domain_id = int(hello["domain_id"], 16)

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send one request and return its (successful) reply."""
        reply, deferred = self.exchange(op, **fields)
        if deferred is not None:
            raise deferred
        if not reply["ok"]:
            raise _error(reply)
        return reply

    def exchange(self, op: str, **fields: Any) -> tuple[dict[str, Any], Exception | None]:
        """Send one request; return its reply (ok or not) and the error of a pipelined
        request that failed before it, if any (for a caller that must act on a
        successful reply whatever failed earlier)."""
        with self._lock:
            reply = self._round_trip(op, fields)
            deferred, self._deferred = self._deferred, None
        if deferred is not None:
            return reply, _error(deferred, "a pipelined request failed earlier: ")
        return reply, None

    def drain(self) -> Exception | None:
        """Read the replies of pipelined requests; return the first refusal among them."""
        with self._lock:
            if self.broken:
                return None
            try:
                if self._quiet:  # the failures of posted requests come before its reply
                    self._round_trip("ping", {})
                else:
                    self._read_unread("close")
            except SidecarUnavailable:
                return None
            deferred, self._deferred = self._deferred, None
        return None if deferred is None else _error(deferred, "a pipelined request failed: ")

    def post(self, op: str, **fields: Any) -> None:
        """Send one request without waiting for its reply.

        Once sent, the request reaches the sidecar even if this process dies next.
        """
        with self._lock:
            self._send(op, fields)
            if self._quiet:
                self._posted += 1
                if self._posted >= _MAX_UNREAD:  # failures must not pile up unread
                    self._round_trip("ping", {})
                return
            self._unread += 1
            if self._unread >= _MAX_UNREAD:  # keep the sidecar's replies flowing
                self._read_unread(op)

    def _round_trip(self, op: str, fields: dict[str, Any]) -> dict[str, Any]:
        """Under the lock: send a request and read its reply (ok or not); a failure of
        a posted request read on the way is kept in ``_deferred``."""
        if not self._quiet:
            self._send(op, fields)
            self._read_unread(op)
            return self._read(op)
        self._next_id += 1
        request_id = self._next_id
        self._send(op, fields, request_id)
        self._posted = 0
        while True:
            reply = self._read(op)
            if reply.get("id") == request_id:
                return reply
            if not reply["ok"] and self._deferred is None:  # a posted request failed
                self._deferred = reply

    def _send(self, op: str, fields: dict[str, Any], request_id: int | None = None) -> None:
        if self.broken:
            raise SidecarUnavailable(f"the connection to {self.path} broke earlier")
        try:
            self._sock.sendall(p.encode_request(op, request_id, **fields))
        except OSError as exc:
            self.broken = True
            raise SidecarUnavailable(f"the connection to the sidecar at {self.path} "
                                     f"failed during {op}: {exc}") from exc

    def _read_unread(self, op: str) -> None:
        while self._unread:
            reply = self._read(op)
            self._unread -= 1
            if not reply["ok"] and self._deferred is None:
                self._deferred = reply

    def _read(self, op: str) -> dict[str, Any]:
        try:
            line = self._file.readline()
        except OSError as exc:
            self.broken = True
            raise SidecarUnavailable(f"the connection to the sidecar at {self.path} "
                                     f"failed during {op}: {exc}") from exc
        if not line.endswith(b"\n"):
            self.broken = True
            raise SidecarUnavailable(f"the sidecar at {self.path} closed the connection "
                                     f"during {op}")
        return p.decode_reply(line)

    def close(self) -> None:
        self.broken = True
        self._file.close()
        self._sock.close()


def _error(reply: dict[str, Any], prefix: str = "") -> Exception:
    code, message = str(reply.get("error")), prefix + str(reply.get("message"))
    mapped = _MAPPED.get(code)
    return SidecarError(code, message) if mapped is None else mapped(message)


class _ClientBatch:
    __slots__ = ("connection", "depth", "durable", "name", "pending")

    def __init__(self, connection: _Connection, name: str) -> None:
        self.connection = connection
        self.name = name
        self.depth = 1
        self.durable = False
        self.pending: list[list[Any]] = []  # report="batch": encoded, not yet sent


_PENDING_MAX = 1024  # report="batch": events held before they are sent all the same


class _DurableScope(BatchScope):
    """``client.batch(durable=True)``: the batch (the outer one, when nested) closes
    only once its records are durable in the sink."""

    __slots__ = ()

    def __enter__(self) -> None:
        super().__enter__()
        assert isinstance(self._batch, _ClientBatch)
        self._batch.durable = True


class SidecarClient:
    """The ``Agent`` API, capturing through a sidecar: ``SidecarClient(path, store)``.

    Thread-safe. ``set``, ``delete``, ``clear_row``, ``update``, ``conditional_set`` and
    ``get`` behave as ``Agent``'s; the store is written here, the events are sent to
    the sidecar at the end of each call, before it returns. Inside a batch they are
    pipelined (not waited for), and so is a batch's close unless it is durable: the
    sidecar's refusal, unlikely since every value is checked here first, is raised by
    the next request waited for (the next ``open``, ``flush`` or ``close()`` at the
    latest).

    ``report="batch"``: the events of a batch's calls are held here and sent with its
    close (in runs of 1024 at most), one request per batch instead of one per call;
    faster, but a process that dies inside a batch leaves the writes it made in that
    batch out of the log (``report="call"``, the default, loses at most the call in
    flight).
    """

    def __init__(self, socket_path: str, store: RelaxedStore, *,
                 client_name: str = "python", timeout: float | None = None,
                 durable: bool = False, report: str = "call") -> None:
        if report not in ("call", "batch"):
            raise ValueError(f"report={report!r}: use \"call\" (each call's events are "
                             "sent before it returns) or \"batch\" (sent with the close)")
        self.socket_path = str(socket_path)
        self.store = store
        self.durable = durable
        self._per_batch = report == "batch"
        self._client_name = client_name
        self._timeout = timeout
        self._local = threading.local()
        self._all: list[tuple[threading.Thread, _Connection]] = []
        self._all_lock = threading.Lock()
        self._closed = False
        self._current: ContextVar[_ClientBatch | None] = ContextVar(
            f"cdc_sidecar_batch_{id(self):x}", default=None)
        self.domain_id = self._connection().domain_id  # fail early if unreachable

    # -- connections ---------------------------------------------------------------------

    def _connection(self) -> _Connection:
        connection: _Connection | None = getattr(self._local, "connection", None)
        if connection is None or connection.broken:
            if self._closed:
                raise AgentClosed("this SidecarClient is closed")
            connection = _Connection(self.socket_path, self._client_name, self._timeout,
                                     self.durable)
            with self._all_lock:
                live: list[tuple[threading.Thread, _Connection]] = []
                ended: list[tuple[threading.Thread, _Connection]] = []
                for owner, other in self._all:
                    if other.broken:
                        continue
                    (live if owner.is_alive() else ended).append((owner, other))
                live.append((threading.current_thread(), connection))
                self._all = live
            for _owner, other in ended:  # threads that ended: their batches ended too
                other.close()
            self._local.connection = connection
        return connection

    def close(self) -> None:
        """Close every connection (batches still open are closed by the sidecar).

        The replies of pipelined requests are read first: a refusal among them is
        raised once every connection is closed.
        """
        self._closed = True
        with self._all_lock:
            connections, self._all = self._all, []
        refused: Exception | None = None
        for _owner, connection in connections:
            error = connection.drain()
            refused = refused or error
            connection.close()
        if refused is not None:
            raise refused

    def __enter__(self) -> SidecarClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- batches -------------------------------------------------------------------------

    def batch(self, *, durable: bool = False) -> BatchScope:
        """A write batch for the block: ``with client.batch(): ...`` (joins an outer one).

        ``durable=True``: the block's end returns only once the batch's records are
        durable in the sidecar's sink (so does every close of a ``durable`` client).
        """
        return _DurableScope(self) if durable else BatchScope(self)

    def _close(self, batch: _ClientBatch) -> None:
        """Close a batch at the end of its outermost block (even when the body raised:
        the writes that took effect are real)."""
        self._send_close(batch, batch.pending)

    def _send_close(self, batch: _ClientBatch, events: list[list[Any]]) -> None:
        """Close ``batch`` with ``events`` (encoded) reported first; a durable close
        waits for its answer, any other is pipelined."""
        fields: dict[str, Any] = {"batch": batch.name}
        if events:
            fields["events"] = events
        if batch.durable:
            batch.connection.call("close", durable=True, **fields)
        elif self.durable:
            batch.connection.call("close", **fields)
        else:
            batch.connection.post("close", **fields)

    async def _aopen(self) -> _ClientBatch:
        raise TypeError("SidecarClient is synchronous: use `with client.batch():`")

    def _open(self) -> _ClientBatch:
        connection = self._connection()
        reply, deferred = connection.exchange("open")
        if not reply["ok"]:
            raise deferred or _error(reply)
        batch = _ClientBatch(connection, str(reply["batch"]))
        if deferred is not None:  # an earlier pipelined request failed: the batch opened
            connection.post("close", batch=batch.name)  # all the same, so close it
            raise deferred
        return batch

    def _apply(self, op: operations.Operation[T]) -> T:
        """Drive one operation (agent._operations) against the store in the batch in
        force, or an automatic one opened once its checks passed; report the events
        even if the store fails part way."""
        try:
            step = next(op)  # the checks: no batch opened, the store not touched yet
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        events: list[p.Event] = []
        batch = self._current.get()
        if batch is None:
            batch = self._open()
            try:
                return operations.run(self.store, op, step, events.append)
            finally:
                self._send_close(batch, [p.encode_event(e) for e in events])
        try:
            return operations.run(self.store, op, step, events.append)
        finally:
            if events:
                encoded = [p.encode_event(e) for e in events]
                if self._per_batch:  # held for the close, unless too many are held
                    batch.pending += encoded
                    encoded = []
                    if len(batch.pending) >= _PENDING_MAX:
                        encoded, batch.pending = batch.pending, []
                if encoded:  # pipelined: a refusal surfaces at the next waited-for request
                    batch.connection.post("events", batch=batch.name, events=encoded)

    def flush(self) -> None:
        """Wait until every event of every closed batch is durable in the sidecar's sink."""
        self._connection().call("flush")

    def snapshot(self, *, chunk_rows: int = 10_000,
                 progress: Callable[[SnapshotProgress], None] | None = None,
                 journal: str | None = None) -> dict[str, Any]:
        """Record every cell of the store as a baseline in the sidecar's log.

        For each chunk the sidecar holds new batches back (every client's) until the
        open ones end, this client reads the chunk from its store (``list_cells``) and
        reports it. Returns ``{"baseline", "chunks", "cells", "longest_hold",
        "recorded"}`` once the chunks are durable.

        With ``journal`` (an object store URI the sidecar can reach), the sidecar keeps
        the baseline's journal as ``Agent.snapshot(journal=...)`` does: its clean
        shutdown marks it closed, and a call that finds it closed takes nothing and
        returns the recorded baseline (``"recorded": True``). Call it at every start.
        """
        from agent.sidecar._snapshot_ops import client_snapshot

        return client_snapshot(self._connection().call, self.store, chunk_rows, progress,
                               journal)

    def ping(self) -> None:
        self._connection().call("ping")

    # -- writes --------------------------------------------------------------------------

    def set(self, table: str, row: RowKey, column: str, value: Value) -> Value | Absent:
        """Write one cell; return the value it replaced (ABSENT if it did not exist)."""
        return self._apply(operations.set_cell(table, row, column, value))

    def delete(self, table: str, row: RowKey, column: str) -> Value | Absent:
        """Remove one cell; return the value it held (ABSENT if none: no event)."""
        return self._apply(operations.delete_cell(table, row, column))

    def clear_row(self, table: str, row: RowKey) -> dict[str, Value]:
        """Remove every cell of a row, in one batch; return the values removed."""
        return self._apply(operations.clear_row(table, row))

    def update(self, table: str, rows: Iterable[RowKey],
               values: Mapping[str, Value]) -> None:
        """Set ``values`` on every row of ``rows``, in one batch (an SQL UPDATE)."""
        self._apply(operations.update(table, rows, values))

    def conditional_set(
        self, table: str,
        changes: Mapping[RowKey, Mapping[str, tuple[Value | Absent, Value | Absent]]],
    ) -> dict[RowKey, bool]:
        """Per row, swap each cell from ``expected`` to ``new``; return per-row success
        (a row stops at its first mismatch; its earlier swaps stay, as with ``Agent``)."""
        return self._apply(operations.conditional_set(table, changes))

    def get(self, table: str, row: RowKey, column: str) -> Value | Absent:
        """Read one cell from the store (no batch, no event)."""
        return self.store.get(table, row, column)
