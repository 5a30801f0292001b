"""The errors wal3 raises. Object-store errors are mapped to these at the store boundary."""

from __future__ import annotations

from sinks._protocol import SinkBackpressure, SinkError

__all__ = [
    "AlreadyInitialized",
    "CorruptCursor",
    "CorruptFragment",
    "CorruptGarbage",
    "CorruptLog",
    "CorruptManifest",
    "CursorContention",
    "GarbageCollected",
    "GarbageCollectionInProgress",
    "LogBackpressure",
    "LogClosed",
    "LogContention",
    "LogSealed",
    "LogUnavailable",
    "NoSuchCursor",
    "UninitializedLog",
    "Wal3Error",
]


class Wal3Error(SinkError):
    """Base class of every wal3 error."""


class UninitializedLog(Wal3Error):
    """There is no manifest under the log's prefix: initialize the log first."""


class AlreadyInitialized(Wal3Error):
    """``initialize`` found a manifest already there; ``open`` the log instead."""


class CorruptLog(Wal3Error):
    """Something stored violates a wal3 invariant. Nothing was changed; a human must look."""


class CorruptManifest(CorruptLog):
    """A manifest or snapshot fails to parse or fails scrub."""


class CorruptFragment(CorruptLog):
    """A fragment fails to parse or its contents do not match the manifest's setsum."""


class CorruptCursor(CorruptLog):
    """A cursor file is not valid cursor JSON, or points outside the log."""


class CorruptGarbage(CorruptLog):
    """The garbage file is unparseable or its setsums do not balance."""


class LogContention(Wal3Error):
    """Another writer (or a garbage collector) won the race for the log.

    Appends that fail with this error were not acknowledged. Unless the message says
    they never reached storage, they may still appear in the log once (never twice).
    """


class LogBackpressure(Wal3Error, SinkBackpressure):
    """The writer's queue is full: the store cannot keep up. Nothing was queued; retry."""


class LogSealed(Wal3Error):
    """The log is sealed and accepts no appends. Continue in a new log from its end offset."""


class LogClosed(Wal3Error):
    """The writer was closed. Records not yet acknowledged were failed with this error."""


class LogUnavailable(Wal3Error):
    """The object store kept failing (after retries). The message says what was kept.

    ``may_have_applied`` is true when a write may have taken effect although every
    attempt reported an error (an object-store attempt said so): re-read before
    concluding it did not happen.
    """

    def __init__(self, message: str, *, may_have_applied: bool = False) -> None:
        super().__init__(message)
        self.may_have_applied = may_have_applied


class GarbageCollected(Wal3Error):
    """The requested offset is below the log's retained prefix: it was garbage collected."""


class GarbageCollectionInProgress(Wal3Error):
    """A garbage file is already installed; finish that collection first."""


class NoSuchCursor(Wal3Error):
    """The named cursor does not exist."""


class CursorContention(Wal3Error):
    """A cursor changed since its witness was read; reload it and retry."""
