"""``cdc-agent demo --postgres DSN``: writers on PostgreSQL, replicated into ``<db>_replica``.

The demo creates two tables in the source database (``cdc_demo_accounts`` with a
presence column, ``cdc_demo_labels`` without), runs concurrent writer threads through
the Agent on a ``PostgresStore``, and ships the log to a replicator thread that applies
each consistent changeset to the same tables in ``<dbname>_replica`` (same server,
created if missing) with ``PostgresReplica``. The source's state is captured at every
quiescence point; after applying the changeset of that point the replica must equal it
bit for bit, and at the end too.
"""

from __future__ import annotations

import queue
import random
import struct
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from agent._agent import Agent
from agent._postgres_spec import TableSpec
from agent._workload import Workload
from sequencer import ABSENT, EpochRecord, Value
from sinks import EventBatch
from sinks.codec import encode_value

__all__ = [
    "DEMO_DDL",
    "DEMO_TABLES",
    "PostgresWorkload",
    "create_demo_tables",
    "run_postgres_demo",
]

DEMO_DDL: Final = """
DROP TABLE IF EXISTS cdc_demo_accounts, cdc_demo_labels;
CREATE TABLE cdc_demo_accounts (
    id bigint PRIMARY KEY, balance bigint, rate double precision, owner text, blob bytea,
    active boolean, present text[] NOT NULL DEFAULT '{}');
CREATE TABLE cdc_demo_labels (name text PRIMARY KEY, hits integer, tag varchar(16));
"""

DEMO_TABLES: Final = {
    "cdc_demo_accounts": TableSpec("id", ["balance", "rate", "owner", "blob", "active"],
                                   presence_column="present"),
    "cdc_demo_labels": TableSpec("name", ["hits", "tag"]),
}

_ROWS: Final[dict[str, tuple[int | str, ...]]] = {
    "cdc_demo_accounts": (1, 2, 3, 4),
    "cdc_demo_labels": ("a", "b", "c"),
}
_NAN_WITH_PAYLOAD: Final[float] = struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_DEAD_BEEF))[0]


def create_demo_tables(dsn: str) -> None:
    """(Re)create the demo tables in the database at ``dsn``."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(DEMO_DDL)


def _value(rng: random.Random, table: str, column: str) -> Value:
    """A random value the column holds, biased towards the awkward ones."""
    if table == "cdc_demo_accounts" and rng.random() < 0.1:
        return None
    if column == "balance":
        return rng.choice([0, -1, (1 << 63) - 1, -(1 << 63), rng.randrange(-(1 << 63), 1 << 63),
                           rng.randrange(100)])
    if column == "hits":
        return rng.randrange(-(1 << 31), 1 << 31)
    if column == "rate":
        any_bits: float = struct.unpack("<d", rng.randbytes(8))[0]
        return rng.choice([0.0, -0.0, float("inf"), _NAN_WITH_PAYLOAD, any_bits])
    if column in ("owner", "tag"):
        return "".join(rng.choice("abcé字π") for _ in range(rng.randrange(8)))
    if column == "blob":
        return rng.randbytes(rng.randrange(6))
    return rng.random() < 0.5


@dataclass
class PostgresWorkload(Workload):
    """Writer threads running random overlapping write batches on the demo tables.

    Like ``agent._workload.Workload`` (every kind of write the Agent offers), but each
    value fits the type of the column it goes to.
    """

    threads: int = 4
    batches: int = 200
    seed: int = 0
    tables: Mapping[str, TableSpec] = field(  # type: ignore[assignment]
        default_factory=lambda: dict(DEMO_TABLES))

    def operations(self, a: Any, rng: random.Random) -> list[Callable[[], Any]]:
        """The writes, as callables on ``a`` (an Agent)."""
        tables = sorted(self.tables)

        def cell() -> tuple[str, int | str, str]:
            table = rng.choice(tables)
            return table, rng.choice(_ROWS[table]), rng.choice(self.tables[table].columns)

        def batch_of_sets() -> None:
            with a.batch():
                for _ in range(rng.randrange(1, 6)):
                    table, row, column = cell()
                    a.set(table, row, column, _value(rng, table, column))

        def auto_set() -> None:
            table, row, column = cell()
            a.set(table, row, column, _value(rng, table, column))

        def update() -> None:
            table, _row, column = cell()
            rows = _ROWS[table]
            a.update(table, rng.sample(rows, rng.randrange(1, len(rows))),
                     {column: _value(rng, table, column)})

        def conditional() -> None:
            table, row, column = cell()
            seen = a.get(table, row, column)
            other = rng.choice(_ROWS[table])
            other_column = rng.choice(self.tables[table].columns)
            a.conditional_set(table, {
                row: {column: (seen, _value(rng, table, column))},
                other: {other_column: (_value(rng, table, other_column), ABSENT)},
            })

        def clear() -> None:
            table = rng.choice(tables)
            a.clear_row(table, rng.choice(_ROWS[table]))

        def delete() -> None:
            a.delete(*cell())

        return [batch_of_sets, batch_of_sets, auto_set, update, conditional, clear, delete]


def bits(state: Mapping[Any, Value]) -> dict[Any, bytes]:
    """A state with every value as its encoded bytes, so comparisons are bit for bit."""
    return {cell: encode_value(value) for cell, value in state.items()}


class _QueueSink:
    """A sink handing records to the replicator thread as they are shipped."""

    def __init__(self) -> None:
        self.queue: queue.Queue[EventBatch | EpochRecord | None] = queue.Queue()

    def write_events(self, batch: EventBatch) -> None:
        self.queue.put(batch)

    def write_epoch(self, record: EpochRecord) -> None:
        self.queue.put(record)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.queue.put(None)


@dataclass
class _Replicator:
    """Consumes the log, applies each changeset, compares with the captured source state."""

    replica: Any
    sink: _QueueSink
    captured: dict[tuple[int, int], dict[Any, bytes]]
    captured_cond: threading.Condition
    applied: int = 0
    compared: int = 0
    events: int = 0
    apply_seconds: float = 0.0
    problem: str | None = None

    def run(self) -> None:
        from replay import Assembler, InconsistentLog

        assembler = Assembler()
        try:
            while (record := self.sink.queue.get()) is not None:
                for changeset in assembler.feed(record):
                    started = time.perf_counter()
                    self.applied += self.replica.apply(changeset)
                    self.apply_seconds += time.perf_counter() - started
                    self.events += changeset.event_count
                    key = (changeset.domain_id, changeset.epoch_seq)
                    with self.captured_cond:
                        # The marker reaches us before the agent's callback has captured
                        # the source at that point: wait for it.
                        self.captured_cond.wait_for(
                            lambda key=key: key in self.captured, timeout=60)  # type: ignore[misc]
                        expected = self.captured.get(key)
                    if expected is None:
                        self.problem = f"no source state captured at epoch {changeset.epoch_seq}"
                        return
                    if bits(self.replica.snapshot()) != expected:
                        self.problem = (f"the replica differs from the source at quiescence "
                                        f"point {changeset.epoch_seq}")
                        return
                    self.compared += 1
        except InconsistentLog as exc:
            self.problem = f"the log is inconsistent: {exc}"
        except Exception as exc:
            self.problem = f"the replicator failed: {exc!r}"
        finally:
            if self.problem is not None:  # keep draining so the agent never blocks
                while self.sink.queue.get() is not None:
                    pass


def replica_dsn(dsn: str) -> str:
    """The DSN of ``<dbname>_replica`` on the same server, created if missing."""
    import psycopg
    from psycopg import conninfo, sql

    params = conninfo.conninfo_to_dict(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        source_db = conn.info.dbname
        name = f"{source_db}_replica"
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    params["dbname"] = name
    return conninfo.make_conninfo(**params)  # type: ignore[arg-type]


def run_postgres_demo(dsn: str, *, threads: int, batches: int, seed: int) -> int:
    """Run the demo against the PostgreSQL server at ``dsn``; return the exit status."""
    import psycopg

    from agent._postgres_store import PostgresStore
    from replay import REPLICA_POSITION_TABLE as POSITION_TABLE
    from replay import PostgresReplica

    target = replica_dsn(dsn)
    create_demo_tables(dsn)
    create_demo_tables(target)
    with psycopg.connect(target, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {POSITION_TABLE}")

    store = PostgresStore(dsn, DEMO_TABLES, pool_size=max(2, threads))
    replica = PostgresReplica(target, DEMO_TABLES, consumer="demo")
    sink = _QueueSink()
    captured: dict[tuple[int, int], dict[Any, bytes]] = {}
    captured_cond = threading.Condition()

    def capture(marker: EpochRecord) -> None:
        state = bits(store.snapshot())
        with captured_cond:
            captured[(marker.domain_id, marker.epoch_seq)] = state
            captured_cond.notify_all()

    replicator = _Replicator(replica, sink, captured, captured_cond)
    consumer = threading.Thread(target=replicator.run, name="pg-replicator")
    consumer.start()
    # Forced quiescence every 50 ms: overlapping writers would otherwise rarely pause.
    agent = Agent(store, sink, on_quiescence=capture, max_quiescence_interval=0.05)
    print(f"cdc-agent demo: {threads} writers x {batches} batches on PostgreSQL, "
          f"replicating into {psycopg.conninfo.conninfo_to_dict(target)['dbname']}",
          file=sys.stderr)
    started = time.perf_counter()
    try:
        PostgresWorkload(threads=threads, batches=batches, seed=seed).run(agent)
    finally:
        agent.close()
        write_seconds = time.perf_counter() - started
        consumer.join()
    final_source, final_replica = bits(store.snapshot()), bits(replica.snapshot())
    position = replica.position
    store.close()
    replica.close()

    stats = agent.stats
    print(f"events             {stats['events']:>12,}")
    print(f"write batches      {stats['batches']:>12,}")
    print(f"quiescence points  {stats['quiescence_points']:>12,}")
    print(f"changesets applied {replicator.applied:>12,}")
    print(f"states compared    {replicator.compared:>12,}")
    print(f"capture            {stats['events'] / write_seconds:>12,.0f} events/s "
          f"({write_seconds:.2f} s)")
    print(f"replica apply      "
          f"{replicator.events / max(replicator.apply_seconds, 1e-9):>12,.0f} events/s")
    print(f"replica position   {position}")
    if replicator.problem:
        print(f"MISMATCH: {replicator.problem}", file=sys.stderr)
        return 1
    if replicator.compared != stats["quiescence_points"]:
        print(f"MISMATCH: {stats['quiescence_points']} quiescence points, "
              f"{replicator.compared} compared", file=sys.stderr)
        return 1
    if final_source != final_replica:
        print("MISMATCH: the final replica differs from the source", file=sys.stderr)
        return 1
    print("OK: the replica equalled the source at every quiescence point, bit for bit")
    return 0
