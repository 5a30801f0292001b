"""Benchmark: captured cell writes through PostgresStore vs raw psycopg updates; replica apply.

``python3 -m bench.postgres_store`` starts its own throwaway PostgreSQL server (the
test fixture's code), then, in the same run and on the same cells:

1. baseline: raw psycopg autocommit ``UPDATE t SET v = $1 WHERE k = $2`` (prepared,
   binary), one connection per thread;
2. ``PostgresStore.exchange`` alone (an atomic swap that returns the old value), also
   with ``verify_commits=True`` (BEGIN, write, COMMIT: lost commits resolvable);
3. the same writes captured through the Agent (automatic one-write batches, and
   batches of 10), shipped to a sink that encodes and drops them;
4. ``PostgresReplica``: consistent changesets applied one per transaction, and in
   runs of 20 per transaction, in events/s.

It prints writes/s and the ratio to the baseline. ``synchronous_commit`` is off by
default so the figures measure our overhead rather than the disk's flush latency
(``--sync`` keeps it on: every write then waits for its WAL flush on both sides).
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from agent import Agent, MemoryStore
from agent._logging import configure_logging
from agent._postgres_spec import TableSpec
from agent._postgres_store import PostgresStore
from replay import Assembler
from replay._postgres_replica import PostgresReplica
from sequencer import EpochRecord
from sinks import EventBatch, MemorySink
from sinks.codec import encode_events
from tests.services.postgres import postgres_server

TABLE = "bench_cells"
SPEC = {TABLE: TableSpec("k", ["v", "w"])}
DDL = f"CREATE TABLE {TABLE} (k bigint PRIMARY KEY, v bigint, w bigint)"


class DropSink:
    """Encodes like a byte-oriented sink would, then drops the bytes."""

    def __init__(self) -> None:
        self.events = 0

    def write_events(self, batch: EventBatch) -> None:
        encode_events(batch)
        self.events += batch.data.num_rows

    def write_epoch(self, record: EpochRecord) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def _plan(threads: int, writes: int, rows: int, seed: int) -> list[list[tuple[int, int]]]:
    """Per thread, the (row, value) pairs to write: overlapping rows, the same every run."""
    rng = random.Random(seed)
    return [[(rng.randrange(rows), rng.randrange(1 << 40)) for _ in range(writes)]
            for _ in range(threads)]


def _timed(threads: int, work: Callable[[int], None]) -> float:
    barrier = threading.Barrier(threads + 1)

    def run(n: int) -> None:
        barrier.wait()
        work(n)

    workers = [threading.Thread(target=run, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    barrier.wait()
    started = time.perf_counter()
    for w in workers:
        w.join()
    return time.perf_counter() - started


def raw_updates(dsn: str, plan: list[list[tuple[int, int]]]) -> float:
    conns = [psycopg.connect(dsn, autocommit=True, prepare_threshold=0) for _ in plan]
    query = f"UPDATE {TABLE} SET v = %b WHERE k = %b"

    def work(n: int) -> None:
        cur = conns[n].cursor(binary=True)
        for row, value in plan[n]:
            cur.execute(query, (value, row))

    seconds = _timed(len(plan), work)
    for conn in conns:
        conn.close()
    return seconds


def store_exchanges(store: PostgresStore, plan: list[list[tuple[int, int]]]) -> float:
    def work(n: int) -> None:
        exchange = store.exchange
        for row, value in plan[n]:
            exchange(TABLE, row, "v", value)

    return _timed(len(plan), work)


def agent_writes(store: PostgresStore, plan: list[list[tuple[int, int]]], per_batch: int
                 ) -> tuple[float, int]:
    sink = DropSink()
    agent = Agent(store, sink)

    def work(n: int) -> None:
        writes = plan[n]
        if per_batch == 1:
            for row, value in writes:
                agent.set(TABLE, row, "v", value)
            return
        for start in range(0, len(writes), per_batch):
            with agent.batch():
                for row, value in writes[start:start + per_batch]:
                    agent.set(TABLE, row, "v", value)

    seconds = _timed(len(plan), work)
    agent.close()
    return seconds, sink.events


def replica_apply(dsn: str, changesets: list[Any], per_transaction: int) -> float:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {TABLE}")
        conn.execute("DROP TABLE IF EXISTS cdc_agent_position")
    with PostgresReplica(dsn, SPEC) as replica:
        started = time.perf_counter()
        for start in range(0, len(changesets), per_transaction):
            replica.apply_many(changesets[start:start + per_transaction])
        return time.perf_counter() - started


def replica_baseline(dsn: str, changesets: list[Any]) -> float:
    """Plain psycopg: per changeset, one transaction of executemany upserts, no position."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {TABLE}")
        query = (f"INSERT INTO {TABLE} (k, v, w) VALUES (%b, %b, %b) ON CONFLICT (k) DO UPDATE "
                 "SET v = EXCLUDED.v, w = EXCLUDED.w")
        started = time.perf_counter()
        for changeset in changesets:
            rows: dict[int, list[Any]] = {}
            for (_t, row, column), value in changeset.changes.items():
                rows.setdefault(row, [row, None, None])[1 if column == "v" else 2] = value
            with conn.transaction(), conn.cursor(binary=True) as cur:
                cur.executemany(query, list(rows.values()))
        return time.perf_counter() - started


def make_changesets(count: int, events: int, rows: int, seed: int) -> list[Any]:
    rng = random.Random(seed)
    sink = MemorySink()
    agent = Agent(MemoryStore(), sink)
    for _ in range(count):
        with agent.batch():
            for _ in range(events):
                agent.set(TABLE, rng.randrange(rows), rng.choice("vw"), rng.randrange(1 << 40))
    agent.close()
    return list(Assembler().changesets(sink.records))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--writes", type=int, default=1500, help="writes per thread")
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--changesets", type=int, default=200)
    parser.add_argument("--events", type=int, default=100, help="events per changeset")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds")
    parser.add_argument("--sync", action="store_true", help="keep synchronous_commit on")
    parser.add_argument("--replica-only", action="store_true",
                        help="skip the cell writes; only the replica figures")
    args = parser.parse_args(argv)
    configure_logging(False)

    with postgres_server() as server:
        dsn = server.create_database("bench")
        replica_dsn = server.create_database("bench_replica")
        for url in (dsn, replica_dsn):
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(DDL)
                conn.execute(f"INSERT INTO {TABLE} (k, v) SELECT g, 0 FROM "
                             f"generate_series(0, {args.rows - 1}) AS g")
                if not args.sync:
                    conn.execute("SELECT set_config('synchronous_commit', 'off', false)")
                    conn.execute(f"ALTER DATABASE {conn.info.dbname} "
                                 "SET synchronous_commit = off")
        plan = _plan(args.threads, args.writes, args.rows, seed=1)
        total = args.threads * args.writes
        best: dict[str, float] = {}
        runs: dict[str, list[float]] = {}

        def keep(name: str, seconds: float) -> None:
            best[name] = min(best.get(name, float("inf")), seconds)
            runs.setdefault(name, []).append(seconds)

        with PostgresStore(dsn, SPEC, pool_size=args.threads) as store, \
                PostgresStore(dsn, SPEC, pool_size=args.threads, verify_commits=True) as verified:
            store_exchanges(store, plan[:1])  # warm up: connections, prepared statements
            store_exchanges(verified, plan[:1])
            for _ in range(0 if args.replica_only else args.rounds):
                keep("raw", raw_updates(dsn, plan))
                keep("store", store_exchanges(store, plan))
                keep("verified", store_exchanges(verified, plan))
                seconds, shipped = agent_writes(store, plan, 1)
                assert shipped == total, (shipped, total)
                keep("agent1", seconds)
                keep("agent10", agent_writes(store, plan, 10)[0])

        changesets = make_changesets(args.changesets, args.events, args.rows, seed=2)
        events = sum(c.event_count for c in changesets)
        for _ in range(args.rounds):
            keep("replica_base", replica_baseline(replica_dsn, changesets))
            keep("replica1", replica_apply(replica_dsn, changesets, 1))
            keep("replica20", replica_apply(replica_dsn, changesets, 20))

    def ratio(name: str, baseline: str) -> float:
        """Median over rounds of the ratio to the baseline of the same round (the machine's
        load drifts between rounds; within one round both saw about the same)."""
        return statistics.median(
            b / s for s, b in zip(runs[name], runs[baseline], strict=True))

    if not args.replica_only:
        _print_writes(args, total, best, ratio)
    base = events / best["replica_base"]
    print(f"Replica apply: {len(changesets)} changesets x {args.events} events")
    print(f"  {'executemany upserts, no position':<40}{base:>10,.0f} events/s   1.00")
    for name, label in (("replica1", "PostgresReplica, 1 changeset/txn"),
                        ("replica20", "PostgresReplica, 20 changesets/txn")):
        rate = events / best[name]
        print(f"  {label:<40}{rate:>10,.0f} events/s   {ratio(name, 'replica_base'):.2f}")
    return 0


def _print_writes(args: argparse.Namespace, total: int, best: dict[str, float],
                  ratio: Callable[[str, str], float]) -> None:
    raw = total / best["raw"]
    print(f"PostgreSQL cell writes: {args.threads} threads x {args.writes} writes on "
          f"{args.rows} rows, synchronous_commit={'on' if args.sync else 'off'} "
          f"(best rate of {args.rounds} rounds; ratio: median of per-round ratios)")
    print(f"  {'raw psycopg UPDATE (baseline)':<40}{raw:>10,.0f} writes/s   1.00")
    for name, label in (("store", "PostgresStore.exchange"),
                        ("verified", "PostgresStore.exchange, verify_commits"),
                        ("agent1", "Agent.set, one write per batch"),
                        ("agent10", "Agent.set, batches of 10")):
        rate = total / best[name]
        print(f"  {label:<40}{rate:>10,.0f} writes/s   {ratio(name, 'raw'):.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
