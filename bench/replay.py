"""Replay throughput: the ``Assembler`` alone, and ``read_log`` + ``Assembler`` against
reading the records raw.

Run: ``python3 -m bench.replay [--events N] [--batch-size B]``.

1. The assembler on one core, fed a log as a reader decodes it (``EventBatch``es and
   ``EpochRun``s, as the agent ships them): 400k events in batches of 20 from 4
   writers (goal >= 1M events/s), and 50k single-event batches, each its own quiescent
   interval (goal >= 500k events/s). For information, the same log with each run
   expanded into its ``EpochRecord``s (the path of logs written before codec version 3).
2. A wal3 log on the local filesystem is written (not timed) from an Agent's capture.
   Best of several runs each: the baseline reads every record of every fragment
   (``LogReader``: fetch, Parquet decode, fragment setsum check) and nothing more; the
   measured path is ``Assembler().changesets(read_log(uri, runs=True))``: the same
   reading, plus decoding each record and verifying and applying every quiescent
   interval. Goal: ratio >= 0.5.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent import Agent, MemoryStore
from bench._util import best_of, report, write_overlapping_batches
from replay import Assembler
from sequencer import EpochRecord
from sinks import EpochRun, EventBatch
from sinks.codec import decode, encode_epoch, encode_epochs, encode_events, records


class _DecodedSink:
    """Keeps each record as a reader decodes it from the bytes a log stores."""

    def __init__(self) -> None:
        self.items: list[object] = []

    def write_events(self, batch: EventBatch) -> None:
        self.items.append(decode(encode_events(batch)))

    def write_epoch(self, record: EpochRecord) -> None:
        self.items.append(decode(encode_epoch(record)))

    def write_epochs(self, run: EpochRun) -> None:
        self.items.append(decode(encode_epochs(run)))

    def flush(self) -> None: ...
    def close(self) -> None: ...


def bench_assembler(events: int, batch_size: int, writers: int) -> None:
    sink = _DecodedSink()
    write_overlapping_batches(Agent(MemoryStore(), sink), events, batch_size, writers)
    log = sink.items
    expanded = [r for item in log for r in records(item)]  # type: ignore[arg-type]

    def assemble(items: list[Any]) -> Callable[[], int]:
        def run() -> int:
            n = 0
            for changeset in Assembler().changesets(items):
                n += changeset.event_count
            assert n == events, (n, events)
            return n
        return run

    rates: dict[str, float] = {}
    for _ in range(3):  # alternate: the machine is shared and its load drifts
        for name, items in (("runs", log), ("records", expanded)):
            rates[name] = max(rates.get(name, 0.0), best_of(1, assemble(items)))
    goal = "1,000,000" if batch_size > 1 else "500,000"
    print(f"assembler: {events:,} events, batches of {batch_size}, {writers} writers: "
          f"{rates['runs']:,.0f} events/s on one core (goal >= {goal})")
    report("  epoch runs vs the same records one by one", rates["runs"], "records",
           rates["records"], "events/s", "information only")


def write_log(uri: str, events: int, batch_size: int, writers: int) -> None:
    from sinks.wal3 import Wal3Sink

    write_overlapping_batches(Agent(MemoryStore(), Wal3Sink(uri)), events, batch_size,
                              writers)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--assembler-events", type=int, default=400_000)
    args = parser.parse_args(argv)

    bench_assembler(args.assembler_events, 20, 4)
    bench_assembler(args.assembler_events // 8, 1, 1)

    from sinks.wal3 import LogReader, read_log

    workdir = Path(tempfile.mkdtemp(prefix="cdc-replay-bench-"))
    uri = f"file://{workdir / 'log'}"
    try:
        write_log(uri, args.events, args.batch_size, args.writers)
        reader = LogReader(uri)
        fragments = reader.scan()
        records = sum(f.limit - f.start for f in fragments)
        print(f"log: {args.events:,} events in batches of {args.batch_size} from "
              f"{args.writers} writers, {records:,} records in {len(fragments):,} fragments")

        def raw() -> int:
            total = 0
            for record in LogReader(uri).records():
                total += len(record.body) > 0
            return args.events

        def assembled() -> int:
            events = 0
            for changeset in Assembler().changesets(read_log(uri, runs=True)):
                events += changeset.event_count
            assert events == args.events, (events, args.events)
            return events

        rates = {}
        for _ in range(3):  # alternate: the machine is shared and its load drifts
            rates["raw"] = max(rates.get("raw", 0.0), best_of(1, raw))
            rates["assembled"] = max(rates.get("assembled", 0.0), best_of(1, assembled))
        report("read_log + Assembler -> changesets", rates["assembled"], "raw records",
               rates["raw"], "events/s", ">= 0.5")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
