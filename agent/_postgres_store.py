"""PostgreSQL as a relaxed store: ``PostgresStore`` (threads) and ``AsyncPostgresStore`` (asyncio).

Both implement the RelaxedStore protocol over existing tables described by
``TableSpec``s: ``exchange``, ``compare_exchange``, ``get``, ``read_row``, ``snapshot``.
Every cell write is one autocommit statement that swaps the value and returns the old
one atomically (see ``agent._postgres_sql``); no transaction spans two cells. Each
call borrows a connection from a small pool, so threads (or tasks) write in parallel.

psycopg 3 is imported when a store is built; without it the error names the extra
``cdc-agent[postgres]``. How a call's statements travel (plain, the verified commit,
or the snapshot's one transaction) is written once, sans-IO, in
``agent._postgres_protocol``, which also maps psycopg's exceptions to ours, and the
pool's bookkeeping in ``agent._postgres_pool``; ``_drive``/``_adrive`` and
``_Pool``/``_AsyncPool`` here only carry the steps out and wait (threads, asyncio):

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
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agent._postgres_pool import CONNECT, WAIT, PoolSlots
from agent._postgres_protocol import (
    COMMIT,
    RELEASE,
    ROLLBACK,
    XACT_STATUS_SQL,
    Call,
    Pause,
    Statement,
    XactStatus,
    plain_call,
    snapshot_call,
    verified_call,
)
from agent._postgres_protocol import map_error as _map_error  # noqa: F401 (tests import it)
from agent._postgres_spec import SchemaMismatch, TableSpec
from sequencer import ABSENT, Absent, InvalidWrite, RowKey, Value

if TYPE_CHECKING:
    import psycopg

    from agent._baseline import CellChunk
    from agent._postgres_sql import Steps, TableInfo
    from sinks.codec import Bound

__all__ = ["AsyncPostgresStore", "PostgresStore", "require_psycopg"]

Cell = tuple[str, RowKey, str]
_Entry = tuple["psycopg.Connection[Any]", "psycopg.Cursor[Any]"]
_AsyncEntry = tuple["psycopg.AsyncConnection[Any]", "psycopg.AsyncCursor[Any]"]


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


def _fit(conn: Any) -> bool:
    """Fit to be lent again: open, not broken, and not left inside a transaction (a
    ROLLBACK that failed); libpq's PQTRANS_IDLE is 0."""
    return not (conn.closed or conn.broken) and conn.pgconn.transaction_status == 0


def _drive(pool: _Pool, call: Call, lent: _Entry | None = None) -> Any:
    """Carry a call's connection steps out for threads (``agent._postgres_protocol``
    says what each step means); ``lent``: run its statements on that connection."""
    entry = lent
    fresh: psycopg.Connection[Any] | None = None
    try:
        step = next(call)
        while True:
            result: Any = None
            try:
                kind = type(step)
                if kind is Statement:
                    if entry is None:
                        entry = pool.acquire()
                    conn, cur = entry
                    if step.begin:  # type: ignore[union-attr]
                        with conn.pipeline():
                            conn.execute(step.begin, prepare=False)  # type: ignore[union-attr]
                            cur.execute(step.query, step.params)  # type: ignore[union-attr]
                            result = cur.fetchall()
                    else:
                        cur.execute(step.query, step.params)  # type: ignore[union-attr]
                        result = cur.fetchall()  # every statement of ours returns rows
                elif step is COMMIT:
                    assert entry is not None
                    entry[1].execute(b"COMMIT", prepare=False)
                elif step is ROLLBACK:  # without a lent connection nothing was sent
                    if entry is not None and not (entry[0].closed or entry[0].broken):
                        with contextlib.suppress(Exception):
                            entry[1].execute(b"ROLLBACK", prepare=False)
                elif step is RELEASE:
                    if lent is None and entry is not None:
                        pool.release(entry)
                    entry = None
                elif kind is XactStatus:
                    if fresh is None:
                        fresh = pool.connect()
                    row = fresh.execute(XACT_STATUS_SQL, (step.xid,)).fetchone()  # type: ignore[union-attr]
                    result = (None if row is None else row[0], time.monotonic())
                elif kind is Pause:
                    time.sleep(step.seconds)  # type: ignore[union-attr]
                else:  # NOW
                    result = time.monotonic()
            except BaseException as exc:  # the call maps it (or lets it go on)
                step = call.throw(exc)
            else:
                step = call.send(result)
    except StopIteration as stop:
        return stop.value
    finally:
        if lent is None and entry is not None:
            pool.release(entry)
        if fresh is not None:
            fresh.close()


async def _adrive(pool: _AsyncPool, call: Call, lent: _AsyncEntry | None = None) -> Any:
    """``_drive`` for asyncio."""
    entry = lent
    fresh: psycopg.AsyncConnection[Any] | None = None
    try:
        step = next(call)
        while True:
            result: Any = None
            try:
                kind = type(step)
                if kind is Statement:
                    if entry is None:
                        entry = await pool.acquire()
                    conn, cur = entry
                    if step.begin:  # type: ignore[union-attr]
                        async with conn.pipeline():
                            await conn.execute(step.begin,  # type: ignore[union-attr]
                                               prepare=False)
                            await cur.execute(step.query, step.params)  # type: ignore[union-attr]
                            result = await cur.fetchall()
                    else:
                        await cur.execute(step.query, step.params)  # type: ignore[union-attr]
                        result = await cur.fetchall()
                elif step is COMMIT:
                    assert entry is not None
                    await entry[1].execute(b"COMMIT", prepare=False)
                elif step is ROLLBACK:  # without a lent connection nothing was sent
                    if entry is not None and not (entry[0].closed or entry[0].broken):
                        with contextlib.suppress(Exception):
                            await entry[1].execute(b"ROLLBACK", prepare=False)
                elif step is RELEASE:
                    if lent is None and entry is not None:
                        await pool.release(entry)
                    entry = None
                elif kind is XactStatus:
                    if fresh is None:
                        fresh = await pool.connect()
                    cursor = await fresh.execute(XACT_STATUS_SQL, (step.xid,))  # type: ignore[union-attr]
                    row = await cursor.fetchone()
                    result = (None if row is None else row[0],
                              asyncio.get_running_loop().time())
                elif kind is Pause:
                    await asyncio.sleep(step.seconds)  # type: ignore[union-attr]
                else:  # NOW
                    result = asyncio.get_running_loop().time()
            except BaseException as exc:  # the call maps it (or lets it go on)
                step = call.throw(exc)
            else:
                step = call.send(result)
    except StopIteration as stop:
        return stop.value
    finally:
        if lent is None and entry is not None:
            await pool.release(entry)
        if fresh is not None:
            await fresh.close()


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
    """``PoolSlots`` (``agent._postgres_pool``) for threads: autocommit connections made
    and closed here; a call that finds every slot lent waits on a condition. The common
    path (an idle connection is there) takes no lock."""

    def __init__(self, dsn: str, size: int, connect_timeout: float) -> None:
        self._psycopg = require_psycopg()
        self._dsn = dsn
        self._connect_timeout = connect_timeout
        self._slots: PoolSlots[_Entry] = PoolSlots(size)
        self._cond = threading.Condition(threading.Lock())
        self._waiting = 0  # threads in acquire's locked part (a release notifies them)

    def connect(self) -> psycopg.Connection[Any]:
        return self._psycopg.connect(  # type: ignore[no-any-return]
            self._dsn, autocommit=True, prepare_threshold=0,
            connect_timeout=max(1, int(self._connect_timeout)),
        )

    def acquire(self) -> _Entry:
        """A connection and its binary cursor (made once, reused for every statement)."""
        slots = self._slots
        entry = slots.take_idle()
        if entry is not None:
            return entry
        with self._cond:
            # Counted before looking: a release that adds an idle entry after take()
            # said WAIT then sees a waiter and notifies (no lost wake-up).
            self._waiting += 1
            try:
                while (got := slots.take()) is WAIT:
                    self._cond.wait()
            finally:
                self._waiting -= 1
        if got is not CONNECT:
            return got  # type: ignore[return-value]
        try:
            conn = self.connect()
        except BaseException:
            with self._cond:
                slots.failed()
                self._cond.notify()
            raise
        return conn, conn.cursor(binary=True)

    def release(self, entry: _Entry) -> None:
        conn = entry[0]
        if self._slots.keep(entry, _fit(conn)):
            if self._waiting:
                with self._cond:
                    self._cond.notify()
            return
        conn.close()
        with self._cond:
            self._slots.forget()
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            idle = self._slots.shut()
            self._cond.notify_all()  # waiters see the pool closed
        for conn, _cur in idle:
            conn.close()


class PostgresStore(_Base):
    """A relaxed store over existing PostgreSQL tables, for threads.

    ``tables`` maps each table name to its ``TableSpec``; the tables are checked
    against the catalog here (``SchemaMismatch`` if they do not fit). ``pool_size``
    bounds the connections, hence the calls running at once.
    """

    def __init__(self, dsn: str, tables: Mapping[str, TableSpec], *, pool_size: int = 8,
                 connect_timeout: float = 10.0, verify_commits: bool = False,
                 resolve_timeout: float = 30.0) -> None:
        from agent._postgres_sql import table_infos_steps

        specs = _check_tables(tables)
        self._verify = verify_commits
        self._resolve_timeout = resolve_timeout
        self._pool = _Pool(dsn, pool_size, connect_timeout)
        try:
            self._infos = self._call(table_infos_steps(specs, with_xid=verify_commits),
                                     "the read of the table definitions", False)
        except BaseException:
            self._pool.close()
            raise

    @property
    def tables(self) -> dict[str, TableSpec]:
        return {name: info.spec for name, info in self._infos.items()}

    def _call(self, steps: Steps, what: str, writing: bool) -> Any:
        psycopg = self._pool._psycopg
        if writing and self._verify:
            return _drive(self._pool, verified_call(steps, what, psycopg.Error,
                                                    self._resolve_timeout))
        return _drive(self._pool, plain_call(steps, what, writing, psycopg.Error))

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

        return _drive(self._pool, snapshot_call(  # type: ignore[no-any-return]
            [scan_steps(info) for info in self._infos.values()], "the snapshot",
            self._pool._psycopg.Error))

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
    """``PoolSlots`` for asyncio: a call that finds every slot lent waits on a condition
    (made on first use, in the running loop)."""

    def __init__(self, dsn: str, size: int, connect_timeout: float) -> None:
        self._psycopg = require_psycopg()
        self._dsn = dsn
        self._connect_timeout = connect_timeout
        self._slots: PoolSlots[_AsyncEntry] = PoolSlots(size)
        self._freed: asyncio.Condition | None = None
        self._waiting = 0  # tasks in acquire's locked part (a release wakes one)

    async def connect(self) -> psycopg.AsyncConnection[Any]:
        return await self._psycopg.AsyncConnection.connect(  # type: ignore[no-any-return]
            self._dsn, autocommit=True, prepare_threshold=0,
            connect_timeout=max(1, int(self._connect_timeout)),
        )

    def _condition(self) -> asyncio.Condition:
        if self._freed is None:
            self._freed = asyncio.Condition()
        return self._freed

    async def acquire(self) -> _AsyncEntry:
        """A connection and its binary cursor (made once, reused for every statement)."""
        slots = self._slots
        entry = slots.take_idle()
        if entry is not None:
            return entry
        freed = self._condition()
        async with freed:
            self._waiting += 1
            try:
                while (got := slots.take()) is WAIT:
                    await freed.wait()
            finally:
                self._waiting -= 1
        if got is not CONNECT:
            return got  # type: ignore[return-value]
        try:
            conn = await self.connect()
        except BaseException:
            slots.failed()
            await self._wake()
            raise
        return conn, conn.cursor(binary=True)

    async def release(self, entry: _AsyncEntry) -> None:
        conn = entry[0]
        if not self._slots.keep(entry, _fit(conn)):
            try:
                await conn.close()
            finally:
                self._slots.forget()
        await self._wake()

    async def _wake(self, every: bool = False) -> None:
        freed = self._freed
        if freed is not None and self._waiting:
            async with freed:
                if every:
                    freed.notify_all()
                else:
                    freed.notify()

    async def close(self) -> None:
        idle = self._slots.shut()
        await self._wake(every=True)  # waiters see the pool closed
        for conn, _cur in idle:
            await conn.close()


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
        from agent._postgres_sql import table_infos_steps

        if self._opened:
            return self
        self._infos = await self._call(table_infos_steps(self._specs, with_xid=self._verify),
                                       "the read of the table definitions", False)
        self._opened = True
        return self

    @property
    def tables(self) -> dict[str, TableSpec]:
        return dict(self._specs)

    async def _call(self, steps: Steps, what: str, writing: bool) -> Any:
        psycopg = self._pool._psycopg
        if writing and self._verify:
            return await _adrive(self._pool, verified_call(steps, what, psycopg.Error,
                                                           self._resolve_timeout))
        return await _adrive(self._pool, plain_call(steps, what, writing, psycopg.Error))

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
        """``PostgresStore.snapshot`` for asyncio."""
        from agent._postgres_sql import scan_steps

        await self.open()
        return await _adrive(self._pool, snapshot_call(  # type: ignore[no-any-return]
            [scan_steps(info) for info in self._infos.values()], "the snapshot",
            self._pool._psycopg.Error))

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
