"""PostgreSQL: a baseline of tables that already hold rows, taken while writers run; a
replica built from nothing (no initial state) then equals the source."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from agent import Agent, AsyncAgent
from agent._demo_postgres import DEMO_TABLES, PostgresWorkload, bits, create_demo_tables
from agent._postgres_store import AsyncPostgresStore, PostgresStore
from replay import Assembler
from replay._postgres_replica import POSITION_TABLE, PostgresReplica
from sinks import MemorySink
from sinks.codec import SnapshotChunk
from sinks.wal3 import read_log

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.pg


def _fill(dsn: str, seed: int) -> None:
    """Rows written straight into the tables, before any agent: the agent never saw them."""
    rng = random.Random(seed)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(-40, 260):
            conn.execute("INSERT INTO cdc_demo_accounts (id, balance, owner, present) VALUES "
                         "(%s, %s, %s, %s)",
                         (i, rng.randrange(-(1 << 62), 1 << 62), f"o{i}é",
                          ["balance", "owner"]))
        for i in range(120):
            conn.execute("INSERT INTO cdc_demo_labels (name, hits, tag) VALUES (%s, %s, %s)",
                         (rng.choice(["", "Z", "a", "é", "字"]) + str(i), i, None))


def test_baseline_of_existing_tables_then_a_replica_from_nothing(pg_server: Any) -> None:
    source = pg_server.create_database("baseline_source")
    target = pg_server.create_database("baseline_target")
    create_demo_tables(source)
    create_demo_tables(target)
    _fill(source, 1)
    sink = MemorySink()
    with PostgresStore(source, DEMO_TABLES) as store:
        agent = Agent(store, sink)
        workload = threading.Thread(target=PostgresWorkload(threads=2, batches=30, seed=4).run,
                                    args=(agent,))
        workload.start()
        report = agent.snapshot(chunk_rows=37)
        workload.join()
        agent.close()
        final = bits(store.snapshot())
    assert report.chunks >= 10 and report.cells >= 300 * 2 + 120
    chunks = [r for r in sink.records if isinstance(r, SnapshotChunk)]
    assert {c.hi[0] for c in chunks if c.hi is not None} == set(DEMO_TABLES)
    changesets = list(Assembler().changesets(sink.records))
    with PostgresReplica(target, DEMO_TABLES) as replica:
        replica.apply_many(changesets)
        assert bits(replica.snapshot()) == final
    # ... and applied one by one, from a replica emptied again.
    with psycopg.connect(target, autocommit=True) as conn:
        conn.execute("TRUNCATE cdc_demo_accounts, cdc_demo_labels")
        conn.execute(f"DROP TABLE IF EXISTS {POSITION_TABLE}")
    with PostgresReplica(target, DEMO_TABLES) as replica:
        for changeset in changesets:
            replica.apply(changeset)
        assert bits(replica.snapshot()) == final


def test_async_postgres_store_lists_the_same_cells(pg_server: Any) -> None:
    dsn = pg_server.create_database("baseline_async")
    create_demo_tables(dsn)
    _fill(dsn, 2)

    async def main() -> tuple[MemorySink, dict[Any, bytes]]:
        store = AsyncPostgresStore(dsn, DEMO_TABLES)
        sink = MemorySink()
        agent = AsyncAgent(store, sink)
        await agent.snapshot(chunk_rows=50)
        await agent.set("cdc_demo_labels", "new", "hits", 1)
        agent.close()
        final = bits(await store.snapshot())
        await store.close()
        return sink, final

    sink, final = asyncio.run(main())
    snaps = list(Assembler().replay(sink.records))
    assert bits(snaps[-1].state) == final


def test_cdc_agent_snapshot_of_a_configured_postgres_store(pg_server: Any,
                                                           tmp_path: Path) -> None:
    """``cdc-agent snapshot --config`` records the tables; a consumer from nothing
    rebuilds them from the wal3 log, and ``log verify`` passes. With ``--journal``, a
    rerun after it finished takes no second baseline."""
    dsn = pg_server.create_database("baseline_cli")
    create_demo_tables(dsn)
    _fill(dsn, 3)
    config = tmp_path / "snap.toml"
    config.write_text(
        f"[store]\nkind = \"postgres\"\ndsn = \"{dsn}\"\n"
        "[store.tables.cdc_demo_accounts]\nkey_column = \"id\"\n"
        "columns = [\"balance\", \"rate\", \"owner\", \"blob\", \"active\"]\n"
        "presence_column = \"present\"\n"
        "[store.tables.cdc_demo_labels]\nkey_column = \"name\"\ncolumns = [\"hits\", \"tag\"]\n"
        f"[sink]\nkind = \"wal3\"\nuri = \"file://{tmp_path / 'log'}\"\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "agent.cli", "snapshot", "--config", str(config),
               "--chunk-rows", "64", "--journal", f"file://{tmp_path / 'journal'}"]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert "cells             720" in result.stdout and "already" not in result.stdout
    again = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120,
                           check=False)
    assert again.returncode == 0, again.stderr
    assert "already recorded" in again.stdout and "cells             720" in again.stdout
    with PostgresStore(dsn, DEMO_TABLES) as store:
        final = bits(store.snapshot())
    snaps = list(Assembler().replay(read_log(f"file://{tmp_path / 'log'}")))
    assert bits(snaps[-1].state) == final
    verify = subprocess.run([sys.executable, "-m", "agent.cli", "log", "verify",
                             f"file://{tmp_path / 'log'}"], capture_output=True, text=True,
                            env=env, timeout=120, check=False)
    assert verify.returncode == 0, verify.stderr
