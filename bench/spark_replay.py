"""Verified Spark replay against the floor of any Spark replay, in the same run.

A log of ``--events`` events over ``--cells`` cells is written through an Agent into a
wal3 log on the local filesystem (cached under /tmp between runs). Then, per Spark
master (``local[1]``, ``local[2]``), with the session start timed apart:

- floor: a plain Spark read of the same fragment files (the manifest's list), decoding
  the bodies in the executors, and a groupBy per cell keeping the last value: no
  duplicate handling, no verification, no consistent cut;
- verified: ``LogReplay(...).snapshot().count()``: both passes, every check, the state
  at the last quiescence points (goal: at most 1.5x the floor).

Also the Python assembler over the same log (``read_log`` into ``Assembler.replay``'s
final state). ``--events`` accepts several sizes (1M vs 4M: time should grow linearly).

    python3 -m bench.spark_replay [--events 1000000 4000000] [--cells 100000]
        [--driver-memory 6g]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from agent import Agent, MemoryStore
from sinks.codec import EventBatch, decode
from sinks.objstore import LocalStore
from sinks.wal3 import LogReader, Wal3Sink, WriterOptions, read_log


def write_log(path: Path, events: int, cells: int, seed: int = 0) -> str:
    """``events`` writes in batches of 1-16 over ``cells`` cells, into a wal3 log."""
    uri = f"file://{path}"
    if (path / "DONE").exists():
        return uri
    rng = random.Random(seed)
    sink = Wal3Sink(LocalStore(path, fsync=False),
                    options=WriterOptions(batch_size_records=256))
    agent = Agent(MemoryStore(), sink)
    tables = ("orders", "users", "items", "stock")
    columns = ("a", "b", "c", "d", "e")
    rows = max(1, cells // (len(tables) * len(columns)))
    written = 0
    started = time.perf_counter()
    while written < events:
        n = min(rng.randrange(1, 17), events - written)
        with agent.batch():
            for _ in range(n):
                agent.set(rng.choice(tables), rng.randrange(rows), rng.choice(columns),
                          rng.choice((rng.randrange(1 << 40), rng.random(), "v" * rng.randrange(8),
                                      None, b"\x00\x01")))
        written += n
    agent.close()
    sink.close()
    (path / "DONE").write_text(str(events))
    print(f"wrote {events:,} events over {cells:,} cells in {time.perf_counter() - started:.0f} s"
          f" -> {path}", file=sys.stderr)
    return uri


def _plain_decode(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        for body in batch.column("body").to_pylist():
            if len(body) > 4 and body[4] == 1:
                data = decode(body)
                assert isinstance(data, EventBatch)
                d = data.data
                yield pa.RecordBatch.from_arrays(
                    [d.column("table"), d.column("row"), d.column("column"),
                     pa.array(d.column("batch_id").to_numpy().view("int64")),
                     d.column("seq").cast(pa.int64()), d.column("new")],
                    names=["table", "row", "column", "batch", "seq", "new"])


def floor(spark: Any, uri: str) -> int:
    """Plain read of the manifest's fragment files + decode + groupBy per cell."""
    from pyspark.sql import functions as F

    root = uri.removeprefix("file://")
    paths = [f"file://{root}/{f.path}" for f in LogReader(uri).scan()]
    raw = spark.read.parquet(*paths).select("body")
    cells = raw.mapInArrow(
        _plain_decode, "table string, row binary, column string, batch bigint, seq bigint, "
                       "new binary")
    last = cells.groupBy("table", "row", "column").agg(
        F.max_by("new", F.struct("batch", "seq")).alias("value"))
    return int(last.count())


def verified(spark: Any, uri: str) -> int:
    from replay.spark import LogReplay

    replay = LogReplay(spark, uri)
    count = int(replay.snapshot().count())
    replay.unpersist()
    return count


def python_assembler(uri: str) -> int:
    from replay import Assembler

    assembler = Assembler()
    for _ in assembler.changesets(read_log(uri)):
        pass
    return len(assembler.state)


def timed(work: Any, *args: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    result = work(*args)
    return time.perf_counter() - started, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--cells", type=int, default=100_000)
    parser.add_argument("--masters", nargs="+", default=["local[1]", "local[2]"])
    parser.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "cdc-bench-spark"))
    parser.add_argument("--driver-memory", default="6g",
                        help="spark.driver.memory (local mode: the executors' heap too; "
                             "Spark's 1g runs out at 4M events)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting for the sessions (repeatable), e.g. to "
                             "compare one of replay.spark.SESSION_SETTINGS")
    args = parser.parse_args()
    if bad := [item for item in args.conf if "=" not in item]:
        parser.error(f"--conf {bad[0]!r} is not KEY=VALUE")
    conf = dict(item.split("=", 1) for item in args.conf)
    from tests.services.spark import start_session

    logs = {}
    for events in args.events:
        path = Path(args.dir) / f"log-{events}-{args.cells}"
        path.mkdir(parents=True, exist_ok=True)
        logs[events] = write_log(path, events, args.cells)
    for events, uri in logs.items():
        seconds, cells = timed(python_assembler, uri)
        print(f"{events:>9,} events  python assembler           {seconds:7.1f} s  "
              f"({events / seconds:,.0f} events/s, {cells:,} cells)")
    results: dict[tuple[str, int], tuple[float, float]] = {}
    for master in args.masters:
        started = time.perf_counter()
        spark = start_session(master, shuffle_partitions=8, app="cdc-agent bench",
                              **{"spark.driver.memory": args.driver_memory, **conf})
        print(f"{master}: session start {time.perf_counter() - started:.1f} s")
        for events, uri in logs.items():
            floor(spark, uri)  # warm: JIT, Python workers, file listing caches
            t_floor, n_floor = timed(floor, spark, uri)
            t_verified, n_verified = timed(verified, spark, uri)
            results[(master, events)] = (t_floor, t_verified)
            print(f"{events:>9,} events  {master:<9} floor (read+groupBy) {t_floor:7.1f} s   "
                  f"verified replay {t_verified:7.1f} s   ratio {t_verified / t_floor:5.2f}  "
                  f"(goal <= 1.5)   cells {n_verified:,} (floor {n_floor:,})")
        spark.stop()
    sizes = sorted(logs)
    for master in args.masters:
        if len(sizes) > 1:
            small, big = sizes[0], sizes[-1]
            grow = results[(master, big)][1] / results[(master, small)][1]
            print(f"{master}: verified {big:,} vs {small:,} events: {grow:.2f}x time for "
                  f"{big / small:.1f}x events (linear: {big / small:.1f})")
    if len(args.masters) > 1:
        for events in sizes:
            one = results[(args.masters[0], events)][1]
            two = results[(args.masters[-1], events)][1]
            print(f"{events:,} events: {args.masters[0]} / {args.masters[-1]} verified "
                  f"time ratio {one / two:.2f}")


if __name__ == "__main__":
    main()
