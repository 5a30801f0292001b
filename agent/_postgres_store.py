"""PostgreSQL as a relaxed store: ``PostgresStore`` (threads) and ``AsyncPostgresStore`` (asyncio).

Both implement the RelaxedStore protocol over existing tables described by
``TableSpec``s: ``exchange``, ``compare_exchange``, ``get``, ``read_row``, ``snapshot``.
Every cell write is one autocommit statement that swaps the value and returns the old
one atomically (see ``agent._postgres_sql``); no transaction spans two cells. Each
call borrows a connection from a small pool, so threads (or tasks) write in parallel.

psycopg 3 is imported when a store is built; without it the error names the extra
``cdc-agent[postgres]``. psycopg's exceptions are mapped to ours here and only here:

- a value, row key, table or column the tables cannot hold: ``InvalidWrite``, raised
  before anything is sent;
- the server refused or aborted the statement (any error carrying a SQLSTATE, a
  terminated backend included): ``WriteFailed``, the write did not take effect;
- the connection broke with no answer from the server: ``WriteOutcomeUnknown``.

With ``verify_commits=True`` a write runs as ``BEGIN; <write> RETURNING ..., xid;
COMMIT`` instead (one more round trip). A connection lost before COMMIT was sent
means the write did not happen (``WriteFailed``); lost while committing, the store asks
the server ``pg_xact_status(xid)`` on a fresh connection and returns normally if the
write committed. Either way the store and the agent's log stay in agreement.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from agent._postgres_spec import (
    PostgresError,
    SchemaMismatch,
    TableSpec,
    WriteFailed,
    WriteOutcomeUnknown,
)
from sequencer import ABSENT, Absent, InvalidWrite, RowKey, Value

if TYPE_CHECKING:
    import psycopg

    from agent._baseline import CellChunk
    from agent._postgres_sql import Steps, TableInfo
    from sinks.codec import Bound

__all__ = ["AsyncPostgresStore", "PostgresStore", "require_psycopg"]

Cell = tuple[str, RowKey, str]


def require_psycopg() -> Any:
    """Import psycopg, or fail with the name of the extra that installs it."""
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the PostgreSQL store needs psycopg 3; install the extra: "
            "pip install 'cdc-agent[postgres]'"
        ) from exc
    return psycopg


def _map_error(exc: Exception, what: str, writing: bool) -> PostgresError:
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


_XACT_STATUS: Final = b"SELECT pg_xact_status(%s::xid8)"


@dataclass(slots=True)
class _Commit:
    """How far a verified write got: its transaction id, and whether COMMIT was sent."""

    xid: str | None = None
    committing: bool = False
    result: Any = None


def _lost_before_commit(what: str, exc: Exception) -> WriteFailed:
    return WriteFailed(
        f"the connection to PostgreSQL broke during {what} before its COMMIT was sent "
        f"({exc}); the write did not take effect and no event was recorded")


def _resolved(status: str | None, commit: _Commit, what: str, exc: Exception) -> Any:
    """The write's result if its transaction committed; else the error to raise."""
    if status == "committed":
        return commit.result
    if status == "aborted":
        raise WriteFailed(
            f"the connection broke while committing {what} ({exc}); the server rolled it "
            "back: it did not take effect and no event was recorded") from exc
    raise WriteOutcomeUnknown(
        f"the connection broke while committing {what} ({exc}) and the server could not "
        f"say whether transaction {commit.xid} committed (status {status!r}); no event was "
        "recorded: re-read the cell and write it again through the agent") from exc


def _run_verified(cur: psycopg.Cursor[Any], steps: Steps, commit: _Commit) -> Any:
    """``_run`` inside BEGIN ... COMMIT, noting the transaction id each write returns.

    Step 1. BEGIN and the first statement, in one round trip (pipeline mode).
    Step 2. The remaining statements; every write returns its xid last.
    Step 3. Note that COMMIT is being sent, then send it.
    """
    conn = cur.connection
    try:
        try:
            query, params = next(steps)
            # Step 1.
            with conn.pipeline():
                conn.execute(b"BEGIN", prepare=False)
                cur.execute(query, params)
                rows = cur.fetchall()
            # Step 2.
            while True:
                if rows:
                    commit.xid = rows[0][-1]
                query, params = steps.send(rows)
                cur.execute(query, params)
                rows = cur.fetchall()
        except StopIteration as stop:
            commit.result = stop.value
        # Step 3.
        commit.committing = True
        cur.execute(b"COMMIT", prepare=False)
        return commit.result
    except BaseException:
        if not commit.committing and not (conn.closed or conn.broken):
            with contextlib.suppress(Exception):  # the original error is the one to report
                cur.execute(b"ROLLBACK", prepare=False)
        raise


async def _arun_verified(cur: psycopg.AsyncCursor[Any], steps: Steps, commit: _Commit) -> Any:
    """``_run_verified`` for asyncio (same steps)."""
    conn = cur.connection
    try:
        try:
            query, params = next(steps)
            async with conn.pipeline():
                await conn.execute(b"BEGIN", prepare=False)
                await cur.execute(query, params)
                rows = await cur.fetchall()
            while True:
                if rows:
                    commit.xid = rows[0][-1]
                query, params = steps.send(rows)
                await cur.execute(query, params)
                rows = await cur.fetchall()
        except StopIteration as stop:
            commit.result = stop.value
        commit.committing = True
        await cur.execute(b"COMMIT", prepare=False)
        return commit.result
    except BaseException:
        if not commit.committing and not (conn.closed or conn.broken):
            with contextlib.suppress(Exception):  # the original error is the one to report
                await cur.execute(b"ROLLBACK", prepare=False)
        raise


def _check_tables(tables: Mapping[str, TableSpec]) -> dict[str, TableSpec]:
    from sequencer import check_name

    if not tables:
        raise SchemaMismatch("a PostgreSQL store needs at least one table")
    checked: dict[str, TableSpec] = {}
    for name, spec in tables.items():
        check_name("table", name)
        if not isinstance(spec, TableSpec):
            raise SchemaMismatch(f"table {name!r}: expected a TableSpec, got {spec!r:.60}")
        checked[name] = spec
    return checked


class _Base:
    """What the sync and async stores share: the checked tables and the checks on a call."""

    _infos: dict[str, TableInfo]

    def _info(self, table: str) -> TableInfo:
        info = self._infos.get(table)
        if info is None:
            raise InvalidWrite(
                f"table {table!r} is not one of this store's tables {sorted(self._infos)}; "
                "nothing was written"
            )
        return info

    def _write_target(self, table: str, row: RowKey, column: str,
                      *values: Value | Absent) -> TableInfo:
        info = self._info(table)
        info.check_row(row)
        col = info.column(column)
        for value in values:
            if value is not ABSENT:  # the column's check is stricter than check_value's
                info.check_value(col, value)  # type: ignore[arg-type]
        return info

    def _read_target(self, table: str, row: RowKey, column: str | None) -> TableInfo:
        info = self._info(table)
        info.check_row(row)
        if column is not None:
            info.column(column)
        return info


# -- threads ---------------------------------------------------------------------------------


class _Pool:
    """At most ``size`` autocommit connections, handed out one per call; broken ones are
    dropped. The common path (an idle connection is there) takes no lock: ``list.pop``
    and ``list.append`` are atomic; only running out of connections waits."""

    def __init__(self, dsn: str, size: int, connect_timeout: float) -> None:
        self._psycopg = require_psycopg()
        self._dsn = dsn
        self._size = size
        self._connect_timeout = connect_timeout
        self._idle: list[tuple[psycopg.Connection[Any], psycopg.Cursor[Any]]] = []
        self._open = 0  # connections in existence (idle or lent)
        self._cond = threading.Condition(threading.Lock())
        self._waiting = 0
        self._closed = False

    def connect(self) -> psycopg.Connection[Any]:
        return self._psycopg.connect(  # type: ignore[no-any-return]
            self._dsn, autocommit=True, prepare_threshold=0,
            connect_timeout=max(1, int(self._connect_timeout)),
        )

    def acquire(self) -> tuple[psycopg.Connection[Any], psycopg.Cursor[Any]]:
        """A connection and its binary cursor (made once, reused for every statement)."""
        if self._closed:
            raise PostgresError("the PostgreSQL store is closed")
        try:
            return self._idle.pop()
        except IndexError:
            pass
        with self._cond:
            while True:
                if self._idle:
                    return self._idle.pop()
                if self._open < self._size:
                    self._open += 1
                    break
                self._waiting += 1
                try:
                    self._cond.wait()
                finally:
                    self._waiting -= 1
        try:
            conn = self.connect()
        except BaseException:
            self._forget()
            raise
        return conn, conn.cursor(binary=True)

    def release(self, entry: tuple[psycopg.Connection[Any], psycopg.Cursor[Any]]) -> None:
        conn = entry[0]
        if conn.closed or conn.broken or self._closed:
            conn.close()
            self._forget()
            return
        self._idle.append(entry)
        if self._waiting:
            with self._cond:
                self._cond.notify()

    def _forget(self) -> None:
        with self._cond:
            self._open -= 1
            self._cond.notify()

    @contextmanager
    def connection(self) -> Iterator[tuple[psycopg.Connection[Any], psycopg.Cursor[Any]]]:
        entry = self.acquire()
        try:
            yield entry
        finally:
            self.release(entry)

    def close(self) -> None:
        self._closed = True
        with self._cond:
            idle, self._idle = self._idle, []
            self._cond.notify_all()
        for conn, _cur in idle:
            conn.close()


def _run(cur: psycopg.Cursor[Any], steps: Steps) -> Any:
    """Drive an operation's steps on one connection, one statement per step."""
    try:
        query, params = next(steps)
        while True:
            cur.execute(query, params)
            rows = cur.fetchall()  # every statement of ours returns rows
            query, params = steps.send(rows)
    except StopIteration as stop:
        return stop.value


class PostgresStore(_Base):
    """A relaxed store over existing PostgreSQL tables, for threads.

    ``tables`` maps each table name to its ``TableSpec``; the tables are checked
    against the catalog here (``SchemaMismatch`` if they do not fit). ``pool_size``
    bounds the connections, hence the calls running at once.
    """

    def __init__(self, dsn: str, tables: Mapping[str, TableSpec], *, pool_size: int = 8,
                 connect_timeout: float = 10.0, verify_commits: bool = False,
                 resolve_timeout: float = 30.0) -> None:
        from agent._postgres_sql import INTROSPECT_SQL, build_table_info

        specs = _check_tables(tables)
        self._verify = verify_commits
        self._resolve_timeout = resolve_timeout
        self._pool = _Pool(dsn, pool_size, connect_timeout)
        psycopg = self._pool._psycopg
        try:
            with self._pool.connection() as (conn, _cur):
                self._infos = {
                    name: build_table_info(name, spec,
                                           conn.execute(INTROSPECT_SQL, (name,)).fetchall(),
                                           with_xid=verify_commits)
                    for name, spec in specs.items()
                }
        except psycopg.Error as exc:
            self._pool.close()
            raise PostgresError(f"could not read the table definitions: {exc}") from exc
        except Exception:
            self._pool.close()
            raise

    @property
    def tables(self) -> dict[str, TableSpec]:
        return {name: info.spec for name, info in self._infos.items()}

    def _call(self, steps: Steps, what: str, writing: bool) -> Any:
        if writing and self._verify:
            return self._call_verified(steps, what)
        pool = self._pool
        entry = pool.acquire()
        try:
            return _run(entry[1], steps)
        except pool._psycopg.Error as exc:
            raise _map_error(exc, what, writing) from exc
        finally:
            pool.release(entry)

    def _call_verified(self, steps: Steps, what: str) -> Any:
        psycopg = self._pool._psycopg
        commit = _Commit()
        try:
            with self._pool.connection() as (_conn, cur):
                return _run_verified(cur, steps, commit)
        except psycopg.Error as exc:
            if not commit.committing:
                if getattr(exc, "sqlstate", None) is None:
                    raise _lost_before_commit(what, exc) from exc
                raise _map_error(exc, what, True) from exc
            if commit.xid is None:
                return commit.result  # the call wrote nothing, so nothing can be lost
            return _resolved(self._xact_status(commit.xid), commit, what, exc)

    def _xact_status(self, xid: str) -> str | None:
        """Ask a fresh connection what became of transaction ``xid`` (waits while the
        old backend has not yet noticed its client is gone)."""
        psycopg = self._pool._psycopg
        deadline = time.monotonic() + self._resolve_timeout
        try:
            with self._pool.connect() as conn:
                while True:
                    row = conn.execute(_XACT_STATUS, (xid,)).fetchone()
                    status = None if row is None else row[0]
                    if status != "in progress" or time.monotonic() > deadline:
                        return status
                    time.sleep(0.05)
        except psycopg.Error:
            return None

    def exchange(self, table: str, row: RowKey, column: str,
                 value: Value | Absent) -> Value | Absent:
        """Set the cell to ``value`` (ABSENT deletes it); return the value it replaced."""
        from agent._postgres_sql import exchange_steps

        info = self._write_target(table, row, column, value)
        return self._call(exchange_steps(info, row, column, value),  # type: ignore[no-any-return]
                          f"the write of {table}[{row!r}].{column}", True)

    def compare_exchange(self, table: str, row: RowKey, column: str, expected: Value | Absent,
                         value: Value | Absent) -> tuple[bool, Value | Absent]:
        """Set the cell to ``value`` if it holds ``expected`` bit for bit; return (swapped, old)."""
        from agent._postgres_sql import compare_exchange_steps

        info = self._write_target(table, row, column, expected, value)
        return self._call(  # type: ignore[no-any-return]
            compare_exchange_steps(info, row, column, expected, value),
            f"the conditional write of {table}[{row!r}].{column}", True)

    def get(self, table: str, row: RowKey, column: str) -> Value | Absent:
        from agent._postgres_sql import get_steps

        info = self._read_target(table, row, column)
        return self._call(get_steps(info, row, column),  # type: ignore[no-any-return]
                          f"the read of {table}[{row!r}].{column}", False)

    def read_row(self, table: str, row: RowKey) -> dict[str, Value]:
        from agent._postgres_sql import read_row_steps

        info = self._read_target(table, row, None)
        return self._call(read_row_steps(info, row),  # type: ignore[no-any-return]
                          f"the read of {table}[{row!r}]", False)

    def snapshot(self) -> dict[Cell, Value]:
        """Every present cell of every table, read in one REPEATABLE READ transaction."""
        from agent._postgres_sql import scan_steps

        psycopg = self._pool._psycopg
        cells: dict[Cell, Value] = {}
        try:
            with self._pool.connection() as (conn, cur):
                conn.autocommit = False
                try:
                    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
                    with conn.transaction():
                        for info in self._infos.values():
                            cells.update(_run(cur, scan_steps(info)))
                finally:
                    if not (conn.closed or conn.broken):
                        conn.isolation_level = None
                        conn.autocommit = True
        except psycopg.Error as exc:
            raise _map_error(exc, "the snapshot", False) from exc
        return cells

    def list_cells(self, start: Bound | None, limit: int) -> CellChunk:
        """The cells of up to ``limit`` rows from ``start`` on, in snapshot row order
        (for ``Agent.snapshot``; see ``agent._postgres_scan``)."""
        from agent._baseline import CellChunk
        from agent._postgres_scan import chunk_steps, first_table

        where = first_table(self._infos, start)
        if where is None:
            return CellChunk([], None)
        table, lower = where
        later = [n for n in sorted(self._infos) if n > table]
        cells, nxt = self._call(
            chunk_steps(self._infos[table], lower, limit, later[0] if later else None),
            f"the snapshot read of {table}", False)
        return CellChunk(cells, nxt)

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- asyncio ---------------------------------------------------------------------------------


class _AsyncPool:
    def __init__(self, dsn: str, size: int, connect_timeout: float) -> None:
        self._psycopg = require_psycopg()
        self._dsn = dsn
        self._size = size
        self._connect_timeout = connect_timeout
        self._idle: list[tuple[psycopg.AsyncConnection[Any], psycopg.AsyncCursor[Any]]] = []
        self._slots: asyncio.Semaphore | None = None
        self._closed = False

    async def connect(self) -> psycopg.AsyncConnection[Any]:
        return await self._psycopg.AsyncConnection.connect(  # type: ignore[no-any-return]
            self._dsn, autocommit=True, prepare_threshold=0,
            connect_timeout=max(1, int(self._connect_timeout)),
        )

    @asynccontextmanager
    async def connection(
            self) -> AsyncIterator[tuple[psycopg.AsyncConnection[Any], psycopg.AsyncCursor[Any]]]:
        """A connection and its binary cursor (made once, reused for every statement)."""
        if self._closed:
            raise PostgresError("the PostgreSQL store is closed")
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._size)
        async with self._slots:
            if self._idle:
                entry = self._idle.pop()
            else:
                conn = await self.connect()
                entry = (conn, conn.cursor(binary=True))
            try:
                yield entry
            finally:
                conn = entry[0]
                if conn.closed or conn.broken or self._closed:
                    await conn.close()
                else:
                    self._idle.append(entry)

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn, _cur in idle:
            await conn.close()


async def _arun(cur: psycopg.AsyncCursor[Any], steps: Steps) -> Any:
    try:
        query, params = next(steps)
        while True:
            await cur.execute(query, params)
            rows = await cur.fetchall()  # every statement of ours returns rows
            query, params = steps.send(rows)
    except StopIteration as stop:
        return stop.value


class AsyncPostgresStore(_Base):
    """``PostgresStore`` for asyncio: the same methods, as coroutines.

    The tables are checked on ``await store.open()`` (or ``async with store``), and at
    the latest before the first call goes out.
    """

    def __init__(self, dsn: str, tables: Mapping[str, TableSpec], *, pool_size: int = 8,
                 connect_timeout: float = 10.0, verify_commits: bool = False,
                 resolve_timeout: float = 30.0) -> None:
        self._specs = _check_tables(tables)
        self._verify = verify_commits
        self._resolve_timeout = resolve_timeout
        self._pool = _AsyncPool(dsn, pool_size, connect_timeout)
        self._infos = {}
        self._opened = False

    async def open(self) -> AsyncPostgresStore:
        from agent._postgres_sql import INTROSPECT_SQL, build_table_info

        if self._opened:
            return self
        psycopg = self._pool._psycopg
        infos = {}
        try:
            async with self._pool.connection() as (conn, _cur):
                for name, spec in self._specs.items():
                    cur = await conn.execute(INTROSPECT_SQL, (name,))
                    infos[name] = build_table_info(name, spec, await cur.fetchall(),
                                                   with_xid=self._verify)
        except psycopg.Error as exc:
            raise PostgresError(f"could not read the table definitions: {exc}") from exc
        self._infos = infos
        self._opened = True
        return self

    @property
    def tables(self) -> dict[str, TableSpec]:
        return dict(self._specs)

    async def _call(self, steps: Steps, what: str, writing: bool) -> Any:
        psycopg = self._pool._psycopg
        if writing and self._verify:
            return await self._call_verified(steps, what)
        try:
            async with self._pool.connection() as (_conn, cur):
                return await _arun(cur, steps)
        except psycopg.Error as exc:
            raise _map_error(exc, what, writing) from exc

    async def _call_verified(self, steps: Steps, what: str) -> Any:
        psycopg = self._pool._psycopg
        commit = _Commit()
        try:
            async with self._pool.connection() as (_conn, cur):
                return await _arun_verified(cur, steps, commit)
        except psycopg.Error as exc:
            if not commit.committing:
                if getattr(exc, "sqlstate", None) is None:
                    raise _lost_before_commit(what, exc) from exc
                raise _map_error(exc, what, True) from exc
            if commit.xid is None:
                return commit.result
            return _resolved(await self._xact_status(commit.xid), commit, what, exc)

    async def _xact_status(self, xid: str) -> str | None:
        psycopg = self._pool._psycopg
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._resolve_timeout
        try:
            async with await self._pool.connect() as conn:
                while True:
                    cur = await conn.execute(_XACT_STATUS, (xid,))
                    row = await cur.fetchone()
                    status = None if row is None else row[0]
                    if status != "in progress" or loop.time() > deadline:
                        return status
                    await asyncio.sleep(0.05)
        except psycopg.Error:
            return None

    async def exchange(self, table: str, row: RowKey, column: str,
                       value: Value | Absent) -> Value | Absent:
        from agent._postgres_sql import exchange_steps

        await self.open()
        info = self._write_target(table, row, column, value)
        return await self._call(  # type: ignore[no-any-return]
            exchange_steps(info, row, column, value),
            f"the write of {table}[{row!r}].{column}", True)

    async def compare_exchange(self, table: str, row: RowKey, column: str,
                               expected: Value | Absent,
                               value: Value | Absent) -> tuple[bool, Value | Absent]:
        from agent._postgres_sql import compare_exchange_steps

        await self.open()
        info = self._write_target(table, row, column, expected, value)
        return await self._call(  # type: ignore[no-any-return]
            compare_exchange_steps(info, row, column, expected, value),
            f"the conditional write of {table}[{row!r}].{column}", True)

    async def get(self, table: str, row: RowKey, column: str) -> Value | Absent:
        from agent._postgres_sql import get_steps

        await self.open()
        info = self._read_target(table, row, column)
        return await self._call(get_steps(info, row, column),  # type: ignore[no-any-return]
                                f"the read of {table}[{row!r}].{column}", False)

    async def read_row(self, table: str, row: RowKey) -> dict[str, Value]:
        from agent._postgres_sql import read_row_steps

        await self.open()
        info = self._read_target(table, row, None)
        return await self._call(read_row_steps(info, row),  # type: ignore[no-any-return]
                                f"the read of {table}[{row!r}]", False)

    async def snapshot(self) -> dict[Cell, Value]:
        from agent._postgres_sql import scan_steps

        await self.open()
        psycopg = self._pool._psycopg
        cells: dict[Cell, Value] = {}
        try:
            async with self._pool.connection() as (conn, cur):
                await conn.set_autocommit(False)
                try:
                    await conn.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
                    async with conn.transaction():
                        for info in self._infos.values():
                            cells.update(await _arun(cur, scan_steps(info)))
                finally:
                    if not (conn.closed or conn.broken):
                        await conn.set_isolation_level(None)
                        await conn.set_autocommit(True)
        except psycopg.Error as exc:
            raise _map_error(exc, "the snapshot", False) from exc
        return cells

    async def list_cells(self, start: Bound | None, limit: int) -> CellChunk:
        """``PostgresStore.list_cells`` for asyncio."""
        from agent._baseline import CellChunk
        from agent._postgres_scan import chunk_steps, first_table

        await self.open()
        where = first_table(self._infos, start)
        if where is None:
            return CellChunk([], None)
        table, lower = where
        later = [n for n in sorted(self._infos) if n > table]
        cells, nxt = await self._call(
            chunk_steps(self._infos[table], lower, limit, later[0] if later else None),
            f"the snapshot read of {table}", False)
        return CellChunk(cells, nxt)

    async def close(self) -> None:
        await self._pool.close()

    async def __aenter__(self) -> AsyncPostgresStore:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
