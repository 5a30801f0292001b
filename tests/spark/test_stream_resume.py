"""Streaming reads only what is new: each micro-batch resumes where the previous one
saved (cells at its frontier, records from an offset), a restarted query too (after a
crash between a batch's write and Spark's commit, the first batch's or a resumed one's),
and a save that does not match the table falls back to a replay from the start."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from replay.spark import stream_changesets
from tests.spark._logs import check_streamed, write_log

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


def test_micro_batches_resume_and_a_restart_neither_skips_nor_repeats(
        spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "log"
    first = write_log(path, domains=2, threads=2, batches=20, rows=15, seed=11)
    out, checkpoint = str(tmp_path / "changes"), str(tmp_path / "checkpoint")
    said: list[str] = []
    seen: list[tuple[int, int]] = []

    def run(on_batch: Any = None) -> None:
        query = stream_changesets(spark, first.uri, out, checkpoint=checkpoint,
                                  format="parquet", interval="0 seconds",
                                  on_batch=on_batch, progress=said.append)
        try:
            query.processAllAvailable()
        finally:
            query.stop()

    def record(batch_id: int, rows: int) -> None:
        seen.append((batch_id, rows))

    def crash_once(batch_id: int, rows: int) -> None:
        record(batch_id, rows)
        if len(seen) in (1, 3):
            raise RuntimeError("killed after the batch's write, before Spark's commit")

    with pytest.raises(Exception, match="killed after the batch"):
        run(crash_once)  # the first micro-batch, from the start
    assert "from the start" in said[0] and seen[0][1] > 0
    run(record)  # reruns that batch: the table already holds it, nothing twice
    assert seen[1] == (seen[0][0], 0)
    second = write_log(path, domains=1, threads=2, batches=15, rows=15, seed=12,
                       uri=first.uri, table_prefix="more_")
    with pytest.raises(Exception, match="killed after the batch"):
        run(crash_once)  # resumed: reads the records after the first batch's point
    resumed = [int(m.group(1)) for s in said if (m := re.search(r"from offset (\d+)", s))]
    assert resumed and resumed[0] > 0 and seen[2][1] > 0
    run(record)  # the restarted query reruns that batch: resumed, nothing written twice
    assert seen[3] == (seen[2][0], 0) and "resumed at" in said[-1]
    third = write_log(path, domains=1, threads=2, batches=10, rows=15, seed=13,
                      uri=first.uri, table_prefix="last_")
    # The newest save is lost (a batch cut short after writing): the one before does
    # not match what the table holds, so the batch replays the log from the start.
    saved = sorted((Path(checkpoint) / "cdc_agent_resume").iterdir())
    assert len(saved) == 2
    shutil.rmtree(saved[-1] / "meta")
    run(record)
    assert "from the start" in said[-1] and seen[-1][1] > 0
    run(record)  # nothing new
    check_streamed(spark.read.parquet(out).collect(), [first, second, third])


def test_a_saved_point_keeps_a_new_domains_events_that_came_before_it(
        spark: Any, tmp_path: Path) -> None:
    """A new domain whose events reached the log before any of its epoch records (its
    first batch shipped segments, or its events fragment landed first), ahead of every
    quiescence record of the saved frontier: the saved offset still starts at them, so
    the next micro-batch can verify that domain once its epochs arrive."""
    from agent import Agent, MemoryStore
    from replay.spark import LogReplay
    from replay.spark._stream import save_resume
    from sinks import RecordingSink
    from sinks.codec import EventBatch
    from sinks.wal3 import Wal3Sink

    uri = f"file://{tmp_path / 'log'}"
    shipped = RecordingSink()
    with Agent(MemoryStore(), shipped) as newcomer, newcomer.batch():
        newcomer.set("new_t", 1, "c", 1)
    sink = Wal3Sink(uri)
    for item in shipped.items:
        if isinstance(item, EventBatch):  # its events only: its epoch records come later
            sink.write_events(item)
    sink.close()
    write_log(tmp_path / "log", domains=1, threads=1, batches=5, rows=5, seed=14, uri=uri)
    replay = LogReplay(spark, uri)
    try:
        until = replay.settle(replay.frontier())
        assert len(until.positions) == 1  # the newcomer has no point yet
        assert save_resume(replay, str(tmp_path / "saved"), 0, until)
        domains = set(until.positions)
        first = min(r["_offset"] for r in replay.events().select("_domain", "_offset")
                    .collect() if r["_domain"] % (1 << 64) not in domains)
    finally:
        replay.unpersist()
    begin = spark.read.parquet(str(tmp_path / "saved" / f"{0:012d}" / "meta")).collect()[0]
    assert begin["begin"] <= first  # from the newcomer's events, first in the log


def test_a_saved_point_the_log_was_collected_past_replays_from_the_checkpoint(
        spark: Any, tmp_path: Path) -> None:
    """``cdc-agent log gc`` freed the fragments a saved point would resume from: the next
    micro-batch replays the log from its start (the checkpoint) instead of failing every
    micro-batch, and the table ends at the store's state."""
    from replay import compact_log
    from sinks.wal3 import LogReader
    from tests.spark._logs import compose_states

    path = tmp_path / "log"
    first = write_log(path, domains=2, threads=2, batches=6, rows=10, seed=21)
    out, checkpoint = str(tmp_path / "changes"), str(tmp_path / "checkpoint")
    said: list[str] = []

    def run() -> None:
        query = stream_changesets(spark, first.uri, out, checkpoint=checkpoint,
                                  format="parquet", interval="0 seconds",
                                  progress=said.append)
        try:
            query.processAllAvailable()
        finally:
            query.stop()

    run()
    assert "from the start" in said[-1]
    saved = sorted((Path(checkpoint) / "cdc_agent_resume").iterdir())
    begin = spark.read.parquet(str(saved[-1] / "meta")).collect()[0]["begin"]
    end = LogReader(first.uri).manifest().next_offset
    second = write_log(path, domains=1, threads=2, batches=5, rows=10, seed=22,
                       uri=first.uri, table_prefix="more_")
    compact_log(first.uri, points=[end])  # the second log's records stay, to be streamed
    assert LogReader(first.uri).manifest().oldest_offset > begin  # the saved point is gone
    said.clear()
    run()
    assert said and "from the start" in said[-1] and not any("resumed at" in s for s in said)
    rows = spark.read.parquet(out).collect()
    keys = [(r["_domain"], r["_epoch"], r["table"], bytes(r["row"]), r["column"])
            for r in rows]
    assert len(keys) == len(set(keys)), "an interval was written twice"
    states = compose_states(rows)
    final: dict[Any, bytes] = {}
    for domain_id in {d for d, _ in states}:
        final.update(states[(domain_id, max(e for d, e in states if d == domain_id))])
    assert final == {**first.final, **second.final}


def test_once_stops_while_writers_go_on_writing(spark: Any, tmp_path: Path) -> None:
    """`cdc-agent spark stream --once` applies what the log holds when it starts and
    stops, even while agents keep appending (a cron job must end)."""
    import threading

    from agent.cli import main

    path = tmp_path / "log"
    first = write_log(path, domains=1, threads=2, batches=6, rows=10, seed=31)
    stop = threading.Event()

    def keep_writing() -> None:
        n = 0
        while not stop.wait(0.5):  # a few records a second: the log never stops growing
            write_log(path, domains=1, threads=1, batches=2, rows=3, seed=40 + n,
                      uri=first.uri, table_prefix=f"w{n}_")
            n += 1

    writer = threading.Thread(target=keep_writing)
    writer.start()
    codes: list[int] = []
    try:
        job = threading.Thread(target=lambda: codes.append(main([
            "spark", "stream", first.uri, "--out", str(tmp_path / "changes"),
            "--checkpoint", str(tmp_path / "checkpoint"), "--format", "parquet", "--once",
            "--interval", "0 seconds"])))
        job.start()
        job.join(120)
        assert not job.is_alive(), "--once kept running while the log grew"
    finally:
        stop.set()
        writer.join()
    assert codes == [0]
    rows = spark.read.parquet(str(tmp_path / "changes")).collect()
    assert {r["table"] for r in rows} >= set(first.tables[next(iter(first.tables))])


def test_a_point_the_source_saw_of_a_domain_the_log_lost_is_inconsistent(
        spark: Any, tmp_path: Path) -> None:
    """A micro-batch's end names a domain whose epochs the log no longer holds (a topic's
    retention removed them after the source saw them): InconsistentLog naming the
    domain and point, not a ValueError about a bad position."""
    from replay import Frontier, InconsistentLog, Position
    from replay.spark import LogReplay

    logged = write_log(tmp_path / "log", domains=1, threads=1, batches=3, rows=5, seed=41)
    replay = LogReplay(spark, logged.uri)
    held = replay.epochs.last_positions()
    gone = Position(0xDEAD, 4, 40)
    with pytest.raises(InconsistentLog, match="no longer there") as refused:
        replay.settle(Frontier.of([*held, gone]))
    assert refused.value.domain_id == 0xDEAD and refused.value.epoch_seq == 4
    assert replay.settle(Frontier.of(held)) == Frontier.of(held)
    replay.unpersist()
