"""Benchmark helpers: best-of-N timing and ratio printing (machines are shared and noisy)."""

from __future__ import annotations

import time
from collections.abc import Callable


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
