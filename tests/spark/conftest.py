"""Fixtures of the Spark tests: logs written once per module, replays sharing the session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.spark._logs import Logged, ids_crossing_2_63, write_log


@pytest.fixture(scope="package")
def logged(tmp_path_factory: pytest.TempPathFactory) -> Logged:
    """3 domains x 3 writers x 150 batches on ~1,500 cells; domain 0's ids cross 2**63."""
    path: Path = tmp_path_factory.mktemp("spark-log") / "log"
    return write_log(path, domains=3, threads=3, batches=150, rows=120, seed=1,
                     ids=lambda d: ids_crossing_2_63() if d == 0 else None)


@pytest.fixture(scope="package")
def small(tmp_path_factory: pytest.TempPathFactory) -> Logged:
    """2 domains x 2 writers x 40 batches: the base log the fault tests alter."""
    path: Path = tmp_path_factory.mktemp("spark-small") / "log"
    return write_log(path, domains=2, threads=2, batches=40, rows=30, seed=2)


@pytest.fixture(scope="package")
def small_replay(spark: Any, small: Logged) -> Iterator[Any]:
    """One LogReplay of ``small`` shared by the tests that only read it."""
    from replay.spark import LogReplay

    replay = LogReplay(spark, small.uri)
    yield replay
    replay.unpersist()
