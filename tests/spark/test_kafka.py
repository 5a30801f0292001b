"""replay.spark on a Kafka topic written by KafkaSink (spark-sql-kafka), both encodings.

A small concurrent workload of two domains goes through the Agent into a 3-partition
topic; Spark's verified replay must equal the store (every quiescence point) and the
Python consistent consumer on the same topic. Copies of the topic with messages
duplicated, dropped, altered, reordered or foreign are refused, or harmless, in Spark
as by the Python consumer.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from replay import InconsistentLog
from replay.kafka import consume_consistent
from sequencer import EpochRecord
from sinks.codec import (
    HEADER_PARTITION,
    HEADER_WHOLE,
    NATIVE_MAGIC,
    decode,
    decode_native_event,
    encode_epoch,
    encode_value,
)
from sinks.kafka import KafkaSink
from tests.helpers import bits
from tests.services.kafka import KafkaBroker
from tests.spark._logs import Logged, compose_states, write_log

pytestmark = [
    pytest.mark.spark, pytest.mark.kafka,
    # py4j leaves sockets of finished jobs to the garbage collector (as in test_replay)
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

Message = tuple[int, bytes | None, bytes | None, Any]  # partition, key, value, headers
_names = itertools.count(1)


def _topic(broker: KafkaBroker, stem: str) -> str:
    return broker.create_topic(f"spark-{stem}-{next(_names)}", 3)


def _write(broker: KafkaBroker, tmp: Path, encoding: str) -> Logged:
    topic = _topic(broker, encoding)
    sink = KafkaSink(broker.bootstrap, topic, partitions=3, encoding=encoding)
    return write_log(tmp, domains=2, threads=2, batches=25, rows=20, seed=7, sink=sink,
                     uri=f"kafka://{broker.bootstrap}/{topic}")


@pytest.fixture(scope="module")
def native(kafka_broker: KafkaBroker, tmp_path_factory: pytest.TempPathFactory) -> Logged:
    return _write(kafka_broker, tmp_path_factory.mktemp("kn"), "native")


@pytest.fixture(scope="module")
def debezium(kafka_broker: KafkaBroker, tmp_path_factory: pytest.TempPathFactory) -> Logged:
    return _write(kafka_broker, tmp_path_factory.mktemp("kd"), "debezium")


def _topic_of(uri: str) -> str:
    return uri.rsplit("/", 1)[1]


def _python_states(bootstrap: str, topic: str, encoding: str
                   ) -> dict[tuple[int, int], dict[Any, bytes]]:
    """Each domain's state after each changeset of the Python consistent consumer."""
    states: dict[int, dict[Any, bytes]] = {}
    out = {}
    for changeset in consume_consistent(bootstrap, topic, group_id=f"py-{topic}",
                                        encoding=encoding, until_end=True):
        state = states.setdefault(changeset.domain_id, {})
        for cell, value in changeset.changes.items():
            raw = encode_value(value)
            if raw:
                state[cell] = raw
            else:
                state.pop(cell, None)
        out[(changeset.domain_id, changeset.epoch_seq)] = dict(state)
    return out


def _state_at(composed: dict[tuple[int, int], dict[Any, bytes]], point: tuple[int, int]
              ) -> dict[Any, bytes]:
    """The domain's state at a quiescence point, from the states after each changeset."""
    before = [p for p in composed if p[0] == point[0] and p[1] <= point[1]]
    return composed[max(before)] if before else {}


@pytest.mark.parametrize("encoding", ["native", "debezium"])
def test_topic_replays_like_the_python_consumer(spark: Any, kafka_broker: KafkaBroker,
                                                encoding: str,
                                                request: pytest.FixtureRequest) -> None:
    from replay.spark import LogReplay, events, snapshot, to_state

    logged: Logged = request.getfixturevalue(encoding)
    topic = _topic_of(logged.uri)
    log = LogReplay(spark, logged.uri, encoding=encoding)
    try:
        report = log.verify().collect()
        assert report and all(r["count_ok"] and r["tables_ok"] and r["setsum_ok"]
                              for r in report)
        assert sum(r["events"] for r in report) == logged.events
        assert bits(to_state(log.snapshot())) == logged.final
        composed = compose_states(log.changesets().collect())
        python = _python_states(kafka_broker.bootstrap, topic, encoding)
        assert set(composed) <= set(python)  # Spark gives no row for an empty interval
        for point, state in python.items():
            assert _state_at(composed, point) == state, point
            assert state == logged.domain_state(point[0], logged.at_quiescence[point])
    finally:
        log.unpersist()
    # The module functions take the URI and the encoding too.
    assert bits(to_state(snapshot(spark, logged.uri, encoding=encoding))) == logged.final
    assert events(spark, logged.uri, encoding=encoding).count() == logged.events


# -- damaged copies of the native topic ---------------------------------------------------------


def _read_all(bootstrap: str, topic: str) -> list[Message]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"raw-{topic}",
                         "enable.auto.commit": False})
    high = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(3)}
    consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
    got: dict[int, list[Message]] = {p: [] for p in range(3)}
    deadline = time.monotonic() + 60
    while any(len(got[p]) < high[p] for p in got) and time.monotonic() < deadline:
        for m in consumer.consume(1000, timeout=0.5):
            assert m.error() is None, m.error()
            partition = m.partition()
            assert partition is not None
            got[partition].append((partition, m.key(), m.value(), m.headers()))
    consumer.close()
    assert all(len(got[p]) == high[p] for p in got), (  # not a partial topic, silently
        f"read {[len(got[p]) for p in range(3)]} messages of {topic!r} in 60 s, "
        f"its ends are {[high[p] for p in range(3)]}")
    return [m for p in range(3) for m in got[p]]


def _produce(bootstrap: str, topic: str, messages: list[Message]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for partition, key, value, headers in messages:
        producer.produce(topic, value, key=key, partition=partition, headers=headers)
    assert producer.flush(30) == 0


def _is_event(m: Message) -> bool:
    return m[2] is not None and m[2][:3] == NATIVE_MAGIC


def _is_marker(m: Message) -> bool:
    return any(name == HEADER_PARTITION for name, _ in m[3] or ())


def _duplicate(ms: list[Message]) -> list[Message]:
    """Every 5th event and every 7th marker again, right after itself."""
    out: list[Message] = []
    for i, m in enumerate(ms):
        out.append(m)
        if (_is_event(m) and i % 5 == 0) or (_is_marker(m) and i % 7 == 0):
            out.append(m)
    return out


def _event_at(ms: list[Message], k: int) -> int:
    """The k-th event (or the first after it) whose new value has a payload byte."""
    found = [i for i, m in enumerate(ms) if _is_event(m)][k:]
    return next(i for i in found if len(decode_native_event(ms[i][2] or b"").new) > 1)


def _drop(ms: list[Message]) -> list[Message]:
    i = _event_at(ms, 40)
    return ms[:i] + ms[i + 1:]


def _altered(m: Message) -> Message:
    """The event with the last byte of its new value flipped (same length)."""
    assert m[2] is not None
    return (m[0], m[1], m[2][:-1] + bytes([m[2][-1] ^ 1]), m[3])


def _alter(ms: list[Message]) -> list[Message]:
    i = _event_at(ms, 40)
    return [*ms[:i], _altered(ms[i]), *ms[i + 1:]]


def _conflict(ms: list[Message]) -> list[Message]:
    """An altered second copy of an event, next to the original (before its marker)."""
    i = _event_at(ms, 40)
    return [*ms[:i + 1], _altered(ms[i]), *ms[i + 1:]]


def _whole(m: Message) -> EpochRecord:
    """The whole epoch record a marker carries."""
    record = decode(dict(m[3])[HEADER_WHOLE])
    assert isinstance(record, EpochRecord)
    return record


def _late(ms: list[Message]) -> list[Message]:
    """An event moved after its partition's marker of its epoch (a marker of an earlier
    epoch may follow it: events ship before their epoch closes)."""
    i = _event_at(ms, 40)
    event = decode_native_event(ms[i][2] or b"")
    j = next(k for k in range(i + 1, len(ms)) if _is_marker(ms[k]) and ms[k][0] == ms[i][0]
             and _whole(ms[k]).domain_id == event.domain_id
             and _whole(ms[k]).begin_id <= event.batch_id < _whole(ms[k]).end_id)
    return [*ms[:i], *ms[i + 1:j + 1], ms[i], *ms[j + 1:]]


def _marker_gone(ms: list[Message]) -> list[Message]:
    """One partition loses one epoch marker in the middle of the topic, one that a
    later marker of its domain follows on that partition (that one then skips an
    epoch). A domain's last marker gone leaves an epoch still waiting for that
    partition, as at the end of a topic being written: refused by no reader."""
    markers = [i for i, m in enumerate(ms)
               if _is_marker(m) and m[0] == 1 and _whole(m).epoch_seq > 2]
    followed = [i for i in markers if any(_whole(ms[j]).domain_id == _whole(ms[i]).domain_id
                                          for j in markers if j > i)]
    i = followed[len(followed) // 2]
    return ms[:i] + ms[i + 1:]


def _share_marker(ms: list[Message], change: Callable[[EpochRecord], EpochRecord]
                  ) -> list[Message]:
    """One partition's own marker record changed (its whole record and every event
    intact): the share it claims no longer matches what the partition holds."""
    for i, m in enumerate(ms):
        if not _is_marker(m) or _whole(m).epoch_seq < 3:
            continue
        part = decode(dict(m[3])[HEADER_PARTITION])
        assert isinstance(part, EpochRecord)
        if part.event_count >= 2 and part.table_counts:
            raw = encode_epoch(change(part))
            headers = [(n, raw if n == HEADER_PARTITION else v) for n, v in m[3]]
            return [*ms[:i], (m[0], m[1], raw, headers), *ms[i + 1:]]
    raise AssertionError("no marker with events")


def _share_setsum(ms: list[Message]) -> list[Message]:
    return _share_marker(ms, lambda r: replace(r, setsum=f"{int(r.setsum, 16) ^ 1:064x}"))


def _share_tables(ms: list[Message]) -> list[Message]:
    def moved(r: EpochRecord) -> EpochRecord:
        (table, n), *rest = r.table_counts
        counts = [(table, n - 1), *rest] if n > 1 else list(rest)
        return replace(r, table_counts=tuple(sorted([*counts, ("zz_elsewhere", 1)])))
    return _share_marker(ms, moved)


def _foreign(ms: list[Message]) -> list[Message]:
    return [*ms[:3], (ms[0][0], b"k", b"not a cdc-agent record", None), *ms[3:]]


def _python_result(bootstrap: str, topic: str) -> dict[tuple[int, int], dict[Any, bytes]]:
    return _python_states(bootstrap, topic, "native")


@pytest.mark.parametrize(("damage", "refused"), [
    (_duplicate, None),
    (_drop, "events of this epoch"),
    (_alter, "setsum"),
    (_conflict, "two different copies"),
    (_late, "events of this epoch"),
    (_marker_gone, "skips from epoch"),
    (_foreign, "not a cdc-agent native record"),
    (_share_setsum, "partition .: setsum of its events"),
    (_share_tables, "partition .: per-table counts"),
])
def test_damaged_topic_is_refused_or_harmless(
        spark: Any, kafka_broker: KafkaBroker, native: Logged,
        damage: Callable[[list[Message]], list[Message]], refused: str | None) -> None:
    from replay.spark import LogReplay, to_state

    bootstrap = kafka_broker.bootstrap
    topic = _topic(kafka_broker, damage.__name__.strip("_"))
    _produce(bootstrap, topic, damage(_read_all(bootstrap, _topic_of(native.uri))))
    uri = f"kafka://{bootstrap}/{topic}"
    if refused is None:
        log = LogReplay(spark, uri)
        try:
            assert bits(to_state(log.snapshot())) == native.final
            composed = compose_states(log.changesets().collect())
            python = _python_result(bootstrap, topic)
            assert python and all(_state_at(composed, p) == s for p, s in python.items())
        finally:
            log.unpersist()
        return
    with pytest.raises(InconsistentLog, match=refused) as spark_error:
        log = LogReplay(spark, uri)
        try:
            log.verify()
        finally:
            log.unpersist()
    assert spark_error.value.domain_id is not None or damage is _foreign
    with pytest.raises(InconsistentLog):  # the Python consumer refuses it too
        _python_result(bootstrap, topic)


def test_bad_uri_and_encoding(spark: Any, native: Logged, debezium: Logged) -> None:
    from replay.spark import LogReplay, stream_changesets

    with pytest.raises(ValueError, match="kafka://host:port/topic"):
        LogReplay(spark, "kafka://nohost")
    with pytest.raises(ValueError, match="choose native or debezium"):
        LogReplay(spark, native.uri, encoding="avro")
    with pytest.raises(ValueError, match="for Kafka topics"):
        LogReplay(spark, "file:///nowhere", encoding="debezium")
    log = LogReplay(spark, debezium.uri)  # a Debezium topic read as native
    with pytest.raises(InconsistentLog, match="not a cdc-agent native record"):
        log.verify()
    with pytest.raises(ValueError, match="choose native or debezium"):
        stream_changesets(spark, native.uri, "/nowhere", checkpoint="/nowhere-c",
                          encoding="avro")
    with pytest.raises(ValueError, match="for Kafka topics"):
        stream_changesets(spark, "file:///nowhere", "/nowhere", checkpoint="/nowhere-c",
                          encoding="debezium")


def test_cli_reads_a_topic(spark: Any, debezium: Logged, tmp_path: Path,
                           capsys: pytest.CaptureFixture[str]) -> None:
    """`cdc-agent spark snapshot|verify kafka://... --encoding debezium`; a topic read in
    the wrong encoding is inconsistent (exit 1)."""
    from agent.cli import main
    from replay.spark import to_state

    out = str(tmp_path / "state")
    assert main(["spark", "snapshot", debezium.uri, "--encoding", "debezium",
                 "--out", out]) == 0
    assert "written to" in capsys.readouterr().err
    assert bits(to_state(spark.read.parquet(out))) == debezium.final
    assert main(["spark", "verify", debezium.uri, "--encoding", "debezium"]) == 0
    assert "consistent" in capsys.readouterr().err
    assert main(["spark", "verify", debezium.uri]) == 1
    assert "not a cdc-agent native record" in capsys.readouterr().err


def test_a_baseline_through_a_debezium_topic(spark: Any, kafka_broker: KafkaBroker) -> None:
    """A store that held data before the agent: Agent.snapshot() through a Debezium topic
    (chunks in partition 0, an op "r" row per baseline cell, which Spark skips as the
    Python consumer does); Spark's state equals the store's and the consumer's."""
    from agent import Agent, MemoryStore
    from replay.spark import LogReplay, to_state

    store = MemoryStore({("t", i, "a"): f"v{i}" for i in range(30)}
                        | {("t", 7, "b"): float("nan"), ("u", "k", "a"): -0.0})
    topic = _topic(kafka_broker, "baseline")
    sink = KafkaSink(kafka_broker.bootstrap, topic, partitions=3, encoding="debezium")
    agent = Agent(store, sink)
    agent.set("t", 1, "a", "before the baseline")  # the log never saw "v1": forgiven
    agent.snapshot(chunk_rows=8)
    with agent.batch():
        agent.set("t", 2, "a", "after")
        agent.delete("t", 3, "a")
    agent.close()
    sink.close()
    log = LogReplay(spark, f"kafka://{kafka_broker.bootstrap}/{topic}", encoding="debezium")
    try:
        assert log.baselines  # its chunks were read
        assert bits(to_state(log.snapshot())) == bits(store.snapshot())
    finally:
        log.unpersist()
    python = _python_states(kafka_broker.bootstrap, topic, "debezium")
    assert python[max(python)] == bits(store.snapshot())
