"""The in-memory backend, with fault, latency and crash injection, for tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from sinks.objstore._errors import NotFound, PreconditionFailed
from sinks.objstore._faults import Call, FaultPlan, check_error
from sinks.objstore._keys import check_key, check_prefix

__all__ = ["InMemoryObjectStore"]

_T = TypeVar("_T")


class InMemoryObjectStore:
    """An object store in a dict: thread-safe, linearizable, with injectable faults.

    Every operation runs in this order::

        1. count the call (``call.n``), record it in ``calls``, call ``on_step(call)``
           with ``phase="before"``;
        2. apply the fault plan's before-phase rules: sleep for ``delay`` rules (through
           the injected ``sleep``, no lock held), raise for ``fail``/``crash`` rules;
        3. do the operation atomically under the store's lock;
        4. call ``on_step(call)`` with ``phase="after"``; then apply the after-phase
           rules (``fail(after=True)``: the write happened, the caller sees
           ``StoreUnavailable(may_have_applied=True)``; ``crash(after=True)``).

    Fault API (``store.faults`` is a ``FaultPlan``)::

        store.faults.fail("put_if_match", nth=3)            # 3rd CAS: transient failure
        store.faults.fail("put*", key="log/*", after=True)  # ambiguous: written, then error
        store.faults.fail("get", times=None, probability=0.1)  # 10% of gets, seeded
        store.faults.crash("put", key="manifest/*", after=True)  # Crash after the write
        store.faults.delay(0.5, "list")                     # sleep(0.5) before each list
        store.on_step = hook                                # hook(call) may raise Crash

    ``Crash`` is a ``BaseException``, so ``except Exception`` in the code under test
    does not swallow it. Pass ``sleep`` (a fake clock's) so delays cost no real time,
    and ``seed`` so probabilistic rules replay identically.

    Etags are ``"g<generation>"``, unique per write, so there is no ABA: rewriting the
    same bytes gives a new etag (S3 and the local store would keep it).
    """

    def __init__(self, name: str = "", *, seed: int = 0,
                 sleep: Callable[[float], None] = time.sleep,
                 on_step: Callable[[Call], None] | None = None) -> None:
        self.name = name
        self.faults = FaultPlan(seed=seed)
        self.on_step = on_step
        self.calls: list[Call] = []
        self._sleep = sleep
        self._objects: dict[str, tuple[bytes, str]] = {}
        self._generation = 0
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def describe(self) -> str:
        return f"memory://{self.name}"

    def get(self, key: str) -> tuple[bytes, str]:
        check_key(key)

        def op() -> tuple[bytes, str]:
            found = self._objects.get(key)
            if found is None:
                raise NotFound(f"no object {key!r} in {self.describe()}", key=key)
            return found
        return self._run("get", key, op)

    def head(self, key: str) -> str | None:
        check_key(key)

        def op() -> str | None:
            found = self._objects.get(key)
            return None if found is None else found[1]
        return self._run("head", key, op)

    def put(self, key: str, data: bytes) -> str:
        check_key(key)
        data = _as_bytes(data)
        return self._run("put", key, lambda: self._store(key, data))

    def put_if_absent(self, key: str, data: bytes) -> str:
        check_key(key)
        data = _as_bytes(data)

        def op() -> str:
            if key in self._objects:
                raise PreconditionFailed(
                    f"put_if_absent {key!r} in {self.describe()}: the key already exists; "
                    "nothing was written", key=key)
            return self._store(key, data)
        return self._run("put_if_absent", key, op)

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        check_key(key)
        data = _as_bytes(data)

        def op() -> str:
            found = self._objects.get(key)
            if found is None:
                raise PreconditionFailed(
                    f"put_if_match {key!r} in {self.describe()}: the key does not exist; "
                    "nothing was written", key=key)
            if found[1] != etag:
                raise PreconditionFailed(
                    f"put_if_match {key!r} in {self.describe()}: etag is {found[1]}, not "
                    f"{etag}; nothing was written (re-read and retry)", key=key)
            return self._store(key, data)
        return self._run("put_if_match", key, op)

    def list(self, prefix: str) -> list[str]:
        check_prefix(prefix)
        return self._run("list", prefix,
                         lambda: sorted(k for k in self._objects if k.startswith(prefix)))

    def delete(self, key: str) -> None:
        check_key(key)
        self._run("delete", key, lambda: self._objects.pop(key, None))

    # Testing helpers: these bypass faults and hooks.

    def objects(self) -> dict[str, bytes]:
        """A copy of every object, by key."""
        with self._lock:
            return {key: data for key, (data, _) in self._objects.items()}

    def count(self, op: str) -> int:
        """How many times ``op`` was called (faulted calls included)."""
        with self._lock:
            return self._counts.get(op, 0)

    def clear(self) -> None:
        """Forget every object (not the faults, hooks or call counts)."""
        with self._lock:
            self._objects.clear()

    # Internals.

    def _store(self, key: str, data: bytes) -> str:
        self._generation += 1
        etag = f"g{self._generation}"
        self._objects[key] = (data, etag)
        return etag

    def _run(self, op: str, key: str, action: Callable[[], _T]) -> _T:
        with self._lock:  # Step 1.
            n = self._counts.get(op, 0) + 1
            self._counts[op] = n
            before = Call(op, key, n, "before")
            self.calls.append(before)
        self._visit(before)  # Step 2.
        with self._lock:  # Step 3.
            result = action()
        self._visit(Call(op, key, n, "after"))  # Step 4.
        return result

    def _visit(self, call: Call) -> None:
        if self.on_step is not None:
            self.on_step(call)
        delay, error = self.faults.decide(call)
        if delay:
            self._sleep(delay)
        if error is not None:
            raise check_error(error)


def _as_bytes(data: bytes) -> bytes:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"object data must be bytes, not {type(data).__name__}")
    return bytes(data)
