"""How a PostgreSQL store call runs, sans-IO: plain, or inside a verified commit.

``agent._postgres_sql`` writes each operation as statements; this module says how the
statements of one call travel, once for the sync and the asyncio store. A call is a
generator of connection steps; the store's driver carries each out and sends back its
result, and throws the driver's exceptions (psycopg's, or any other) into the
generator, which maps them to ours here (the one boundary for psycopg's errors):

    step                      the driver does                          sends back
    Statement(q, p, begin)    runs q on the lent connection (with      its rows
                              ``begin``, a BEGIN statement: it and q
                              in one round trip, pipeline mode)
    COMMIT                    COMMIT on the lent connection            None
    ROLLBACK                  ROLLBACK if a connection is lent and     None
                              still works; its own errors are ignored
    RELEASE                   gives the lent connection back           None
    XactStatus(xid)           ``pg_xact_status(xid)`` on a fresh       (status, monotonic now)
                              connection (kept for the call)
    Pause(seconds)            sleeps                                   None
    NOW                       reads the monotonic clock                seconds

A connection is lent at the first ``Statement`` and given back at ``RELEASE`` or when
the call ends, whichever comes first. A call may leave its connection inside a
transaction only if it also fails: the pool drops such a connection rather than lend
it again. No psycopg import here: ``error`` (psycopg's
``Error``) is passed in.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Final, NamedTuple, TypeAlias

from agent._postgres_spec import PostgresError, WriteFailed, WriteOutcomeUnknown

__all__ = [
    "BEGIN",
    "COMMIT",
    "NOW",
    "RELEASE",
    "ROLLBACK",
    "Call",
    "Control",
    "Pause",
    "Statement",
    "XactStatus",
    "XACT_STATUS_SQL",
    "map_error",
    "SNAPSHOT_BEGIN",
    "plain_call",
    "snapshot_call",
    "verified_call",
]

XACT_STATUS_SQL: Final = b"SELECT pg_xact_status(%s::xid8)"
BEGIN: Final = b"BEGIN"
# Every table of a snapshot read as of one moment, and nothing written by mistake.
SNAPSHOT_BEGIN: Final = b"BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY"
_POLL: Final = 0.05  # seconds between two questions about a transaction in progress


class Statement(NamedTuple):
    """One statement on the lent connection; ``begin`` (a BEGIN statement) goes first."""

    query: Any
    params: Any
    begin: bytes = b""


class Control(NamedTuple):
    """COMMIT, ROLLBACK (best effort) or RELEASE of the lent connection."""

    name: str


class XactStatus(NamedTuple):
    """What became of transaction ``xid``, asked on a fresh connection."""

    xid: str


class Pause(NamedTuple):
    seconds: float


COMMIT: Final = Control("commit")
ROLLBACK: Final = Control("rollback")
RELEASE: Final = Control("release")
NOW: Final = Control("now")

ConnectionStep: TypeAlias = Statement | Control | XactStatus | Pause
Call: TypeAlias = Generator[ConnectionStep, Any, Any]


def map_error(exc: Exception, what: str, writing: bool) -> PostgresError:
    """Turn a psycopg error into ours; the message says whether the write took effect."""
    sqlstate = getattr(exc, "sqlstate", None)
    if not writing:
        return PostgresError(f"{what} failed ({sqlstate or 'connection lost'}: {exc}); "
                             "nothing changed; retry")
    if sqlstate is not None:
        return WriteFailed(f"PostgreSQL refused {what} ({sqlstate}: {exc}); it did not take "
                           "effect and no event was recorded")
    return WriteOutcomeUnknown(
        f"the connection to PostgreSQL broke during {what} before the server answered "
        f"({exc}); the write may or may not have taken effect and no event was recorded: "
        "the log may now lag the store for this cell. Re-read the cell, and write it "
        "again through the agent to bring the log back in line (or use verify_commits=True)"
    )


def _statements(steps: Any, begin: bytes = b"") -> Call:
    """The operation's statements, one ``Statement`` each (``begin`` on the first)."""
    try:
        query, params = next(steps)
        rows = yield Statement(query, params, begin)
        while True:
            query, params = steps.send(rows)
            rows = yield Statement(query, params)
    except StopIteration as stop:
        return stop.value


def plain_call(steps: Any, what: str, writing: bool, error: type[Exception]) -> Call:
    """An operation's statements, each its own autocommit transaction."""
    try:
        return (yield from _statements(steps))
    except error as exc:
        raise map_error(exc, what, writing) from exc


@dataclass(slots=True)
class _Commit:
    """How far a verified write got: its transaction id, and whether COMMIT was sent."""

    xid: str | None = None
    committing: bool = False
    result: Any = None


def _transaction(steps: Any, commit: _Commit) -> Call:
    """The statements inside BEGIN ... COMMIT, noting the transaction id each write returns.

    Step 1. BEGIN and the first statement, in one round trip (pipeline mode).
    Step 2. The remaining statements; every write returns its xid last.
    Step 3. Note that COMMIT is being sent, then send it.
    On any failure before COMMIT was sent: ROLLBACK (best effort), and the error goes on.
    """
    try:
        try:
            query, params = next(steps)
            # Step 1.
            rows = yield Statement(query, params, BEGIN)
            # Step 2.
            while True:
                if rows:
                    commit.xid = rows[0][-1]
                query, params = steps.send(rows)
                rows = yield Statement(query, params)
        except StopIteration as stop:
            commit.result = stop.value
        # Step 3.
        commit.committing = True
        yield COMMIT
        return commit.result
    except BaseException as exc:
        if not commit.committing and not isinstance(exc, GeneratorExit):
            yield ROLLBACK  # the original error is the one to report
        raise


def snapshot_call(scans: Any, what: str, error: type[Exception]) -> Call:
    """Several reads as of one moment: ``BEGIN ISOLATION LEVEL REPEATABLE READ, READ
    ONLY``, each scan's statements, COMMIT; returns the scans' results merged (each a
    dict). Read-only, so any failure is "nothing changed; retry".

    Step 1. SNAPSHOT_BEGIN and the first statement, in one round trip.
    Step 2. Every scan's statements, in order.
    Step 3. COMMIT (ends the read; the connection goes back to autocommit use).
    On any failure: ROLLBACK (best effort), and the error goes on, mapped.
    """
    merged: dict[Any, Any] = {}
    try:
        try:
            begin = SNAPSHOT_BEGIN
            for steps in scans:
                # Step 1 (the first statement), step 2.
                merged.update((yield from _statements(steps, begin)))
                begin = b""
            if begin:  # no scan at all: nothing to read, no transaction opened
                return merged
            # Step 3.
            yield COMMIT
            return merged
        except BaseException as exc:
            if not isinstance(exc, GeneratorExit):
                yield ROLLBACK  # the original error is the one to report
            raise
    except error as exc:
        raise map_error(exc, what, False) from exc


def verified_call(steps: Any, what: str, error: type[Exception],
                  resolve_timeout: float) -> Call:
    """A write as ``BEGIN; <write> RETURNING ..., xid; COMMIT``, whose outcome is known
    even when the connection breaks.

    Lost before COMMIT was sent: the write did not happen (``WriteFailed``). Lost while
    committing: a fresh connection asks ``pg_xact_status(xid)`` (again while the old
    backend has not noticed its client is gone, up to ``resolve_timeout`` seconds) and
    the call returns normally if the write committed.
    """
    commit = _Commit()
    try:
        return (yield from _transaction(steps, commit))
    except error as exc:
        yield RELEASE
        if not commit.committing:
            if getattr(exc, "sqlstate", None) is None:
                raise WriteFailed(
                    f"the connection to PostgreSQL broke during {what} before its COMMIT "
                    f"was sent ({exc}); the write did not take effect and no event was "
                    "recorded") from exc
            raise map_error(exc, what, True) from exc
        if commit.xid is None:
            return commit.result  # the call wrote nothing, so nothing can be lost
        status = yield from _xact_status(commit.xid, error, resolve_timeout)
        if status == "committed":
            return commit.result
        if status == "aborted":
            raise WriteFailed(
                f"the connection broke while committing {what} ({exc}); the server rolled "
                "it back: it did not take effect and no event was recorded") from exc
        raise WriteOutcomeUnknown(
            f"the connection broke while committing {what} ({exc}) and the server could "
            f"not say whether transaction {commit.xid} committed (status {status!r}); no "
            "event was recorded: re-read the cell and write it again through the agent"
        ) from exc


def _xact_status(xid: str, error: type[Exception], timeout: float) -> Call:
    """The transaction's status; asked again while it is still in progress (the old
    backend has not yet noticed its client is gone), until ``timeout``. ``None`` if the
    server cannot be asked."""
    try:
        deadline = (yield NOW) + timeout
        while True:
            status, now = yield XactStatus(xid)
            if status != "in progress" or now > deadline:
                return status
            yield Pause(_POLL)
    except error:
        return None
