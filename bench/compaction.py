"""Logical compaction of a wal3 log against three cursors: events/s and log size.

Run: ``python3 -m bench.compaction [--events N] [--cells C]``. A log on the local
filesystem is written first (not timed) by an Agent: ``--events`` cell writes in
batches of 20 from 2 writers over ``--cells`` cells (one table, 10 columns), with a
quiescence point forced at least every 10 ms. Three
cursors stand at 1/4, 1/2 and 3/4 of the log. Then, each timed once (best of
``--runs`` for the baseline):

- the baseline: a plain replay of the whole log, ``Assembler().changesets(read_log(uri))``;
- ``compact_log(uri)``: the same replay, plus capturing the state at each cursor,
  writing the checkpoint and two stripes, publishing them and collecting the fragments
  below the newest cursor;
- a fresh reader of the compacted log (checkpoint, stripes, then the tail).

Printed: events/s of each against the baseline (ratio), and the log's size on disk
(every object under its folder) before and after.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
import time
from pathlib import Path

from agent import Agent, MemoryStore
from bench._util import best_of, report
from replay import Assembler, compact_log


def write_log(uri: str, events: int, cells: int, writers: int = 2, batch: int = 20) -> None:
    from sinks.wal3 import Wal3Sink

    # Forced quiescence every 10 ms: two busy writers otherwise rarely quiesce, and the
    # events of an interval not yet quiescent at a cursor are carried whole.
    agent = Agent(MemoryStore(), Wal3Sink(uri), max_quiescence_interval=0.01)
    rows = max(1, cells // 10)
    per_writer = events // writers

    def write(w: int) -> None:
        for start in range(0, per_writer, batch):
            with agent.batch():
                for i in range(start, min(start + batch, per_writer)):
                    n = (w * 7919 + i * 104_729) % (rows * 10)
                    agent.set("t", n // 10, f"c{n % 10}", i)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    agent.close()


def size_of(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--cells", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args(argv)

    from sinks.wal3 import CursorStore, LogReader, iter_state_deltas, load_state_index, read_log

    workdir = Path(tempfile.mkdtemp(prefix="cdc-compaction-bench-"))
    folder = workdir / "log"
    uri = f"file://{folder}"
    try:
        started = time.perf_counter()
        write_log(uri, args.events, args.cells)
        end = LogReader(uri).manifest().next_offset
        for name, point in (("q1", end // 4), ("q2", end // 2), ("q3", 3 * end // 4)):
            CursorStore(uri).init(name, point)
        before = size_of(folder)
        print(f"log: {args.events:,} events over {args.cells:,} cells, {end - 1:,} records, "
              f"{before:,} bytes (written in {time.perf_counter() - started:.1f} s); "
              f"cursors at {end // 4:,}, {end // 2:,}, {3 * end // 4:,}")

        def replay() -> int:
            events = sum(c.event_count for c in Assembler().changesets(read_log(uri)))
            assert events == args.events, (events, args.events)
            return events

        baseline = best_of(args.runs, replay)
        started = time.perf_counter()
        result = compact_log(uri)
        elapsed = time.perf_counter() - started
        after = size_of(folder)
        rate = args.events / elapsed
        report("compact_log (3 cursors, then gc)", rate, "plain replay", baseline,
               "events/s", "the replay bounds it: ratio near 1")
        print(f"compaction took {elapsed:.1f} s: checkpoint {result.checkpoint_cells:,} cells, "
              f"stripes {result.stripe_cells} cells, {result.bytes_written:,} bytes written, "
              f"{result.events_replaced:,} events replaced")
        print(f"log size: before {before:,} bytes, after {after:,} bytes "
              f"(ratio {after / before:.3f})")
        reader = LogReader(uri)
        index = load_state_index(reader.store, reader.manifest())
        assert index is not None
        carried = [(len(d.carried), sum(map(len, d.carried)))
                   for d in iter_state_deltas(reader.store, index)]
        print("carried (records of intervals open at each point: messages, bytes): "
              + ", ".join(f"{n} / {b:,}" for n, b in carried))

        def fresh() -> int:
            reader = Assembler()
            list(reader.changesets(read_log(uri)))
            assert len(reader.state) <= args.cells
            return args.events

        report("fresh reader of the compacted log", best_of(args.runs, fresh),
               "plain replay", baseline, "events/s (of the original log)",
               "faster than replaying everything")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
