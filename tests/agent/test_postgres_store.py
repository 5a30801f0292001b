"""PostgresStore and AsyncPostgresStore against a real PostgreSQL server."""

from __future__ import annotations

import asyncio
import math
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent import Agent, InvalidWrite, MemoryStore, RelaxedStore
from agent._postgres_spec import (
    PostgresError,
    SchemaMismatch,
    TableSpec,
    WriteFailed,
    WriteOutcomeUnknown,
)
from agent._postgres_store import AsyncPostgresStore, PostgresStore, _map_error
from agent._store import same_value
from replay import Assembler
from sequencer import ABSENT
from sinks import MemorySink
from tests.agent._postgres_tables import KINDS, TABLES, create_tables
from tests.agent._tcp_proxy import CuttingProxy

pytestmark = pytest.mark.pg

_SETTINGS = settings(max_examples=60, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture,
                                            HealthCheck.too_slow])


@pytest.fixture(scope="module")
def dsn(pg_server) -> str:  # type: ignore[no-untyped-def]
    """A database with the test tables, shared by the module (tests use their own rows)."""
    url = pg_server.create_database("store_tests")
    create_tables(url)
    return url


@pytest.fixture(scope="module")
def store(dsn: str) -> Iterator[PostgresStore]:
    with PostgresStore(dsn, TABLES, pool_size=6) as s:
        yield s


@pytest.fixture(scope="module")
def verified_store(dsn: str) -> Iterator[PostgresStore]:
    with PostgresStore(dsn, TABLES, pool_size=2, verify_commits=True) as s:
        yield s


def _float(bits: int) -> float:
    return float(struct.unpack("<d", struct.pack("<Q", bits))[0])


def _bits(value: float) -> int:
    return int(struct.unpack("<Q", struct.pack("<d", value))[0])


FLOATS = st.one_of(
    st.integers(0, (1 << 64) - 1).map(_float),  # every bit pattern: NaN payloads, -0.0, inf
    st.floats(allow_nan=True),
    st.sampled_from([0.0, -0.0, math.inf, -math.inf, _float(0x7FF0000000000001),
                     _float(0xFFF8000000000123)]),
)
TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"))
VALUES = {
    int: st.integers(-(1 << 63), (1 << 63) - 1),
    float: FLOATS,
    str: TEXT,
    bytes: st.binary(max_size=64),
    bool: st.booleans(),
}


def _values_for(table: str, column: str) -> st.SearchStrategy[object]:
    kind = KINDS[(table, column)]
    strategy = VALUES[kind]
    if (table, column) == ("plain", "n"):
        strategy = st.integers(-(1 << 31), (1 << 31) - 1)
    if (table, column) == ("plain", "s"):
        strategy = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"),
                           max_size=8)
    if table == "cells":
        strategy = st.one_of(st.none(), strategy)
    return strategy


CELLS = st.sampled_from(sorted(KINDS)).flatmap(
    lambda tc: st.tuples(st.just(tc[0]), st.just(tc[1]), _values_for(*tc)))

_row_ids = iter(range(1_000_000, 10_000_000))


def _fresh_row(table: str) -> int | str:
    n = next(_row_ids)
    return n if table == "cells" else f"r{n}"


# -- values ----------------------------------------------------------------------------------


@_SETTINGS
@given(cell=CELLS, second=st.data())
def test_values_round_trip_bit_for_bit(store: PostgresStore, cell, second) -> None:  # type: ignore[no-untyped-def]
    """Every value a column can hold comes back with the same bits, as value and as old."""
    table, column, value = cell
    row = _fresh_row(table)
    assert store.exchange(table, row, column, value) is ABSENT
    assert same_value(store.get(table, row, column), value)
    assert same_value(store.read_row(table, row)[column], value)
    other = second.draw(_values_for(table, column))
    assert same_value(store.exchange(table, row, column, other), value)
    swapped, old = store.compare_exchange(table, row, column, other, value)
    assert swapped and same_value(old, other)


def test_float_payloads_survive_and_compare_by_bits(store: PostgresStore) -> None:
    """NaN payloads and -0.0 round-trip; compare_exchange tells them apart."""
    row = _fresh_row("cells")
    quiet, payload = _float(0x7FF8000000000000), _float(0x7FF8000000000001)
    store.exchange("cells", row, "f", payload)
    assert _bits(store.get("cells", row, "f")) == 0x7FF8000000000001  # type: ignore[arg-type]
    assert store.compare_exchange("cells", row, "f", quiet, 1.0)[0] is False
    swapped, old = store.compare_exchange("cells", row, "f", payload, -0.0)
    assert swapped and _bits(old) == 0x7FF8000000000001  # type: ignore[arg-type]
    assert store.compare_exchange("cells", row, "f", 0.0, 2.0) == (False, -0.0)
    assert _bits(store.get("cells", row, "f")) == _bits(-0.0)  # type: ignore[arg-type]


def test_absent_none_and_presence(store: PostgresStore) -> None:
    """With a presence column None and ABSENT differ; deleting clears only that cell."""
    row = _fresh_row("cells")
    assert store.get("cells", row, "s") is ABSENT
    assert store.exchange("cells", row, "s", None) is ABSENT
    assert store.get("cells", row, "s") is None
    assert store.get("cells", row, "i") is ABSENT
    store.exchange("cells", row, "i", 7)
    assert store.read_row("cells", row) == {"s": None, "i": 7}
    assert store.exchange("cells", row, "s", ABSENT) is None
    assert store.read_row("cells", row) == {"i": 7}
    assert store.compare_exchange("cells", row, "s", None, "x") == (False, ABSENT)
    assert store.compare_exchange("cells", row, "s", ABSENT, "x") == (True, ABSENT)
    assert store.exchange("cells", row, "i", ABSENT) == 7
    assert store.exchange("cells", row, "i", ABSENT) is ABSENT
    missing = _fresh_row("cells")
    assert store.exchange("cells", missing, "i", ABSENT) is ABSENT
    assert store.compare_exchange("cells", missing, "i", 1, 2) == (False, ABSENT)
    assert store.read_row("cells", missing) == {}


def test_null_means_absent_without_presence_column(store: PostgresStore, dsn: str) -> None:
    """Without a presence column, NULL is ABSENT and None is refused before writing."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO plain (k, n, s) VALUES ('legacy', NULL, 'ab')")
    assert store.get("plain", "legacy", "n") is ABSENT
    assert store.read_row("plain", "legacy") == {"s": "ab"}
    assert store.exchange("plain", "legacy", "n", 3) is ABSENT
    with pytest.raises(InvalidWrite, match="cannot hold None"):
        store.exchange("plain", "legacy", "s", None)
    assert store.read_row("plain", "legacy") == {"s": "ab", "n": 3}
    assert store.exchange("plain", "legacy", "s", ABSENT) == "ab"
    assert store.snapshot()[("plain", "legacy", "n")] == 3
    assert ("plain", "legacy", "s") not in store.snapshot()


@pytest.mark.parametrize(
    ("table", "column", "value", "message"),
    [
        ("cells", "s", "a\x00b", "NUL"),
        ("cells", "s", "\ud800", "cannot be encoded as UTF-8"),
        ("cells", "i", True, "holds int values only"),
        ("cells", "i", 1.5, "holds int values only"),
        ("cells", "f", 1, "holds float values only"),
        ("cells", "z", 1, "holds bool values only"),
        ("cells", "b", "text", "holds bytes values only"),
        ("plain", "n", 1 << 31, "does not fit"),
        ("plain", "s", "123456789", "longer than"),
        ("plain", "n", None, "cannot hold None"),
        ("cells", "i", 1 << 64, "64-bit"),
        ("cells", "nope", 1, "not one of table 'cells'"),
        ("nope", "i", 1, "table 'nope' is not one of"),
    ],
)
def test_values_postgres_cannot_hold_are_refused_before_writing(
        store: PostgresStore, table: str, column: str, value: object, message: str) -> None:
    """A refused write raises InvalidWrite, changes nothing, and the agent logs nothing."""
    sink = MemorySink()
    agent = Agent(store, sink)
    row = _fresh_row(table if table in ("cells", "plain") else "cells")
    before = store.snapshot()
    with pytest.raises(InvalidWrite, match=message), agent.batch():
        agent.set(table, row, column, value)  # type: ignore[arg-type]
    agent.close()
    assert _same(store.snapshot(), before)
    assert sink.events == []


def test_wrong_row_key_type_is_refused(store: PostgresStore) -> None:
    """A row key of the wrong type for the key column is refused before writing."""
    with pytest.raises(InvalidWrite, match="row key"):
        store.exchange("cells", "one", "i", 1)
    with pytest.raises(InvalidWrite, match="row key"):
        store.get("plain", 5, "n")


# -- schema --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ddl", "spec", "message"),
    [
        ("", TableSpec("k", ["v"]), "does not exist"),
        ("CREATE TABLE t (k bigint PRIMARY KEY, v bigint)", TableSpec("k", ["w"]),
         r"no column\(s\) \['w'\]"),
        ("CREATE TABLE t (k bigint PRIMARY KEY, v numeric)", TableSpec("k", ["v"]),
         "type numeric"),
        ("CREATE TABLE t (k bigint PRIMARY KEY, v real)", TableSpec("k", ["v"]), "type real"),
        ("CREATE TABLE t (k bigint PRIMARY KEY, v bigint NOT NULL)", TableSpec("k", ["v"]),
         "NOT NULL"),
        ("CREATE TABLE t (k bigint, v bigint)", TableSpec("k", ["v"]), "unique index"),
        ("CREATE TABLE t (k bigint PRIMARY KEY, v bigint, p text)",
         TableSpec("k", ["v"], presence_column="p"), "must be text"),
        ("CREATE TABLE t (k numeric PRIMARY KEY, v bigint)", TableSpec("k", ["v"]),
         "key columns may be"),
    ],
)
def test_tables_that_do_not_fit_fail_at_construction(
        pg_database: Callable[..., str], ddl: str, spec: TableSpec, message: str) -> None:
    """Missing tables or columns, unmappable types, NOT NULL, no unique key: SchemaMismatch."""
    url = pg_database()
    if ddl:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(ddl)
    with pytest.raises(SchemaMismatch, match=message):
        PostgresStore(url, {"t": spec})


def test_spec_itself_is_checked() -> None:
    """A TableSpec naming the key as a value column, or repeating a column, is refused."""
    with pytest.raises(SchemaMismatch, match="key or presence"):
        TableSpec("k", ["k", "v"])
    with pytest.raises(SchemaMismatch, match="repeat"):
        TableSpec("k", ["v", "v"])
    with pytest.raises(InvalidWrite, match="not an identifier"):
        TableSpec("k", ["bad name"])


# -- the model: PostgresStore behaves like MemoryStore, cell by cell ---------------------------

_SMALL = {
    int: st.sampled_from([0, 1, -1, 1 << 30]),
    float: st.sampled_from([0.0, -0.0, math.nan, _float(0x7FF8000000000001), 1.5]),
    str: st.sampled_from(["", "a", "é"]),
    bytes: st.sampled_from([b"", b"\x00", b"a"]),
    bool: st.booleans(),
}


def _small_value(table: str, column: str, absent: bool = True) -> st.SearchStrategy[object]:
    options = [_SMALL[KINDS[(table, column)]]]
    if table == "cells":
        options.append(st.none())
    if absent:
        options.append(st.just(ABSENT))
    return st.one_of(*options)


OPS = st.sampled_from(sorted(KINDS)).flatmap(lambda tc: st.one_of(
    st.tuples(st.just("exchange"), st.just(tc), st.integers(0, 2), _small_value(*tc)),
    st.tuples(st.just("cas"), st.just(tc), st.integers(0, 2),
              st.tuples(_small_value(*tc), _small_value(*tc))),
    st.tuples(st.just("get"), st.just(tc), st.integers(0, 2), st.none()),
    st.tuples(st.just("read_row"), st.just(tc), st.integers(0, 2), st.none()),
))


def _same(a: object, b: object) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if a is ABSENT or b is ABSENT:
        return a is b
    return same_value(a, b)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=st.lists(OPS, max_size=25))
def test_store_behaves_like_memory_store(store: PostgresStore, ops) -> None:  # type: ignore[no-untyped-def]
    """Random single-threaded operations give the same results as MemoryStore, bit for bit."""
    _check_against_model(store, ops)


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=st.lists(OPS, max_size=25))
def test_verified_store_behaves_like_memory_store(verified_store: PostgresStore, ops) -> None:  # type: ignore[no-untyped-def]
    """With verify_commits (BEGIN, write returning its xid, COMMIT) the results are the same."""
    _check_against_model(verified_store, ops)


def _check_against_model(store: PostgresStore, ops) -> None:  # type: ignore[no-untyped-def]
    base = next(_row_ids) * 10
    model = MemoryStore()
    for op, (table, column), index, arg in ops:
        row = base + index if table == "cells" else f"m{base + index}"
        if op == "exchange":
            got = store.exchange(table, row, column, arg)
            want = model.exchange(table, row, column, arg)
        elif op == "cas":
            got = store.compare_exchange(table, row, column, *arg)
            want = model.compare_exchange(table, row, column, *arg)
        elif op == "get":
            got, want = store.get(table, row, column), model.get(table, row, column)
        else:
            got, want = store.read_row(table, row), model.read_row(table, row)
        assert _same(got, want), (op, table, row, column, arg, got, want)
    mine = {c: v for c, v in store.snapshot().items()
            if c[1] in range(base, base + 3) or c[1] in {f"m{base + i}" for i in range(3)}}
    assert _same(mine, model.snapshot())


# -- concurrency -----------------------------------------------------------------------------


def _check_chain(pairs: list[tuple[object, object]], final: object) -> None:
    """Concurrent exchanges on one cell form one chain: each value replaced exactly once."""
    olds = Counter(old for old, _new in pairs)
    assert max(olds.values()) == 1, "two writers replaced the same value: a lost update"
    news = {new for _old, new in pairs}
    assert set(olds) == ({ABSENT} | news) - {final}


def test_concurrent_exchanges_on_one_cell_each_see_what_they_replaced(
        store: PostgresStore) -> None:
    """Threads racing on one missing cell: exactly one creates it, no value is lost."""
    row = _fresh_row("cells")
    pairs: list[tuple[object, object]] = []
    lock = threading.Lock()
    start = threading.Barrier(6)

    def writer(n: int) -> None:
        start.wait()
        for i in range(40):
            value = n * 1000 + i
            old = store.exchange("cells", row, "i", value)
            with lock:
                pairs.append((old, value))

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _check_chain(pairs, store.get("cells", row, "i"))


def test_concurrent_compare_exchange_counts_exactly(store: PostgresStore) -> None:
    """A CAS-loop counter incremented from several threads loses no increment."""
    row = _fresh_row("cells")
    swaps = Counter[int]()
    start = threading.Barrier(4)

    def incrementer(n: int) -> None:
        start.wait()
        for _ in range(25):
            current = store.get("cells", row, "i")
            while True:
                new = 1 if current is ABSENT else current + 1  # type: ignore[operator]
                swapped, found = store.compare_exchange("cells", row, "i", current, new)
                if swapped:
                    assert _same(found, current)
                    swaps[n] += 1
                    break
                current = found

    threads = [threading.Thread(target=incrementer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(swaps.values()) == 100
    assert store.get("cells", row, "i") == 100


@pytest.mark.asyncio
@pytest.mark.parametrize("verify", [False, True])
async def test_async_store_concurrent_tasks_form_one_chain(dsn: str, verify: bool) -> None:
    """AsyncPostgresStore: asyncio tasks racing on one cell each see what they replaced."""
    row = _fresh_row("cells")
    async with AsyncPostgresStore(dsn, TABLES, pool_size=4, verify_commits=verify) as astore:
        pairs: list[tuple[object, object]] = []

        async def writer(n: int) -> None:
            for i in range(25):
                value = f"{n}-{i}"
                pairs.append((await astore.exchange("cells", row, "s", value), value))

        await asyncio.gather(*(writer(n) for n in range(8)))
        final = await astore.get("cells", row, "s")
        _check_chain(pairs, final)
        assert await astore.compare_exchange("cells", row, "s", final, None) == (True, final)
        assert await astore.read_row("cells", row) == {"s": None}
        assert (await astore.snapshot())[("cells", row, "s")] is None
        with pytest.raises(InvalidWrite, match="NUL"):
            await astore.exchange("cells", row, "s", "\x00")


@pytest.mark.asyncio
async def test_async_store_checks_tables_before_the_first_call(pg_database) -> None:  # type: ignore[no-untyped-def]
    """An unknown table fails on open, before anything is written."""
    astore = AsyncPostgresStore(pg_database(), {"missing": TableSpec("k", ["v"])})
    with pytest.raises(SchemaMismatch, match="does not exist"):
        await astore.exchange("missing", 1, "v", 1)
    await astore.close()


def test_agent_log_matches_store_under_concurrent_batches(store: PostgresStore) -> None:
    """Threads writing overlapping cells through the Agent: replaying the log gives the store."""
    base = next(_row_ids) * 10
    rows = [base + i for i in range(3)]
    seeded = {c: v for c, v in store.snapshot().items()}
    sink = MemorySink()
    agent = Agent(store, sink)
    start = threading.Barrier(4)

    def writer(n: int) -> None:
        start.wait()
        for i in range(30):
            with agent.batch():
                row = rows[(n + i) % 3]
                agent.set("cells", row, "i", n * 100 + i)
                agent.set("cells", rows[i % 3], "s", f"w{n}")
                if i % 7 == 0:
                    agent.delete("cells", row, "s")
                if i % 11 == 0:
                    agent.clear_row("cells", rows[(i + 1) % 3])
                if i % 5 == 0:
                    agent.conditional_set("cells", {row: {"z": (ABSENT, True)}})

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    agent.close()
    assembler = Assembler(initial_state=seeded)
    list(assembler.changesets(sink.records))
    assert _same(assembler.state, store.snapshot())


# -- failures --------------------------------------------------------------------------------


def _wait_for_lock_waiter(dsn: str, deadline: float) -> int:
    """The backend PID of the statement waiting on a row lock (polled; bounded)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND query LIKE 'UPDATE%'").fetchone()
            if row:
                return int(row[0])
            time.sleep(0.02)
    raise AssertionError("the write never blocked on the row lock")


def test_connection_killed_mid_write_raises_and_keeps_store_and_log_consistent(
        store: PostgresStore, dsn: str) -> None:
    """pg_terminate_backend during a write: WriteFailed, nothing written, no event logged."""
    row, other = _fresh_row("cells"), _fresh_row("cells")
    store.exchange("cells", row, "i", 1)
    seeded = store.snapshot()
    sink = MemorySink()
    agent = Agent(store, sink)
    errors: list[BaseException] = []

    def write() -> None:
        try:
            with agent.batch():
                agent.set("cells", other, "s", "kept")  # lands before the blocked write
                agent.set("cells", row, "i", 2)
        except BaseException as exc:
            errors.append(exc)

    with psycopg.connect(dsn) as locker:
        locker.execute("SELECT 1 FROM cells WHERE k = %s FOR UPDATE", (row,))
        writer = threading.Thread(target=write)
        writer.start()
        pid = _wait_for_lock_waiter(dsn, time.monotonic() + 30)
        with psycopg.connect(dsn, autocommit=True) as admin:
            assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
        writer.join()
        locker.rollback()
    assert len(errors) == 1 and isinstance(errors[0], WriteFailed), errors
    assert "did not take effect" in str(errors[0])
    assert store.get("cells", row, "i") == 1
    assert store.exchange("cells", row, "z", False) is ABSENT  # the pool dropped the dead one
    agent.close()
    assert [(e.column, e.new) for e in sink.events] == [("s", "kept")]
    assembler = Assembler(initial_state=seeded)
    list(assembler.changesets(sink.records))
    expected = store.snapshot()
    del expected[("cells", row, "z")]  # written around the agent just above
    assert _same(assembler.state, expected)


def test_errors_map_to_ours() -> None:
    """A broken connection with no server answer is an unknown outcome, never a silent one."""
    lost = psycopg.OperationalError("server closed the connection unexpectedly")
    assert isinstance(_map_error(lost, "the write of t[1].c", True), WriteOutcomeUnknown)
    assert "may or may not" in str(_map_error(lost, "the write of t[1].c", True))
    assert type(_map_error(lost, "the read", False)) is PostgresError
    refused = psycopg.errors.AdminShutdown("terminating connection")
    assert isinstance(_map_error(refused, "the write", True), WriteFailed)


def test_store_fits_the_protocol(store: PostgresStore) -> None:
    """PostgresStore is a RelaxedStore."""
    assert isinstance(store, RelaxedStore)


def test_unreachable_server_is_a_clear_error() -> None:
    """Nothing listening: the constructor says it could not read the tables."""
    from tests.services._proc import free_port

    with pytest.raises(PostgresError, match="read of the table definitions failed"):
        PostgresStore(f"host=127.0.0.1 port={free_port()} user=postgres dbname=x",
                      TABLES, connect_timeout=2)


# -- connections lost at an exact point (a cutting TCP proxy in front of the server) ------------


@pytest.fixture
def proxy(pg_server) -> Iterator[CuttingProxy]:  # type: ignore[no-untyped-def]
    cutter = CuttingProxy(pg_server.port)
    yield cutter
    cutter.close()


def _through(dsn: str, port: int) -> str:
    return psycopg.conninfo.make_conninfo(dsn, port=str(port))


def test_verified_commits_keep_store_and_log_in_agreement_when_the_link_drops(
        store: PostgresStore, dsn: str, proxy: CuttingProxy) -> None:
    """Answer of COMMIT lost: resolved as committed and logged; COMMIT lost: not applied."""
    row = _fresh_row("cells")
    sink = MemorySink()
    with PostgresStore(_through(dsn, proxy.port), TABLES, pool_size=1,
                       verify_commits=True) as vstore:
        agent = Agent(vstore, sink)
        assert agent.set("cells", row, "i", 1) is ABSENT
        proxy.arm(b"COMMIT", forward=True)  # the server commits; its answer never comes
        assert agent.set("cells", row, "i", 2) == 1
        proxy.arm(b"COMMIT", forward=False)  # the COMMIT never reaches the server
        with pytest.raises(WriteFailed, match="rolled it back"):
            agent.set("cells", row, "i", 3)
        assert agent.get("cells", row, "i") == 2  # a fresh connection (the cut one is gone)
        proxy.arm(None, forward=False)  # lost at BEGIN, before anything was written
        with pytest.raises(WriteFailed, match="before its COMMIT was sent"):
            agent.set("cells", row, "s", "x")
        assert agent.set("cells", row, "s", "y") is ABSENT  # fresh connections work
        agent.close()
    assert proxy.cuts == 3
    assert store.read_row("cells", row) == {"i": 2, "s": "y"}
    assert [(e.column, e.old, e.new) for e in sink.events] == [
        ("i", ABSENT, 1), ("i", 1, 2), ("s", ABSENT, "y")]


def test_unverified_write_lost_in_flight_is_an_unknown_outcome(
        store: PostgresStore, dsn: str, proxy: CuttingProxy) -> None:
    """Without verify_commits a write whose answer is lost raises WriteOutcomeUnknown."""
    row = _fresh_row("cells")
    with PostgresStore(_through(dsn, proxy.port), TABLES, pool_size=1) as ustore:
        ustore.exchange("cells", row, "i", 1)
        proxy.arm(None, forward=True)  # the server runs the write; its answer never comes
        with pytest.raises(WriteOutcomeUnknown, match="may or may not have taken effect"):
            ustore.exchange("cells", row, "i", 2)
        # Whether the server got the whole request before the cut decides; nobody knows.
        assert ustore.exchange("cells", row, "i", 3) in (1, 2)


def test_missing_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without psycopg, building a store says which extra to install."""
    import sys

    from agent._postgres_store import require_psycopg

    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(ImportError, match=r"cdc-agent\[postgres\]"):
        require_psycopg()
    with pytest.raises(ImportError, match=r"cdc-agent\[postgres\]"):
        PostgresStore("host=127.0.0.1", TABLES)


# -- the pools and the snapshot (one definition, agent._postgres_pool / _protocol) -------------


def test_a_connection_left_inside_a_transaction_is_not_lent_again(dsn: str) -> None:
    """A connection given back inside a transaction (a ROLLBACK that could not be sent)
    is closed, not lent: the next write commits on its own, for threads and asyncio."""
    with PostgresStore(dsn, TABLES, pool_size=1) as sync_store:
        entry = sync_store._pool.acquire()
        entry[0].execute(b"BEGIN")
        sync_store._pool.release(entry)
        assert entry[0].closed
        row = _fresh_row("cells")
        sync_store.exchange("cells", row, "s", "committed")
    with psycopg.connect(dsn, autocommit=True) as other:
        assert other.execute("SELECT s FROM cells WHERE k = %s", (row,)).fetchone() == (
            "committed",)

    async def main() -> None:
        async with AsyncPostgresStore(dsn, TABLES, pool_size=1) as astore:
            entry = await astore._pool.acquire()
            await entry[0].execute(b"BEGIN")
            await astore._pool.release(entry)
            assert entry[0].closed
            assert (await astore.exchange("cells", row, "s", "again")) == "committed"

    asyncio.run(main())
    with PostgresStore(dsn, TABLES, pool_size=1) as check:
        assert check.get("cells", row, "s") == "again"


def test_a_closed_store_refuses_calls_and_waiters_give_up(dsn: str) -> None:
    """After close() a call gets a clear PostgresError, also one that was waiting for a
    connection when the store closed."""
    store = PostgresStore(dsn, TABLES, pool_size=1)
    held = store._pool.acquire()
    errors: list[BaseException] = []

    def waiter() -> None:
        try:
            store.get("cells", 1, "s")
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=waiter)
    thread.start()
    deadline = time.monotonic() + 10
    while not store._pool._waiting and time.monotonic() < deadline:
        time.sleep(0.01)
    store.close()
    thread.join(10)
    store._pool.release(held)
    assert held[0].closed
    assert [type(e) for e in errors] == [PostgresError]
    assert "closed" in str(errors[0])
    with pytest.raises(PostgresError, match="closed"):
        store.snapshot()


def test_a_snapshot_sees_every_table_as_of_one_moment(
        dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write committed between the scans of two tables is not in the snapshot (one
    REPEATABLE READ transaction), for threads and asyncio; the next snapshot has it."""
    import agent._postgres_sql as sql

    scan_steps = sql.scan_steps
    row = f"r{next(_row_ids)}"
    writes = iter(range(1, 100))

    def scan_then_write(info: Any) -> Any:
        cells = yield from scan_steps(info)
        if info.name == "cells":  # between the two scans, another client writes
            with psycopg.connect(dsn, autocommit=True) as other:
                other.execute("INSERT INTO plain (k, n) VALUES (%s, %s) ON CONFLICT (k) "
                              "DO UPDATE SET n = excluded.n", (row, next(writes)))
        return cells

    monkeypatch.setattr(sql, "scan_steps", scan_then_write)
    with PostgresStore(dsn, TABLES, pool_size=1) as sync_store:
        assert ("plain", row, "n") not in sync_store.snapshot()
        assert sync_store.snapshot()[("plain", row, "n")] == 1

    async def main() -> None:
        async with AsyncPostgresStore(dsn, TABLES, pool_size=1) as astore:
            assert (await astore.snapshot())[("plain", row, "n")] == 2

    asyncio.run(main())


def test_asyncio_calls_share_one_connection_and_waiters_see_a_close(dsn: str) -> None:
    """With pool_size=1, concurrent tasks take turns on the one connection (each call
    gets it in the end); a task still waiting when the store closes gets PostgresError."""
    async def main() -> None:
        async with AsyncPostgresStore(dsn, TABLES, pool_size=1) as astore:
            row = _fresh_row("cells")
            await asyncio.gather(*(astore.exchange("cells", row, "i", n) for n in range(20)))
            assert await astore.get("cells", row, "i") in range(20)
            held = await astore._pool.acquire()
            waiter = asyncio.ensure_future(astore.get("cells", row, "i"))
            for _ in range(50):
                await asyncio.sleep(0.01)
                if astore._pool._waiting:
                    break
            assert astore._pool._waiting == 1
            await astore.close()
            with pytest.raises(PostgresError, match="closed"):
                await waiter
            await astore._pool.release(held)
            assert held[0].closed

    asyncio.run(main())
