"""The object-store protocol every backend implements (local files, memory, S3)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["ObjectStore"]


@runtime_checkable
class ObjectStore(Protocol):
    """A flat map from keys to immutable byte strings, with compare-and-swap.

    Synchronous and thread-safe. Keys are ``/``-separated strings without a leading
    ``/`` (see ``sinks.objstore._keys.check_key``). An etag is an opaque string that
    changes whenever the bytes change; compare etags only from the same store.

    - ``get(key) -> (data, etag)``; raises ``NotFound``.
    - ``head(key) -> etag | None``.
    - ``put(key, data) -> etag``: unconditional.
    - ``put_if_absent(key, data) -> etag``: If-None-Match ``*``; raises
      ``PreconditionFailed`` if the key exists.
    - ``put_if_match(key, data, etag) -> etag``: If-Match; raises ``PreconditionFailed``
      if the key is missing or holds another etag.
    - ``list(prefix) -> keys``: every key starting with ``prefix``, in byte order.
    - ``delete(key)``: idempotent.
    - ``describe() -> str``: where the store lives, for messages (``file:///...``).

    Every write is atomic: a reader sees the old object or the new one, never a part.
    Transient failures raise ``StoreUnavailable``; nothing else but ``ObjectStoreError``
    subclasses escapes.
    """

    def get(self, key: str) -> tuple[bytes, str]: ...

    def head(self, key: str) -> str | None: ...

    def put(self, key: str, data: bytes) -> str: ...

    def put_if_absent(self, key: str, data: bytes) -> str: ...

    def put_if_match(self, key: str, data: bytes, etag: str) -> str: ...

    def list(self, prefix: str) -> list[str]: ...

    def delete(self, key: str) -> None: ...

    def describe(self) -> str: ...
