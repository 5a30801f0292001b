"""``open_store``: a store from a URI (``file://``, ``memory://``, ``s3://``)."""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import unquote, urlsplit

from sinks._redact import redact
from sinks.objstore._local import LocalStore
from sinks.objstore._memory import InMemoryObjectStore
from sinks.objstore._protocol import ObjectStore
from sinks.objstore._s3 import S3Store

__all__ = ["open_store"]

_memory_stores: dict[str, InMemoryObjectStore] = {}
_memory_lock = threading.Lock()


def open_store(uri: str, *, endpoint_url: str | None = None, **options: Any) -> ObjectStore:
    """Open the object store ``uri`` names.

    - ``file:///abs/dir``: a ``LocalStore`` (options: ``create``, ``fsync``, ...).
    - ``memory://name``: the process-wide ``InMemoryObjectStore`` of that name, created
      on first use (options ``seed``, ``sleep`` apply then only).
    - ``s3://bucket/prefix``: an ``S3Store`` (``endpoint_url`` and the other options
      are passed on: credentials, ``region_name``, ``max_attempts``, ...).
      ``s3://KEY:SECRET@bucket/prefix`` takes the access key and secret from the URI
      (better: the environment); no message ever shows them.
    """
    try:
        return _open(uri, endpoint_url, options)
    except ValueError as exc:  # the messages quote the URI: never with its secret
        raise ValueError(redact(str(exc))) from None


def _open(uri: str, endpoint_url: str | None, options: dict[str, Any]) -> ObjectStore:
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if parts.query or parts.fragment:
        raise ValueError(f"store URI {uri!r}: no query or fragment allowed")
    if scheme != "s3" and endpoint_url is not None:
        raise ValueError(f"store URI {uri!r}: endpoint_url applies to s3:// only")
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"store URI {uri!r}: use file:///absolute/path (three slashes)")
        path = unquote(parts.path)
        if not path.startswith("/"):
            raise ValueError(f"store URI {uri!r}: the path must be absolute")
        return LocalStore(path, **options)
    if scheme == "memory":
        name = parts.netloc + parts.path
        with _memory_lock:
            store = _memory_stores.get(name)
            if store is None:
                store = _memory_stores[name] = InMemoryObjectStore(name, **options)
            elif options:
                raise ValueError(f"memory store {name!r} already exists; options "
                                 f"{sorted(options)} apply only when it is created")
            return store
    if scheme == "s3":
        userinfo, _, bucket = parts.netloc.rpartition("@")
        if not bucket:
            raise ValueError(f"store URI {uri!r}: name the bucket, s3://bucket/prefix")
        if userinfo:
            key, _, secret = userinfo.partition(":")
            options.setdefault("aws_access_key_id", unquote(key))
            if secret:
                options.setdefault("aws_secret_access_key", unquote(secret))
        return S3Store(bucket, unquote(parts.path).strip("/"),
                       endpoint_url=endpoint_url, **options)
    raise ValueError(f"store URI {uri!r}: unknown scheme {parts.scheme!r}; use file:///dir, "
                     "memory://name or s3://bucket/prefix")
