"""The one boundary between wal3 and the object store.

``LogStore`` puts a log's prefix in front of every path, retries ``StoreUnavailable`` a
few times with backoff, and turns what is left into ``LogUnavailable``. ``NotFound`` and
``PreconditionFailed`` pass through: they are answers wal3 acts on, not failures.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any, Final, TypeVar

from sinks.objstore import (
    NotFound,
    ObjectStore,
    ObjectStoreError,
    PreconditionFailed,
    StoreUnavailable,
)
from sinks.wal3._errors import LogUnavailable
from sinks.wal3._paths import join

__all__ = ["LogStore", "NotFound", "PreconditionFailed", "as_store"]

T = TypeVar("T")
_BACKOFF: Final = (0.005, 0.02, 0.08, 0.3, 1.0)


def as_store(store_or_uri: ObjectStore | str, *, endpoint_url: str | None = None,
             **options: Any) -> ObjectStore:
    """An object store, opening ``store_or_uri`` with ``sinks.objstore`` if it is a URI."""
    if isinstance(store_or_uri, str):
        from sinks.objstore import open_store

        try:
            store: ObjectStore = open_store(store_or_uri, endpoint_url=endpoint_url, **options)
        except ObjectStoreError as exc:
            raise LogUnavailable(str(exc)) from exc
        return store
    return store_or_uri


class LogStore:
    """A log's view of an object store: paths relative to the log, bounded retries."""

    def __init__(self, store: ObjectStore, prefix: str = "", *, retries: int = 4,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.store = store
        self.prefix = prefix.strip("/")
        self.retries = retries
        self._sleep = sleep

    def key(self, path: str) -> str:
        return join(self.prefix, path)

    def describe(self) -> str:
        base = self.store.describe()
        return f"{base.rstrip('/')}/{self.prefix}" if self.prefix else base

    def _retry(self, what: str, path: str, op: Callable[[], T]) -> T:
        """Call ``op``, retrying ``StoreUnavailable``; the error that ends the retries
        keeps ``may_have_applied`` if any attempt may have applied (the store's own
        retry layer reports it the same way)."""
        attempt = 0
        maybe_applied = False
        while True:
            try:
                return op()
            except (NotFound, PreconditionFailed):
                raise
            except StoreUnavailable as exc:
                maybe_applied = maybe_applied or exc.may_have_applied
                if attempt >= self.retries:
                    raise LogUnavailable(
                        f"{what} {self.key(path)} on {self.store.describe()} failed "
                        f"{attempt + 1} times: {exc}"
                        + ("; an attempt may have applied: re-read it" if maybe_applied
                           else ""),
                        may_have_applied=maybe_applied,
                    ) from exc
                delay = _BACKOFF[min(attempt, len(_BACKOFF) - 1)]
                self._sleep(delay * (0.5 + random.random()))
                attempt += 1
            except ObjectStoreError as exc:
                raise LogUnavailable(
                    f"{what} {self.key(path)} on {self.store.describe()} failed: {exc}",
                    may_have_applied=maybe_applied,
                ) from exc

    def get(self, path: str) -> tuple[bytes, str]:
        return self._retry("GET", path, lambda: self.store.get(self.key(path)))

    def get_or_none(self, path: str) -> tuple[bytes, str] | None:
        try:
            return self.get(path)
        except NotFound:
            return None

    def head(self, path: str) -> str | None:
        return self._retry("HEAD", path, lambda: self.store.head(self.key(path)))

    def put(self, path: str, data: bytes) -> str:
        return self._retry("PUT", path, lambda: self.store.put(self.key(path), data))

    def put_if_absent(self, path: str, data: bytes) -> str:
        return self._retry("PUT (if absent)", path,
                           lambda: self.store.put_if_absent(self.key(path), data))

    def put_if_match(self, path: str, data: bytes, etag: str) -> str:
        return self._retry("PUT (if match)", path,
                           lambda: self.store.put_if_match(self.key(path), data, etag))

    def delete(self, path: str) -> None:
        self._retry("DELETE", path, lambda: self.store.delete(self.key(path)))

    def list(self, path_prefix: str) -> list[str]:
        """Paths (relative to the log) under ``path_prefix``, in lexicographic order."""
        keys = self._retry("LIST", path_prefix, lambda: self.store.list(self.key(path_prefix)))
        strip = len(self.prefix) + 1 if self.prefix else 0
        return [k[strip:] for k in keys]
