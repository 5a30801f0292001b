"""Streaming: micro-batches end at quiescence points, never inside a baseline; through
a baseline (a restarted query's crash cases are in test_stream_resume)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay import Frontier
from replay.spark import stream_changesets
from replay.spark._stream import _Scan, _scan
from sinks.wal3 import LogReader
from tests.spark._logs import compose_states, write_baseline_log

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


def test_the_offsets_stop_before_a_baseline_that_is_not_whole(tmp_path: Path) -> None:
    """The source's frontier never enters a baseline whose last chunk is not in the log;
    once the log holds it, the frontier moves to the end."""
    based = write_baseline_log(tmp_path / "log", rows=60, chunk_rows=9, seed=5)
    scan = _Scan()
    _scan(LogReader(based.uri), scan)
    b = based.baseline_domain
    complete = scan.frontier().get(b)
    assert complete is not None and complete.epoch_seq >= based.report.last_point[0]
    del scan.end[b]  # as if the last chunk had not arrived yet
    partial = scan.frontier().get(b)
    assert partial is None or partial.epoch_seq < based.report.first_point[0]
    assert isinstance(scan.frontier(), Frontier)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.sampled_from(("point",) * 4 + ("chunk", "last"))),
                max_size=150))
def test_the_scan_keeps_few_points_and_cuts_as_if_it_kept_every_one(
        steps: list[tuple[int, str]]) -> None:
    """Two domains' quiescence points and baseline chunks in a log's order (a chunk right
    after its point): after each record the scan, which keeps only the points the cut
    can use, cuts where a scan that keeps every point cuts, and holds at most two points
    per domain."""
    kept, every = _Scan(), _Scan()
    last = {0: 0, 1: 0}
    for step, (d, kind) in enumerate(steps):
        domain = 0xD0 + d
        if kind == "point":
            last[d] += 1 + step % 3
            kept.point(domain, last[d], last[d] * 10)
            every.points.setdefault(domain, []).append((last[d], last[d] * 10))
        elif last[d]:
            baseline = 0xB0 + sum(1 for k in steps[:step] if k == (d, "last"))
            for scan in (kept, every):
                scan.chunk(domain, baseline, last[d], kind == "last")
        assert kept.frontier() == every.frontier()
        assert all(len(points) <= 2 for points in kept.points.values())


def test_a_stream_through_a_baseline(spark: Any, tmp_path: Path) -> None:
    """A log that starts on a pre-populated store: the stream waits for the baseline
    (a broken chain before it is held, as the Python assembler holds it), then writes
    the store's states from the baseline on."""
    based = write_baseline_log(tmp_path / "log", rows=80, chunk_rows=11, seed=6)
    out, checkpoint = str(tmp_path / "changes"), str(tmp_path / "checkpoint")
    query = stream_changesets(spark, based.uri, out, checkpoint=checkpoint, format="parquet",
                              interval="0 seconds")
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    states = compose_states(spark.read.parquet(out).collect())
    b = based.baseline_domain
    last = max(e for d, e in states if d == b)
    own = {c: v for c, v in based.final.items() if c[0] in ("t", "u")}
    assert states[(b, last)] == own
    for (domain_id, epoch), state in states.items():
        if domain_id == b and epoch >= based.report.last_point[0]:
            truth = based.at_quiescence[(domain_id, epoch)]
            assert state == {c: v for c, v in truth.items() if c[0] in ("t", "u")}
