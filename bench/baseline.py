"""Baseline snapshot benchmarks: cells/s against a plain scan, and writers' waits.

Run: ``python3 -m bench.baseline [--rows N] [--chunk-rows N]``. The baseline is
``Agent.snapshot()`` of a MemoryStore into a sink that only counts (the chunk's Arrow
encoding and setsum are part of it); the plain scan is ``MemoryStore.snapshot()`` of
the same store (wall clock, and CPU time of every thread, which the machine's load
disturbs less). Then, with writer threads running, the longest time a writer waited
for one chunk (the agent holds new batches back while a chunk is read).
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

from agent import Agent, MemoryStore
from bench._util import report


class CountingSink:
    """Takes records and counts the snapshot cells (no encoding beyond the chunk's own)."""

    def __init__(self) -> None:
        self.cells = 0

    def write_events(self, batch: Any) -> None:
        pass

    def write_epoch(self, record: Any) -> None:
        pass

    def write_snapshot(self, chunk: Any) -> None:
        self.cells += len(chunk)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def _store(rows: int) -> MemoryStore:
    return MemoryStore({("t", i, c): i for i in range(rows) for c in ("a", "b")}
                       | {("u", f"k{i}", "x"): f"v{i}" for i in range(rows // 10)})


def bench_baseline(rows: int, chunk_rows: int) -> None:
    store = _store(rows)
    cells = len(store.snapshot())

    def scan() -> int:
        return len(store.snapshot())

    def baseline() -> int:
        sink = CountingSink()
        with Agent(store, sink) as agent:  # type: ignore[arg-type]
            report_ = agent.snapshot(chunk_rows=chunk_rows)
        assert sink.cells == report_.cells == cells
        return cells

    # Alternated, best of five each: the machine is shared, and its load swings.
    rates: dict[str, float] = {"baseline": 0.0, "scan": 0.0}
    cpu: dict[str, float] = {"baseline": float("inf"), "scan": float("inf")}
    for _ in range(5):
        for name, work in (("baseline", baseline), ("scan", scan)):
            started, cpu_started = time.perf_counter(), time.process_time()
            work()
            rates[name] = max(rates[name], cells / (time.perf_counter() - started))
            cpu[name] = min(cpu[name], time.process_time() - cpu_started)
    report(f"baseline: Agent.snapshot() ({cells:,} cells)", rates["baseline"],
           "MemoryStore.snapshot()", rates["scan"], "cells/s", "ratio >= 0.5")
    print(f"  CPU time (every thread): baseline {cpu['baseline'] * 1e3:.0f} ms, scan "
          f"{cpu['scan'] * 1e3:.0f} ms, ratio {cpu['scan'] / cpu['baseline']:.3f}")


def bench_writer_wait(rows: int, chunk_rows: int) -> None:
    store = _store(rows)
    sink = CountingSink()
    agent = Agent(store, sink)  # type: ignore[arg-type]
    stop = threading.Event()
    waits: list[float] = []

    def writer(seed: int) -> None:
        i = seed
        longest = 0.0
        while not stop.is_set():
            started = time.perf_counter()
            with agent.batch():
                longest = max(longest, time.perf_counter() - started)
                agent.set("t", i % rows, "a", i)
            i += 7
        waits.append(longest)

    threads = [threading.Thread(target=writer, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    result = agent.snapshot(chunk_rows=chunk_rows)
    stop.set()
    for t in threads:
        t.join()
    agent.close()
    print(f"writers during a chunked baseline: {result.chunks} chunks of {chunk_rows:,} rows "
          f"in {result.elapsed:.2f} s; longest hold {result.longest_hold * 1e3:.2f} ms, "
          f"longest wait of a writer to open a batch {max(waits) * 1e3:.2f} ms, "
          f"whole baseline {result.elapsed * 1e3:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--chunk-rows", type=int, default=10_000)
    args = parser.parse_args()
    bench_baseline(args.rows, args.chunk_rows)
    bench_writer_wait(args.rows, args.chunk_rows)


if __name__ == "__main__":
    main()
