"""The PostgreSQL store's call protocol (agent._postgres_protocol), without a server or
threads: a scripted connection fails at a random step, with or without a SQLSTATE, and
answers ``pg_xact_status`` at random; the outcome must be the reference model's."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent import PostgresError, WriteFailed, WriteOutcomeUnknown
from agent import _postgres_protocol as pp


class DbError(Exception):
    """Stands for psycopg.Error; ``sqlstate`` None: the connection broke unanswered."""

    def __init__(self, sqlstate: str | None) -> None:
        super().__init__(f"db error {sqlstate}")
        self.sqlstate = sqlstate


def operation(statements: int, returns_xid: bool) -> Generator[Any, Any, Any]:
    """An operation of ``statements`` statements; every write returns its xid last."""
    seen = []
    for i in range(statements):
        rows = yield (f"q{i}".encode(), {"i": i})
        seen.append(rows)
    return ("result", len(seen))


def drive(call: pp.Call, fail_at: int | None, sqlstate: str | None,
          statuses: list[str | None], status_fails: bool) -> tuple[Any, list[Any]]:
    """Carry the steps out as a driver would; return (result or error, steps seen)."""
    seen: list[Any] = []
    now = 0.0
    held = False
    try:
        step = next(call)
        while True:
            seen.append(step)
            result: Any = None
            error: BaseException | None = None
            if isinstance(step, pp.Statement) or step is pp.COMMIT:
                held = True
                if len([s for s in seen if isinstance(s, pp.Statement) or s is pp.COMMIT]) - 1 \
                        == fail_at:
                    error = DbError(sqlstate)
                elif isinstance(step, pp.Statement):
                    result = [("row", "xid-7")]
            elif step is pp.RELEASE:
                held = False
            elif isinstance(step, pp.XactStatus):
                assert not held, "the broken connection is given back before asking"
                if status_fails:
                    error = DbError(None)
                else:
                    result = (statuses.pop(0) if statuses else "in progress", now)
            elif isinstance(step, pp.Pause):
                now += step.seconds
            elif step is pp.NOW:
                result = now
            step = call.throw(error) if error is not None else call.send(result)
    except StopIteration as stop:
        return stop.value, seen
    except Exception as exc:
        return exc, seen


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 3), st.one_of(st.none(), st.integers(0, 3)),
       st.sampled_from([None, "57P01", "40001"]), st.booleans(),
       st.lists(st.sampled_from(["in progress", "committed", "aborted", None]), max_size=4),
       st.booleans(), st.booleans())
def test_calls_end_as_the_reference_model_says(
        statements: int, fail_at: int | None, sqlstate: str | None, writing: bool,
        statuses: list[str | None], status_fails: bool, verify: bool) -> None:
    """Plain and verified calls: where the connection fails decides the outcome."""
    steps = operation(statements, True)
    if verify:
        call = pp.verified_call(steps, "the write", DbError, resolve_timeout=0.12)
    else:
        call = pp.plain_call(steps, "the write", writing, DbError)
    outcome, seen = drive(call, fail_at, sqlstate, list(statuses), status_fails)
    ok = ("result", statements)
    kinds = [type(s).__name__ if not isinstance(s, pp.Control) else s.name for s in seen]

    if not verify:
        assert "commit" not in kinds and "rollback" not in kinds
        assert not any(isinstance(s, pp.Statement) and s.begin for s in seen)
        if fail_at is None or fail_at >= statements:
            assert outcome == ok
        elif not writing:
            assert type(outcome) is PostgresError
        elif sqlstate is None:
            assert isinstance(outcome, WriteOutcomeUnknown)
        else:
            assert isinstance(outcome, WriteFailed)
        return

    assert isinstance(seen[0], pp.Statement) and seen[0].begin  # BEGIN rides along
    if fail_at is None or fail_at > statements:
        assert outcome == ok and kinds[-1] == "commit"
        return
    if fail_at < statements:  # before COMMIT was sent: rolled back, never applied
        assert "rollback" in kinds and "commit" not in kinds
        assert isinstance(outcome, WriteFailed)
        assert ("before its COMMIT was sent" in str(outcome)) == (sqlstate is None)
        return
    # Lost while committing: the xid decides, asked on a fresh connection.
    assert "rollback" not in kinds and "release" in kinds
    answers = list(statuses)
    asked = 0
    expected: Any
    if status_fails:
        expected = WriteOutcomeUnknown
    else:
        while True:  # the model: ask, and again while in progress, up to the timeout
            status = answers.pop(0) if answers else "in progress"
            asked += 1
            if status != "in progress" or (asked - 1) * 0.05 > 0.12:
                break
        expected = {"committed": ok, "aborted": WriteFailed}.get(status, WriteOutcomeUnknown)
        assert kinds.count("XactStatus") == asked
    if expected == ok:
        assert outcome == ok
    else:
        assert isinstance(outcome, expected)


def test_a_call_that_wrote_nothing_loses_nothing_when_commit_breaks() -> None:
    """No statement returned an xid: a broken COMMIT is no loss; the result stands."""
    def reads() -> Generator[Any, Any, Any]:
        yield (b"q", {})
        return "r"

    call = pp.verified_call(reads(), "the read", DbError, 1.0)
    assert next(call) == pp.Statement(b"q", {}, begin=pp.BEGIN)
    assert call.send([]) is pp.COMMIT
    assert call.throw(DbError(None)) is pp.RELEASE
    with pytest.raises(StopIteration) as done:
        call.send(None)
    assert done.value.value == "r"


def test_a_bug_in_the_steps_rolls_back_and_goes_on_unmapped() -> None:
    """An error that is not the driver's (here the operation's own) is not mapped."""
    def broken() -> Generator[Any, Any, Any]:
        yield (b"q", {})
        raise KeyError("bug")

    call = pp.verified_call(broken(), "the write", DbError, 1.0)
    next(call)
    assert call.send([("x", "xid")]) is pp.ROLLBACK
    with pytest.raises(KeyError):
        call.send(None)


# -- snapshot_call: several scans as of one moment -------------------------------------------


def scan(table: str, rows: int) -> Generator[Any, Any, Any]:
    """A scan of one statement whose rows become {(table, i): value}."""
    found = yield (f"select {table}".encode(), {})
    return {(table, i): value for i, value in found[:rows]}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=4), st.one_of(st.none(), st.integers(0, 5)),
       st.sampled_from([None, "40001"]))
def test_a_snapshot_reads_every_scan_in_one_transaction_or_fails_cleanly(
        tables: list[int], fail_at: int | None, sqlstate: str | None) -> None:
    """BEGIN (repeatable read, read only) rides with the first statement, every scan's
    statement follows, COMMIT ends it; any failure rolls back, is mapped to a
    PostgresError saying nothing changed, and nothing is committed after it."""
    names = [f"t{i}" for i in range(len(tables))]
    call = pp.snapshot_call([scan(n, r) for n, r in zip(names, tables, strict=True)],
                            "the snapshot", DbError)
    seen: list[Any] = []
    outcome: Any
    sent = 0  # Statement and COMMIT steps, the ones that can fail
    try:
        step = next(call)
        while True:
            seen.append(step)
            error: Exception | None = None
            result: Any = None
            if isinstance(step, pp.Statement) or step is pp.COMMIT:
                if sent == fail_at:
                    error = DbError(sqlstate)
                elif isinstance(step, pp.Statement):
                    result = [(i, f"{step.query.decode()}#{i}") for i in range(3)]
                sent += 1
            step = call.throw(error) if error is not None else call.send(result)
    except StopIteration as stop:
        outcome = stop.value
    except Exception as exc:
        outcome = exc
    statements = [s for s in seen if isinstance(s, pp.Statement)]
    assert [bool(s.begin) for s in statements] == [i == 0 for i in range(len(statements))]
    if statements:
        assert statements[0].begin == pp.SNAPSHOT_BEGIN
    assert [s.query for s in statements] == [f"select {n}".encode()
                                             for n in names][:len(statements)]
    if not tables:
        assert outcome == {} and seen == []
        return
    if fail_at is None or fail_at > len(tables):
        expected = {(n, i): f"select {n}#{i}" for n, r in zip(names, tables, strict=True)
                    for i in range(min(r, 3))}
        assert outcome == expected and seen[-1] is pp.COMMIT
        assert pp.ROLLBACK not in seen
        return
    assert type(outcome) is PostgresError and "nothing changed" in str(outcome)
    assert isinstance(outcome.__cause__, DbError)
    assert seen[-1] is pp.ROLLBACK and seen.count(pp.ROLLBACK) == 1
    assert len(statements) == min(fail_at + 1, len(tables))
    assert (pp.COMMIT in seen) == (fail_at == len(tables))  # only a failed COMMIT was sent


def test_a_bug_in_a_scan_rolls_back_and_goes_on_unmapped() -> None:
    """An error of the scan itself (not the driver's) rolls back and is not mapped."""
    def broken() -> Generator[Any, Any, Any]:
        yield (b"q", {})
        raise KeyError("bug")

    call = pp.snapshot_call([broken()], "the snapshot", DbError)
    assert next(call).begin == pp.SNAPSHOT_BEGIN
    assert call.send([]) is pp.ROLLBACK
    with pytest.raises(KeyError):
        call.send(None)
