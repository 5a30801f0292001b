"""Streaming a Kafka topic written by KafkaSink into a changeset table.

The source's offsets are frontiers of quiescence points every partition vouched for
(``replay.spark._kafka_points``); each micro-batch replays the topic up to the
partition ends the source saw and appends the verified changesets up to its frontier.
A topic written in rounds while the stream runs, a restarted query, and a topic that
lost an event (refused).
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import pytest

from replay import Frontier
from replay.spark import stream_changesets
from replay.spark._kafka_points import TopicScan
from replay.spark._stream import topic_frontier
from sinks.kafka import KafkaSink
from tests.services.kafka import KafkaBroker
from tests.spark._logs import Logged, check_streamed, compose_states, write_log
from tests.spark.test_kafka import (
    Message,
    _drop,
    _is_marker,
    _produce,
    _read_all,
    _whole,
)

pytestmark = [
    pytest.mark.spark, pytest.mark.kafka,
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

_names = itertools.count(1)


def _topic(broker: KafkaBroker, stem: str) -> str:
    return broker.create_topic(f"stream-{stem}-{next(_names)}", 3)


def _round(broker: KafkaBroker, topic: str, tmp: Path, seed: int, encoding: str,
           prefix: str = "") -> Logged:
    sink = KafkaSink(broker.bootstrap, topic, partitions=3, encoding=encoding)
    return write_log(tmp, domains=2, threads=2, batches=12, rows=10, seed=seed, sink=sink,
                     uri=f"kafka://{broker.bootstrap}/{topic}", table_prefix=prefix)


@pytest.fixture(scope="module")
def clean(kafka_broker: KafkaBroker, tmp_path_factory: pytest.TempPathFactory
          ) -> tuple[Logged, list[Message]]:
    """A small native topic and its messages (partition by partition, in order)."""
    logged = _round(kafka_broker, _topic(kafka_broker, "clean"),
                    tmp_path_factory.mktemp("ks"), seed=21, encoding="native")
    return logged, _read_all(kafka_broker.bootstrap, logged.uri.rsplit("/", 1)[1])


def _last_points(logged: Logged) -> dict[int, int]:
    out: dict[int, int] = {}
    for domain_id, epoch in logged.at_quiescence:
        out[domain_id] = max(out.get(domain_id, 0), epoch)
    return out


def test_the_source_cuts_only_where_every_partition_vouched(
        kafka_broker: KafkaBroker, clean: tuple[Logged, list[Message]]) -> None:
    """A topic whose partition 2 has only half its quiescence markers yet: the source's
    frontier is each domain's last quiescence point whose marker partition 2 already
    holds; once the rest arrives the next look (new messages only) reaches the last
    points. (Cut at a marker, not at half the messages: when one domain's writers ran
    before the other's, half the messages could hold every point of the one and none of
    the other, and the frontier then looked whole or empty.)"""
    logged, messages = clean
    mine = [m for m in messages if m[0] == 2]
    quiet = [i for i, m in enumerate(mine) if _is_marker(m) and _whole(m).quiescent]
    held = mine[:quiet[(len(quiet) - 1) // 2] + 1]  # (at least one point after it)
    topic = _topic(kafka_broker, "half")
    _produce(kafka_broker.bootstrap, topic, [m for m in messages if m[0] != 2] + held)
    scan = TopicScan(f"kafka://{kafka_broker.bootstrap}/{topic}")
    scan.advance()
    vouched: dict[int, int] = {}  # domain -> the last epoch partition 2 holds a marker of
    for m in held:
        if _is_marker(m):
            w = _whole(m)
            vouched[w.domain_id] = max(vouched.get(w.domain_id, 0), w.epoch_seq)
    points = {d: max((e for dd, e in logged.at_quiescence if dd == d and e <= last),
                     default=None) for d, last in vouched.items()}
    half = topic_frontier(scan)
    assert {p.domain_id: p.epoch_seq for p in half} == {
        d: e for d, e in points.items() if e is not None}
    assert half != Frontier.of([])
    assert {p.domain_id: p.epoch_seq for p in half} != _last_points(logged)
    _produce(kafka_broker.bootstrap, topic, mine[len(held):])
    ends = scan.advance()
    assert scan.read == list(ends) and sum(ends) == len(messages)
    assert scan.taken == sum(map(_is_marker, messages))  # each read once
    assert {p.domain_id: p.epoch_seq for p in topic_frontier(scan)} == _last_points(logged)


def _run(spark: Any, uri: str, out: str, checkpoint: str, **options: Any) -> Any:
    return stream_changesets(spark, uri, out, checkpoint=checkpoint, format="parquet",
                             interval="0 seconds", **options)


def test_a_topic_streamed_while_written_and_restarted(
        spark: Any, kafka_broker: KafkaBroker, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Debezium topic: round 1 written while the query runs, round 2 while it is
    stopped, then the query restarts on its checkpoint (`cdc-agent spark stream
    --once`). After every micro-batch the table is the store's state at that batch's
    quiescence points, bit for bit; nothing is skipped or written twice."""
    from agent.cli import main

    topic = _topic(kafka_broker, "live")
    uri = f"kafka://{kafka_broker.bootstrap}/{topic}"
    out, checkpoint = str(tmp_path / "changes"), str(tmp_path / "checkpoint")
    tables: list[tuple[int, dict[tuple[int, int], dict[Any, bytes]]]] = []
    said: list[str] = []

    def after(batch_id: int, rows: int) -> None:
        if Path(out).exists():
            tables.append((batch_id, compose_states(spark.read.parquet(out).collect())))

    query = _run(spark, uri, out, checkpoint, encoding="debezium", on_batch=after,
                 progress=said.append)
    try:
        first = _round(kafka_broker, topic, tmp_path / "r1", seed=31, encoding="debezium")
        query.processAllAvailable()
    finally:
        query.stop()
    assert tables and "from its start up to offsets" in said[0]
    truth = first.at_quiescence
    for batch_id, states in tables:  # each micro-batch ended at a consistent cut
        for domain_id in {d for d, _ in states}:
            epoch = max(e for d, e in states if d == domain_id)
            assert states[(domain_id, epoch)] == first.domain_state(
                domain_id, truth[(domain_id, epoch)]), (batch_id, domain_id, epoch)
    second = _round(kafka_broker, topic, tmp_path / "r2", seed=32, encoding="debezium",
                    prefix="more_")
    assert main(["spark", "stream", uri, "--encoding", "debezium", "--out", out,
                 "--checkpoint", checkpoint, "--format", "parquet", "--once",
                 "--interval", "0 seconds"]) == 0
    batches = [int(m) for m in re.findall(r"micro-batch (\d+): \d+ changed cells appended",
                                          capsys.readouterr().err)]
    assert batches and min(batches) > max(b for b, _ in tables)  # goes on from there
    # (test_kafka compares the batch replay of a topic with the Python consumer's)
    check_streamed(spark.read.parquet(out).collect(), [first, second],
                   python={**first.final, **second.final})


def test_cli_refuses_a_topic_that_lost_an_event(
        spark: Any, kafka_broker: KafkaBroker, clean: tuple[Logged, list[Message]],
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`cdc-agent spark stream kafka://...`: a copy of the topic with one event dropped
    stops the query (exit 1) before anything of it is applied."""
    from agent.cli import main

    _, messages = clean
    topic = _topic(kafka_broker, "drop")
    _produce(kafka_broker.bootstrap, topic, _drop(messages))
    assert main(["spark", "stream", f"kafka://{kafka_broker.bootstrap}/{topic}", "--out",
                 str(tmp_path / "changes"), "--checkpoint", str(tmp_path / "checkpoint"),
                 "--once", "--interval", "0 seconds"]) == 1
    assert re.search(r"INCONSISTENT: .*events of this epoch", capsys.readouterr().err)
    assert not (tmp_path / "changes").exists()  # nothing of the damaged topic applied
