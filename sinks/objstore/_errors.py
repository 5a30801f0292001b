"""The object store's errors: the only exceptions a backend lets escape."""

from __future__ import annotations

__all__ = [
    "NotFound",
    "ObjectStoreError",
    "PreconditionFailed",
    "StoreUnavailable",
]


class ObjectStoreError(Exception):
    """An object-store operation failed. The message names the store, the key and what to do.

    ``key`` is the key the operation was about (``None`` for listings and set-up).
    """

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class NotFound(ObjectStoreError):
    """``get`` of a key that holds no object."""


class PreconditionFailed(ObjectStoreError):
    """A conditional write lost: the key already existed (``put_if_absent``), or it was
    missing or held another etag (``put_if_match``). Nothing was written."""


class StoreUnavailable(ObjectStoreError):
    """A transient failure (throttling, timeout, lost connection, a conflicting
    concurrent conditional request). Retrying later may succeed.

    ``may_have_applied`` is true when the write might have taken effect even though the
    caller sees an error (a timeout after the request was sent, an injected ambiguous
    failure): re-read the key before concluding anything from this error.
    """

    def __init__(self, message: str, *, key: str | None = None,
                 may_have_applied: bool = False) -> None:
        super().__init__(message, key=key)
        self.may_have_applied = may_have_applied
