"""The wal3 writer: batches appends into fragments and links them into the manifest.

Three kinds of thread share one condition variable:

- the *batcher* cuts the queue into batches (by size, by age, when the pipeline is idle,
  or on ``flush``) and gives each the next sequence number and offsets;
- up to ``max_in_flight`` *uploaders* encode and PUT fragments (If-None-Match), so
  fragment N+1 uploads while N's manifest update runs;
- the *applier* links uploaded fragments into the manifest strictly in sequence order,
  several per compare-and-swap when they are ready together, acknowledges them, and
  rolls the manifest into snapshots when it grows past the thresholds.

When anything goes wrong (another writer took a sequence number, the manifest changed
under us, the store failed) the applier *reconciles*: it lets the uploads in flight
finish, re-reads the manifest, adopts orphaned fragments, acknowledges whatever the
manifest now holds, re-queues records whose fragment never reached storage, and fails
(``LogContention``, possibly in the log, never twice) only records whose fragment is
stored but stranded. An acknowledged append is in the manifest: nothing is ever
acknowledged before the compare-and-swap that links it succeeds.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import Any, Final

import structlog

from sinks._setsum import Setsum
from sinks.objstore import ObjectStore
from sinks.wal3._errors import (
    AlreadyInitialized,
    CorruptManifest,
    LogBackpressure,
    LogClosed,
    LogContention,
    LogSealed,
    LogUnavailable,
    Wal3Error,
)
from sinks.wal3._fragment import encode_fragment
from sinks.wal3._manifest import Fragment, LogPosition, Manifest, SnapshotOptions
from sinks.wal3._ops import (
    initialize_manifest,
    install_snapshot,
    require_manifest,
    roll_forward,
    seal_manifest,
)
from sinks.wal3._paths import MANIFEST_PATH, fragment_path
from sinks.wal3._store import LogStore, PreconditionFailed, as_store

__all__ = ["LogWriter", "WriterOptions", "default_writer_name"]

log = structlog.get_logger()

_UPLOADING: Final = "uploading"
_UPLOADED: Final = "uploaded"
_CONFLICT: Final = "conflict"  # another object holds our sequence number
_FAILED: Final = "failed"

_RUNNING: Final = "running"
_RECOVERING: Final = "recovering"
_CLOSED: Final = "closed"
_SEALED: Final = "sealed"
_DEAD: Final = "dead"


def default_writer_name() -> str:
    return f"cdc-agent wal3 {socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True, slots=True)
class WriterOptions:
    """How a writer batches, pipelines and pushes back.

    A batch is cut when it holds ``batch_size_bytes`` or ``batch_size_records``, when its
    oldest record waited ``batch_interval`` seconds, when ``flush`` asks, or (with
    ``ship_when_idle``) at once when no fragment is in flight (group commit).
    ``max_pending_bytes``/``max_pending_records`` bound what is queued or in flight;
    an append beyond them waits up to ``backpressure_timeout`` seconds (``None``: for
    ever, ``0``: not at all) and then raises ``LogBackpressure``.
    """

    batch_size_bytes: int = 4 << 20
    batch_size_records: int = 1 << 16
    batch_interval: float = 0.02
    ship_when_idle: bool = True
    max_in_flight: int = 8
    max_pending_bytes: int = 256 << 20
    max_pending_records: int = 1 << 20
    backpressure_timeout: float | None = 30.0
    snapshots: SnapshotOptions = field(default_factory=SnapshotOptions)
    max_contention_retries: int = 16
    store_retries: int = 4

    def __post_init__(self) -> None:
        if self.max_in_flight < 1 or self.batch_size_bytes < 1 or self.batch_size_records < 1:
            raise ValueError("max_in_flight and the batch sizes must be at least 1")


class _Batch:
    __slots__ = ("bodies", "data", "error", "members", "nbytes", "seq_no", "setsum", "start",
                 "status", "timestamp_us")

    def __init__(self, seq_no: int, start: int, timestamp_us: int, bodies: list[bytes],
                 members: list[tuple[_Group, int]], nbytes: int) -> None:
        self.seq_no = seq_no
        self.start = start
        self.timestamp_us = timestamp_us
        self.bodies = bodies
        self.members = members
        self.nbytes = nbytes
        self.data: bytes | None = None
        self.setsum: Setsum | None = None
        self.status = _UPLOADING
        self.error: BaseException | None = None

    @property
    def limit(self) -> int:
        return self.start + len(self.bodies)

    def fragment(self) -> Fragment:
        assert self.data is not None and self.setsum is not None
        return Fragment(fragment_path(self.seq_no), self.seq_no, self.start, self.limit,
                        len(self.data), self.setsum)

    def matches(self, fragment: Fragment | None) -> bool:
        return (fragment is not None and self.setsum is not None
                and fragment.setsum == self.setsum and fragment.start == self.start
                and fragment.limit == self.limit)


def _sealed(where: str, offset: int, what: str = "") -> LogSealed:
    return LogSealed(
        f"log {where} is sealed at offset {offset}{what}; continue in a new log "
        f"initialized with initial_offset={offset} (sinks.wal3.continue_log)"
    )


class _Group:
    """The records of one ``submit`` call and the one future that reports on them all.

    One future per call, not per record: creating and resolving futures was most of
    the writer's cost per small record. A single-record group resolves to the
    position, a larger one to the list of positions; a group fails as a whole.
    """

    __slots__ = ("future", "positions", "remaining", "single")

    def __init__(self, size: int, single: bool) -> None:
        self.future: Future[Any] = Future()
        self.positions: list[LogPosition | None] = [None] * size
        self.remaining = size
        self.single = single

    def ack(self, index: int, position: LogPosition) -> None:
        self.positions[index] = position
        self.remaining -= 1
        if self.remaining == 0:
            with contextlib.suppress(InvalidStateError):
                self.future.set_result(position if self.single else self.positions)

    def fail(self, exc: BaseException) -> None:
        with contextlib.suppress(InvalidStateError):
            self.future.set_exception(exc)


class LogWriter:
    """Appends records to a wal3 log. Thread-safe; use ``open``/``initialize``."""

    # -- opening ------------------------------------------------------------------------

    @classmethod
    def initialize(
        cls, store: ObjectStore | str, prefix: str = "", *, writer_name: str | None = None,
        initial_offset: int | None = None, initial_seq_no: int | None = None,
    ) -> Manifest:
        """Create an empty log (If-None-Match on the manifest); ``AlreadyInitialized`` if
        one is there. ``initial_offset`` continues the offsets of a sealed log."""
        logstore = LogStore(as_store(store), prefix)
        manifest = Manifest.new_empty(writer_name or default_writer_name(),
                                      initial_offset=initial_offset,
                                      initial_seq_no=initial_seq_no)
        initialize_manifest(logstore, manifest)
        return manifest

    @classmethod
    def open(
        cls, store: ObjectStore | str, prefix: str = "", *,
        options: WriterOptions | None = None, clock: Callable[[], float] = time.time,
        writer_name: str | None = None, sleep: Callable[[float], None] = time.sleep,
    ) -> LogWriter:
        """Open an initialized log for writing, adopting orphaned fragments first."""
        options = options or WriterOptions()
        name = writer_name or default_writer_name()
        logstore = LogStore(as_store(store), prefix, retries=options.store_retries, sleep=sleep)
        manifest, etag = require_manifest(logstore)
        if manifest.sealed:
            raise _sealed(logstore.describe(), manifest.next_offset)
        manifest, etag, _ = roll_forward(logstore, manifest, etag, name)
        return cls(logstore, manifest, etag, options, clock, name, sleep)

    @classmethod
    def open_or_initialize(
        cls, store: ObjectStore | str, prefix: str = "", **kwargs: object
    ) -> LogWriter:
        store = as_store(store)
        with contextlib.suppress(AlreadyInitialized):
            cls.initialize(store, prefix, writer_name=kwargs.get("writer_name"))  # type: ignore[arg-type]
        return cls.open(store, prefix, **kwargs)  # type: ignore[arg-type]

    def __init__(self, logstore: LogStore, manifest: Manifest, etag: str,
                 options: WriterOptions, clock: Callable[[], float], name: str,
                 sleep: Callable[[float], None]) -> None:
        self.options = options
        self.name = name
        self._log = logstore
        self._clock = clock
        self._sleep = sleep
        self._cv = threading.Condition(threading.Lock())
        self._manifest = manifest
        self._etag = etag
        self._next_seq = manifest.next_seq_no
        self._next_offset = manifest.next_offset
        self._pending: deque[tuple[bytes, _Group, int]] = deque()
        self._pending_bytes = 0
        self._held_bytes = 0
        self._held_records = 0
        self._oldest_at: float | None = None
        self._enqueued = 0
        self._dequeued = 0
        self._flush_target = 0
        self._batches: dict[int, _Batch] = {}
        self._uploading = 0
        self._state = _RUNNING
        self._contention = 0
        self._error: BaseException | None = None
        self._closing = False
        self._pool = ThreadPoolExecutor(options.max_in_flight, thread_name_prefix="wal3-upload")
        self._threads = [
            threading.Thread(target=self._guard(self._run_batcher), name="wal3-batcher",
                             daemon=True),
            threading.Thread(target=self._guard(self._run_applier), name="wal3-applier",
                             daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    # -- public API ---------------------------------------------------------------------

    @property
    def manifest(self) -> Manifest:
        """The last manifest this writer installed or read."""
        with self._cv:
            return self._manifest

    @property
    def store(self) -> LogStore:
        return self._log

    def submit(self, body: bytes, timeout: float | None = -1.0) -> Future[LogPosition]:
        """Queue one record; the future resolves to its position once durable."""
        group = _Group(1, single=True)
        self._enqueue([body], [group], timeout)
        return group.future

    def submit_many(self, bodies: Sequence[bytes],
                    timeout: float | None = -1.0) -> list[Future[LogPosition]]:
        """Queue records in order, all or none; one future per record."""
        groups = [_Group(1, single=True) for _ in bodies]
        self._enqueue(bodies, groups, timeout)
        return [g.future for g in groups]

    def submit_batch(self, bodies: Sequence[bytes],
                     timeout: float | None = -1.0) -> Future[list[LogPosition]]:
        """Queue records in order, all or none; one future for all of them, resolving
        to their positions once every one is durable (the cheap way to append many)."""
        group = _Group(len(bodies), single=False)
        if not bodies:
            group.future.set_result([])
            return group.future
        self._enqueue(bodies, [group], timeout)
        return group.future

    def _enqueue(self, bodies: Sequence[bytes], groups: list[_Group],
                 timeout: float | None) -> None:
        """Queue records (blocking while the queue is full, up to ``timeout``; default:
        the options' ``backpressure_timeout``), then raise ``LogBackpressure``."""
        if timeout is not None and timeout < 0:
            timeout = self.options.backpressure_timeout
        bodies = [b if type(b) is bytes else bytes(b) for b in bodies]
        if len(groups) == 1:
            entries = [(body, groups[0], i) for i, body in enumerate(bodies)]
        else:
            entries = [(body, group, 0) for body, group in zip(bodies, groups, strict=True)]
        need = sum(len(b) for b in bodies)
        deadline = None if timeout is None else time.monotonic() + timeout
        opts = self.options
        with self._cv:
            while True:
                self._check_open()
                fits = (self._held_bytes + need <= opts.max_pending_bytes
                        and self._held_records + len(bodies) <= opts.max_pending_records)
                if fits or self._held_records == 0:
                    break
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise LogBackpressure(
                        f"wal3 writer for {self._log.describe()} holds {self._held_records} "
                        f"records ({self._held_bytes} bytes) not yet durable; nothing was "
                        "queued: retry later or raise the limits"
                    )
                self._cv.wait(remaining)
            if self._oldest_at is None:
                self._oldest_at = self._clock()
            self._pending.extend(entries)
            self._pending_bytes += need
            self._held_bytes += need
            self._held_records += len(bodies)
            self._enqueued += len(bodies)
            self._cv.notify_all()

    def append(self, body: bytes, timeout: float | None = None) -> LogPosition:
        """Append one record and wait until it is durable; return its position."""
        return self.submit(body).result(timeout)

    def append_many(self, bodies: Sequence[bytes],
                    timeout: float | None = None) -> list[LogPosition]:
        """Append records in order and wait until all are durable."""
        return self.submit_batch(bodies).result(timeout)

    def flush(self, timeout: float | None = None) -> None:
        """Ship everything queued now and wait until it is durable, or raise its error."""
        with self._cv:
            seen: dict[int, Future[Any]] = {}
            for _, group, _ in self._pending:
                seen[id(group)] = group.future
            for batch in self._batches.values():
                for group, _ in batch.members:
                    seen[id(group)] = group.future
            futures = list(seen.values())
            self._flush_target = self._enqueued
            self._cv.notify_all()
        _, not_done = wait_futures(futures, timeout)
        if not_done:
            raise LogBackpressure(
                f"flush: {len(not_done)} records not durable after {timeout}s; they stay queued"
            )
        for fut in futures:
            exc = fut.exception()
            if exc is not None:
                raise exc

    def wakeup(self) -> None:
        """Re-check batching deadlines now (for tests that drive an injected clock)."""
        with self._cv:
            self._cv.notify_all()

    def seal(self) -> Manifest:
        """Flush, then seal the log: no writer will append to it again."""
        self.flush()
        with self._cv:
            manifest, etag = self._manifest, self._etag
        sealed = seal_manifest(self._log, manifest, etag, self.name)
        with self._cv:
            self._manifest = sealed
            self._state = _SEALED
            self._fail_all(_sealed(self._log.describe(), sealed.next_offset))
            self._cv.notify_all()
        return sealed

    def close(self, timeout: float | None = 30.0) -> None:
        """Flush (best effort), stop the threads, fail what is left with ``LogClosed``."""
        with self._cv:
            if self._closing:
                return
            self._closing = True
            usable = self._state in (_RUNNING, _RECOVERING)
        if usable:
            with contextlib.suppress(Wal3Error):
                self.flush(timeout)
        with self._cv:
            if self._state in (_RUNNING, _RECOVERING):
                self._state = _CLOSED
            self._fail_all(LogClosed(f"wal3 writer for {self._log.describe()} was closed"))
            self._cv.notify_all()
        for thread in self._threads:
            thread.join(timeout)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> LogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals: shared ------------------------------------------------------------

    def _check_open(self) -> None:
        if self._state == _SEALED or self._manifest.sealed:
            raise _sealed(self._log.describe(), self._manifest.next_offset)
        if self._state == _DEAD:
            raise LogUnavailable(f"wal3 writer for {self._log.describe()} died: {self._error!r}")
        if self._state == _CLOSED or self._closing:
            raise LogClosed(f"wal3 writer for {self._log.describe()} is closed")

    def _release(self, nbytes: int, nrecords: int) -> None:
        self._held_bytes -= nbytes
        self._held_records -= nrecords

    def _fail_all(self, exc: Wal3Error) -> None:
        """Fail every queued and in-flight record (lock held)."""
        for batch in self._batches.values():
            for group, _ in batch.members:
                group.fail(exc)
            self._release(batch.nbytes, len(batch.bodies))
        self._batches.clear()
        self._fail_pending(exc)

    def _fail_pending(self, exc: Wal3Error) -> None:
        for body, group, _ in self._pending:
            group.fail(exc)
            self._release(len(body), 1)
        self._dequeued += len(self._pending)
        self._pending.clear()
        self._pending_bytes = 0
        self._oldest_at = None

    def _guard(self, target: Callable[[], None]) -> Callable[[], None]:
        """Run a thread body; if it dies, fail every record instead of hanging callers."""

        def run() -> None:
            try:
                target()
            except BaseException as exc:
                self._die(exc)

        return run

    def _die(self, exc: BaseException) -> None:
        log.error("wal3.writer_died", log=self._log.describe(), error=repr(exc))
        with self._cv:
            if self._state != _DEAD:
                self._state = _DEAD
                self._error = exc
            self._fail_all(LogUnavailable(
                f"wal3 writer for {self._log.describe()} stopped ({exc!r}); records not "
                "acknowledged may or may not be in the log; open a new writer"
            ))
            self._cv.notify_all()

    # -- internals: batcher -----------------------------------------------------------

    def _should_cut(self, now: float) -> bool:
        opts = self.options
        return (
            self._pending_bytes >= opts.batch_size_bytes
            or len(self._pending) >= opts.batch_size_records
            or self._dequeued < self._flush_target
            or (opts.ship_when_idle and not self._batches)
            or (self._oldest_at is not None and now - self._oldest_at >= opts.batch_interval)
            or self._closing
        )

    def _run_batcher(self) -> None:
        with self._cv:
            while True:
                if self._state in (_DEAD, _SEALED, _CLOSED):
                    return  # close() failed whatever was still queued
                timeout: float | None = 0.5
                if (self._state == _RUNNING and self._pending
                        and self._uploading < self.options.max_in_flight):
                    now = self._clock()
                    if self._should_cut(now):
                        batch = self._cut(now)
                        self._uploading += 1
                        self._pool.submit(self._guard(functools.partial(self._upload, batch)))
                        continue
                    assert self._oldest_at is not None
                    wait = self._oldest_at + self.options.batch_interval - now
                    timeout = min(max(wait, 0.001), 0.05)
                self._cv.wait(timeout)

    def _cut(self, now: float) -> _Batch:
        """Take the next batch off the queue (lock held)."""
        opts = self.options
        bodies: list[bytes] = []
        members: list[tuple[_Group, int]] = []
        nbytes = 0
        while self._pending and len(bodies) < opts.batch_size_records:
            body, group, index = self._pending[0]
            if bodies and nbytes + len(body) > opts.batch_size_bytes:
                break
            self._pending.popleft()
            bodies.append(body)
            members.append((group, index))
            nbytes += len(body)
        self._pending_bytes -= nbytes
        self._dequeued += len(bodies)
        self._oldest_at = self._clock() if self._pending else None
        batch = _Batch(self._next_seq, self._next_offset, int(now * 1_000_000), bodies,
                       members, nbytes)
        self._next_seq += 1
        self._next_offset += len(bodies)
        self._batches[batch.seq_no] = batch
        return batch

    # -- internals: uploaders -----------------------------------------------------------

    def _upload(self, batch: _Batch) -> None:
        """Encode and PUT one fragment (If-None-Match).

        A conflict whose stored bytes equal ours is our own earlier attempt (a retried
        PUT whose first answer was lost): that is success.
        """
        status, error = _FAILED, None
        try:
            data, setsum = encode_fragment(batch.start, batch.timestamp_us, batch.bodies)
            batch.data, batch.setsum = data, setsum
            path = fragment_path(batch.seq_no)
            try:
                self._log.put_if_absent(path, data)
                status = _UPLOADED
            except PreconditionFailed:
                got = self._log.get_or_none(path)
                status = _UPLOADED if got is not None and got[0] == data else _CONFLICT
        except Exception as exc:
            error = exc
        finally:
            with self._cv:
                batch.status, batch.error = status, error
                self._uploading -= 1
                self._cv.notify_all()

    # -- internals: applier -------------------------------------------------------------

    def _run_applier(self) -> None:
        while True:
            with self._cv:
                while True:
                    if self._state in (_DEAD, _SEALED):
                        return
                    if self._state == _CLOSED and not self._batches:
                        return
                    if self._batches:
                        lowest = self._batches[min(self._batches)]
                        if lowest.status != _UPLOADING:
                            break
                    self._cv.wait(0.5)
                ready: list[_Batch] = []
                if lowest.status == _UPLOADED:
                    seq = lowest.seq_no
                    while (seq in self._batches and self._batches[seq].status == _UPLOADED):
                        ready.append(self._batches[seq])
                        seq += 1
                manifest, etag = self._manifest, self._etag
            if ready and self._commit(ready, manifest, etag):
                self._maybe_snapshot()
            elif not ready:
                self._reconcile()

    def _commit(self, ready: list[_Batch], manifest: Manifest, etag: str) -> bool:
        """Link uploaded fragments into the manifest, then acknowledge their records.

        Durability order:
        Step 1. The fragments are already stored (If-None-Match), in sequence order.
        Step 2. Compare-and-swap the manifest that links them (If-Match on its etag).
        Step 3. Only now resolve the records' futures: they are durable.
        """
        try:
            new = manifest.apply_fragments([b.fragment() for b in ready], self.name)
        except CorruptManifest:
            self._reconcile()
            return False
        # Step 2.
        try:
            new_etag = self._log.put_if_match(MANIFEST_PATH, new.to_bytes(), etag)
        except (PreconditionFailed, LogUnavailable):
            self._after_lost_swap()
            return False
        # Step 3.
        with self._cv:
            self._manifest, self._etag = new, new_etag
            for batch in ready:
                self._acknowledge(batch)
            self._contention = 0
            self._cv.notify_all()
        return True

    def _acknowledge(self, batch: _Batch) -> None:
        """Resolve a batch whose fragment the manifest holds (lock held)."""
        if self._batches.pop(batch.seq_no, None) is None:
            return  # already failed by close() or a crash: reported as not acknowledged
        start = batch.start
        for i, (group, index) in enumerate(batch.members):
            group.ack(index, LogPosition(start + i))
        self._release(batch.nbytes, len(batch.bodies))

    def _after_lost_swap(self) -> None:
        """The manifest changed under us (or the swap's answer was lost). Re-read it; if
        it simply moved on without touching our sequence numbers (a garbage collection,
        a snapshot, an adoption of our own fragments), rebase and go on; else reconcile."""
        try:
            current, etag = require_manifest(self._log)
        except Wal3Error:
            self._reconcile()
            return
        with self._cv:
            if current.sealed:
                self._manifest = current
                self._state = _SEALED
                self._fail_all(_sealed(self._log.describe(), current.next_offset,
                                       " (records not acknowledged were not linked into it)"))
                self._cv.notify_all()
                return
            for seq in sorted(self._batches):
                batch = self._batches[seq]
                if batch.matches(current.fragment(seq)):
                    self._acknowledge(batch)
            if not self._batches:
                self._manifest, self._etag = current, etag
                self._next_seq, self._next_offset = current.next_seq_no, current.next_offset
                self._cv.notify_all()
                return
            lowest = self._batches[min(self._batches)]
            if lowest.seq_no == current.next_seq_no and lowest.start == current.next_offset:
                self._manifest, self._etag = current, etag
                self._cv.notify_all()
                return
        self._reconcile()

    def _reconcile(self) -> None:
        """Bring this writer back in line with the log after a failure or a lost race.

        Step 1. Stop cutting batches; let every upload in flight finish.
        Step 2. Re-read the manifest and adopt orphaned fragments (ours or anyone's).
        Step 3. Acknowledge batches the manifest now holds; re-queue, in order and ahead
                of newer records, batches whose fragment never reached storage; fail
                with ``LogContention`` those stored but stranded (never acknowledged,
                may appear once).
        Step 4. Resume from the manifest's next sequence number and offset.
        """
        # Step 1.
        with self._cv:
            if self._state not in (_RUNNING, _RECOVERING, _CLOSED):
                return
            prior = self._state
            if prior == _RUNNING:
                self._state = _RECOVERING
            while self._uploading:
                self._cv.wait(0.5)
            batches = [self._batches[s] for s in sorted(self._batches)]
        # Step 2.
        try:
            manifest, etag = require_manifest(self._log)
            if not manifest.sealed:
                manifest, etag, _ = roll_forward(self._log, manifest, etag, self.name)
        except Wal3Error as exc:
            with self._cv:
                self._fail_all(exc if isinstance(exc, LogUnavailable) else LogUnavailable(
                    f"could not re-read the log {self._log.describe()}: {exc}"))
                # Start again from the last manifest known; a stale one only costs a
                # lost swap (and a rebase) later.
                self._next_seq = self._manifest.next_seq_no
                self._next_offset = self._manifest.next_offset
                if self._state == _RECOVERING:
                    self._state = _RUNNING
                self._cv.notify_all()
            self._sleep(0.05)
            return
        # Step 3.
        acked: list[_Batch] = []
        requeue: list[_Batch] = []
        stranded: list[_Batch] = []
        for batch in batches:
            if batch.matches(manifest.fragment(batch.seq_no)):
                acked.append(batch)
            elif batch.status == _CONFLICT or batch.data is None:
                requeue.append(batch)
            else:
                got = self._log.get_or_none(fragment_path(batch.seq_no))
                (stranded if got is not None and got[0] == batch.data else requeue).append(batch)
        with self._cv:
            for batch in acked:
                self._acknowledge(batch)
            for batch in stranded:
                if self._batches.pop(batch.seq_no, None) is None:
                    continue
                error = LogContention(
                    f"fragment {fragment_path(batch.seq_no)} of {self._log.describe()} was "
                    "stored but another writer took the log past it; its "
                    f"{len(batch.bodies)} records were not acknowledged and may appear once"
                )
                for group, _ in batch.members:
                    group.fail(error)
                self._release(batch.nbytes, len(batch.bodies))
            closed = LogClosed(f"wal3 writer for {self._log.describe()} was closed")
            for batch in reversed(requeue):
                if self._batches.pop(batch.seq_no, None) is None:
                    continue
                if self._state != _RECOVERING:  # closed meanwhile: nobody would ship them
                    for group, _ in batch.members:
                        group.fail(closed)
                    self._release(batch.nbytes, len(batch.bodies))
                    continue
                for body, (group, index) in zip(reversed(batch.bodies),
                                                reversed(batch.members), strict=True):
                    self._pending.appendleft((body, group, index))
                self._pending_bytes += batch.nbytes
                self._dequeued -= len(batch.bodies)
            if self._pending and self._oldest_at is None:
                self._oldest_at = self._clock()
            # Step 4.
            self._manifest, self._etag = manifest, etag
            self._next_seq, self._next_offset = manifest.next_seq_no, manifest.next_offset
            self._contention = 0 if acked else self._contention + 1
            backoff = 0.0
            if manifest.sealed:
                self._state = _SEALED
                self._fail_all(_sealed(self._log.describe(), manifest.next_offset))
            elif self._contention > self.options.max_contention_retries:
                self._fail_pending(LogContention(
                    f"gave up on {self._log.describe()} after {self._contention} rounds of "
                    "contention with other writers; these records were not stored"
                ))
                self._contention = 0
            elif self._contention:
                backoff = random.uniform(0, min(0.1, 0.002 * 2 ** self._contention))
            if self._state == _RECOVERING:
                self._state = _RUNNING
            self._cv.notify_all()
        if requeue or stranded:
            log.info("wal3.reconciled", log=self._log.describe(), acked=len(acked),
                     requeued=len(requeue), stranded=len(stranded))
        if backoff:
            self._sleep(backoff)

    def _maybe_snapshot(self) -> None:
        """Roll the manifest's oldest pointers into a snapshot when it grew too big.

        Step 1. Write the snapshot (If-None-Match; content-addressed).
        Step 2. Compare-and-swap a manifest pointing at it. Losing that race is harmless:
                the snapshot is unreferenced and the next commit sees the new manifest.
        """
        with self._cv:
            manifest, etag = self._manifest, self._etag
        snapshot = manifest.generate_snapshot(self.options.snapshots, self.name)
        if snapshot is None:
            return
        try:
            # Step 1.
            install_snapshot(self._log, snapshot)
            new = manifest.apply_snapshot(snapshot)
            # Step 2.
            new_etag = self._log.put_if_match(MANIFEST_PATH, new.to_bytes(), etag)
        except (PreconditionFailed, Wal3Error):
            return
        with self._cv:
            if self._etag == etag:
                self._manifest, self._etag = new, new_etag
