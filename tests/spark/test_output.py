"""Consistent tables written out (Delta Lake, Parquet), idempotently by position."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from replay.spark import LogReplay, to_state, write_changesets, write_state
from sinks.codec import decode_key
from tests.helpers import bits
from tests.spark._logs import Logged

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


def _apply(rows: list[Any]) -> dict[Any, bytes]:
    state: dict[Any, bytes] = {}
    for row in sorted(rows, key=lambda r: (r["_domain"], r["_epoch"])):
        cell = (row["table"], decode_key(bytes(row["row"])), row["column"])
        if row["after"]:
            state[cell] = bytes(row["after"])
        else:
            state.pop(cell, None)
    return state


@pytest.mark.parametrize("format", ["delta", "parquet"])
def test_changesets_written_twice_and_resumed_apply_once(
        spark: Any, small: Logged, small_replay: LogReplay, tmp_path: Path,
        format: str) -> None:
    """Write up to a middle point, rerun (nothing new), resume to the end, read back:
    every interval exactly once, and the table rebuilds the store's final state."""
    replay = small_replay
    path = str(tmp_path / "changes")
    domain_id = next(iter(small.tables))
    points = [q for d, q in sorted(small.at_quiescence) if d == domain_id]
    middle = str(replay.epochs.position(domain_id, points[len(points) // 2]))
    first = write_changesets(replay, path, format=format, end=middle)  # type: ignore[arg-type]
    assert first > 0
    assert write_changesets(replay, path, format=format, end=middle) == 0  # type: ignore[arg-type]
    if format == "parquet":  # a run that crashed before its _SUCCESS: ignored, removed
        crashed = tmp_path / "changes" / "run=00000099"
        crashed.mkdir()
        (crashed / "part-0.parquet").write_bytes(b"not parquet")
    rest = write_changesets(replay, path, format=format)  # type: ignore[arg-type]
    assert write_changesets(replay, path, format=format) == 0  # type: ignore[arg-type]
    table = spark.read.format(format).load(path)
    rows = table.collect()
    assert len(rows) == first + rest == replay.changesets().count()
    assert _apply(rows) == small.final


def test_state_written_to_delta_once_per_position(spark: Any, small: Logged,
                                                  small_replay: LogReplay,
                                                  tmp_path: Path) -> None:
    """write_state: the same frontier twice writes once; read back, it is the store."""
    replay = small_replay
    path = str(tmp_path / "state")
    assert write_state(replay, path, format="delta")
    assert not write_state(replay, path, format="delta")
    back = spark.read.format("delta").load(path)
    assert bits(to_state(back)) == small.final
    assert {r[0] for r in back.select("_frontier").distinct().collect()} == {
        str(replay.frontier())}
    versions = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").count()
    assert versions == 1
