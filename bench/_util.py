"""Benchmark helpers: best-of-N timing and ratio printing (machines are shared and noisy)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


def best_of(runs: int, work: Callable[[], int]) -> float:
    """Run ``work`` (which returns how many operations it did) ``runs`` times; return the
    best rate in operations per second."""
    best = 0.0
    for _ in range(runs):
        started = time.perf_counter()
        count = work()
        elapsed = time.perf_counter() - started
        best = max(best, count / elapsed)
    return best


def report(name: str, rate: float, baseline_name: str, baseline: float, unit: str,
           goal: str) -> None:
    """One line: the rate, the baseline's rate, their ratio and the goal."""
    print(f"{name:<44} {rate:>14,.0f} {unit}   {baseline_name}: {baseline:>14,.0f} {unit}   "
          f"ratio {rate / baseline:6.3f}   (goal {goal})")


def write_overlapping_batches(agent: Any, events: int, batch_size: int, writers: int) -> None:
    """The replay benchmarks' workload: ``writers`` threads write ``events`` cells in
    batches of ``batch_size`` over 50,000 rows of one table, then the agent is closed."""
    per_writer = events // writers

    def write(offset: int) -> None:
        for start in range(0, per_writer, batch_size):
            with agent.batch():
                for i in range(start, min(start + batch_size, per_writer)):
                    agent.set("t", (offset + i * 7) % 50_000, "c", i)

    workers = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    agent.close()
