"""KafkaSink and the consistent consumer against the real session broker."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from agent import Agent, MemoryStore
from agent._workload import Workload
from replay import Changeset, InconsistentLog
from replay.kafka import KafkaConsistentConsumer, aconsume_consistent, consume_consistent
from sequencer import ChangeEvent, EpochRecord
from sinks import EventBatch, Sink
from sinks.codec import HEADER_PARTITION, HEADER_WHOLE, decode
from sinks.codec import decode_native_event as decode_event
from sinks.kafka import (
    KafkaConfigError,
    KafkaDeliveryError,
    KafkaSink,
    KafkaUnavailable,
)
from sinks.testing import check_sink
from tests.helpers import bits
from tests.services._proc import free_port
from tests.services.kafka import KafkaBroker
from tests.sinks.kafka._simulate import apply

pytestmark = pytest.mark.kafka

_quiet = logging.getLogger("tests.kafka.raw")
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False


# -- helpers ----------------------------------------------------------------------------------


def read_raw(bootstrap: str, topic: str, partitions: int) -> list[list[Any]]:
    """Every message of every partition, in order, read with a plain consumer."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"raw-{topic}",
                         "enable.auto.commit": False, "logger": _quiet})
    ends = [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=15)[1]
            for p in range(partitions)]
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    # By offset: a message the consumer hands over twice (a fetch retried under load)
    # must not count for one not read yet (seen once in a full run: one event short).
    got: list[dict[int, Any]] = [{} for _ in range(partitions)]
    deadline = time.monotonic() + 60
    while any(len(got[p]) < ends[p] for p in range(partitions)):
        assert time.monotonic() < deadline, "the topic did not read back in time"
        for message in consumer.consume(1000, timeout=0.5):
            assert message.error() is None, message.error()
            got[message.partition()][message.offset()] = message
    consumer.close()
    return [[by_offset[o] for o in sorted(by_offset)] for by_offset in got]


def read_back_records(bootstrap: str, topic: str, partitions: int
                      ) -> list[ChangeEvent | EpochRecord | EventBatch]:
    """The destination's records for the conformance suite: events, then whole epochs."""
    events: list[ChangeEvent] = []
    epochs: dict[tuple[int, int], EpochRecord] = {}
    for messages in read_raw(bootstrap, topic, partitions):
        for message in messages:
            headers = dict(message.headers() or [])
            if HEADER_WHOLE in headers:
                whole = decode(headers[HEADER_WHOLE])
                assert isinstance(whole, EpochRecord)
                epochs[(whole.domain_id, whole.epoch_seq)] = whole
            else:
                events.append(decode_event(message.value()).to_event())
    return [*events, *(epochs[k] for k in sorted(epochs))]


@dataclass
class Produced:
    topic: str
    partitions: int
    encoding: str
    at_quiescence: dict[tuple[int, int], dict[Any, bytes]]
    final: dict[Any, bytes]
    events: int
    last: tuple[int, int]


def produce_run(bootstrap: str, topic: str, encoding: str, *, seed: int,
                between: Callable[[], None] | None = None, partitions: int = 3) -> Produced:
    """A concurrent workload through Agent -> KafkaSink, store captured at quiescence.

    ``between`` runs after a first half of the workload and before the second.
    """
    store = MemoryStore()
    snaps: dict[tuple[int, int], dict[Any, bytes]] = {}
    sink = KafkaSink(bootstrap, topic, partitions=partitions, encoding=encoding)
    agent = Agent(store, sink, on_quiescence=lambda m: snaps.__setitem__(
        (m.domain_id, m.epoch_seq), bits(store.snapshot())))
    Workload(threads=3, batches=80, seed=seed).run(agent)
    if between is not None:
        between()
        Workload(threads=3, batches=80, seed=seed + 1).run(agent)
    agent.close()
    return Produced(topic, partitions, encoding, snaps, bits(store.snapshot()),
                    agent.stats["events"], max(snaps))


def check_changesets(produced: Produced, changesets: list[Changeset]) -> None:
    """Every quiescence point once, in order, each equal to the store's state then."""
    state: dict[Any, Any] = {}
    for changeset in changesets:
        apply(state, changeset)
        assert bits(state) == produced.at_quiescence[(changeset.domain_id, changeset.epoch_seq)]
    assert [c.epoch_seq for c in changesets] == sorted(k[1] for k in produced.at_quiescence)
    assert bits(state) == produced.final


@pytest.fixture(scope="module")
def native_run(kafka_broker: KafkaBroker) -> Produced:
    topic = kafka_broker.create_topic("sink-native", 3)
    return produce_run(kafka_broker.bootstrap, topic, "native", seed=21)


@pytest.fixture(scope="module")
def debezium_run(kafka_broker: KafkaBroker) -> Produced:
    return produce_run(kafka_broker.bootstrap, "sink-debezium", "debezium", seed=22)


# -- end to end ---------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["native_run", "debezium_run"])
def test_agent_kafka_consumer_gives_every_quiescent_state(
        which: str, request: pytest.FixtureRequest, kafka_bootstrap: str) -> None:
    """Agent -> KafkaSink -> consume_consistent: every snapshot is the store's, bit for bit."""
    produced: Produced = request.getfixturevalue(which)
    changesets = list(consume_consistent(kafka_bootstrap, produced.topic, group_id=f"g-{which}",
                                         encoding=produced.encoding, until_end=True))
    check_changesets(produced, changesets)
    assert sum(c.event_count for c in changesets) == produced.events


def test_asyncio_consumer(native_run: Produced, kafka_bootstrap: str) -> None:
    """aconsume_consistent yields the same changesets as the sync iterator."""
    async def collect() -> list[Changeset]:
        return [c async for c in aconsume_consistent(
            kafka_bootstrap, native_run.topic, group_id="g-async", until_end=True)]

    check_changesets(native_run, asyncio.run(collect()))


def test_every_event_once_and_markers_in_every_partition(native_run: Produced,
                                                          kafka_bootstrap: str) -> None:
    """The topic holds each event exactly once, in its cell's partition, and every epoch's
    marker in every partition with counts that add up to the epoch's."""
    raw = read_raw(kafka_bootstrap, native_run.topic, 3)
    identities: Counter[tuple[int, int, int]] = Counter()
    per_epoch: dict[tuple[int, int], list[EpochRecord]] = {}
    for partition, messages in enumerate(raw):
        for message in messages:
            headers = dict(message.headers() or [])
            if HEADER_PARTITION in headers:
                part = decode(headers[HEADER_PARTITION])
                assert isinstance(part, EpochRecord) and part.stream == partition
                per_epoch.setdefault((part.domain_id, part.epoch_seq), []).append(part)
            else:
                event = decode_event(message.value())
                identities[(event.domain_id, event.batch_id, event.seq)] += 1
    assert sum(identities.values()) == len(identities) == native_run.events
    assert all(len(copies) == 3 for copies in per_epoch.values())
    assert sum(r.event_count for copies in per_epoch.values() for r in copies) == native_run.events


def test_conformance(kafka_broker: KafkaBroker) -> None:
    """KafkaSink passes the sinks.testing conformance suite, read back from the broker."""
    topics: list[str] = []

    def make() -> Sink:
        topics.append(f"conformance-{len(topics)}")
        return KafkaSink(kafka_broker.bootstrap, topics[-1], partitions=3)

    check_sink(make, lambda sink: read_back_records(kafka_broker.bootstrap, sink.topic, 3),
               threads=3, batches=60)


# -- faults ---------------------------------------------------------------------------------------


def test_broker_restart_mid_stream(kafka_broker: KafkaBroker) -> None:
    """Stop and restart the broker between two halves of a workload while a consumer runs:
    no event lost, none twice, every quiescent state right."""
    topic = kafka_broker.create_topic("restart-broker", 3)
    changesets: list[Changeset] = []
    errors: list[BaseException] = []
    target: list[tuple[int, int]] = []
    stop = threading.Event()

    def consume() -> None:
        try:
            with KafkaConsistentConsumer(kafka_broker.bootstrap, topic,
                                         group_id="g-restart") as consumer:
                while not stop.is_set():
                    changesets.extend(consumer.poll(0.2))
                    consumer.commit()
                    if target and changesets and (changesets[-1].domain_id,
                                                  changesets[-1].epoch_seq) == target[0]:
                        return
        except BaseException as exc:
            errors.append(exc)

    reader = threading.Thread(target=consume)
    reader.start()
    try:
        produced = produce_run(kafka_broker.bootstrap, topic, "native", seed=31,
                               between=kafka_broker.restart)
        target.append(produced.last)
        reader.join(120)
    finally:
        stop.set()
        reader.join(30)
    assert not errors, errors
    assert kafka_broker.starts >= 2
    check_changesets(produced, changesets)
    raw = read_raw(kafka_broker.bootstrap, topic, 3)
    events = [m for msgs in raw for m in msgs if not m.headers()]
    assert len(events) == produced.events  # the idempotent producer wrote none twice


def test_consumer_killed_and_restarted_mid_stream(kafka_broker: KafkaBroker) -> None:
    """A consumer stopped mid-stream (no goodbye) and a new one resuming from the
    application's stored position: every quiescence point applied exactly once."""
    topic = kafka_broker.create_topic("restart-consumer", 3)
    produced_box: list[Produced] = []
    writer = threading.Thread(target=lambda: produced_box.append(
        produce_run(kafka_broker.bootstrap, topic, "native", seed=41)))
    writer.start()
    state: dict[Any, Any] = {}
    applied: list[int] = []
    position = None
    first = KafkaConsistentConsumer(kafka_broker.bootstrap, topic, group_id="g-kill")
    while not applied or writer.is_alive():  # stop mid-stream (how far depends on the load)
        changesets = first.poll(0.2)
        for changeset in changesets[:5]:
            apply(state, changeset)
            applied.append(changeset.epoch_seq)
            position = str(changeset.position)
        if changesets[:5]:
            first.commit(changesets[:5][-2] if len(changesets[:5]) > 1 else None)
        if len(changesets) > 5 or len(applied) >= 20:
            break  # killed: the last changeset was applied, its offsets never committed
    del first  # no close(), no goodbye
    writer.join(120)
    (produced,) = produced_box
    resumed = []
    for changeset in consume_consistent(kafka_broker.bootstrap, topic, group_id="g-kill",
                                        position=position, initial_state=state,
                                        until_end=True):
        for cell, before in changeset.before.items():
            assert bits({0: state.get(cell, before)}) == bits({0: before})  # not applied yet
        apply(state, changeset)
        resumed.append(changeset.epoch_seq)
        assert bits(state) == produced.at_quiescence[(changeset.domain_id, changeset.epoch_seq)]
    assert not resumed or resumed[0] > applied[-1]
    assert applied + resumed == sorted(k[1] for k in produced.at_quiescence)
    assert bits(state) == produced.final


def test_restart_from_committed_offsets_alone(native_run: Produced, kafka_bootstrap: str) -> None:
    """Without a position, a restarted consumer takes the group's commit (offsets and the
    token stored with them) and continues right after the last committed changeset."""
    first = consume_consistent(kafka_bootstrap, native_run.topic, group_id="g-commit",
                               commit_every=1)
    taken = [next(first) for _ in range(10)]
    first.close()  # killed while applying the 10th: the first 9 are committed
    rest = list(consume_consistent(kafka_bootstrap, native_run.topic, group_id="g-commit",
                                   until_end=True))
    epochs = [c.epoch_seq for c in taken] + [c.epoch_seq for c in rest]
    all_epochs = sorted(k[1] for k in native_run.at_quiescence)
    assert rest[0].epoch_seq == taken[-1].epoch_seq  # the uncommitted one comes again
    assert epochs == [*all_epochs[:10], *all_epochs[9:]]


def test_a_refused_message_breaks_the_sink_loudly(kafka_broker: KafkaBroker) -> None:
    """A message the producer refuses raises KafkaDeliveryError, then every write does."""
    topic = kafka_broker.create_topic("refused", 3)
    sink = KafkaSink(kafka_broker.bootstrap, topic, config={"message.max.bytes": 2000})
    small = EventBatch.from_events([ChangeEvent(1, 1 << 33, 0, "t", 1, "c", None, 1)])
    big = EventBatch.from_events([ChangeEvent(1, 1 << 33, 1, "t", 1, "c", 1, b"x" * 5000)])
    sink.write_events(small)
    with pytest.raises(KafkaDeliveryError, match="gap"):
        sink.write_events(big)
    with pytest.raises(KafkaDeliveryError):
        sink.write_events(small)
    with pytest.raises(KafkaDeliveryError):
        sink.flush()


def test_a_full_local_queue_waits_instead_of_dropping(kafka_broker: KafkaBroker) -> None:
    """With a tiny producer queue every event still arrives: the writer waited for room."""
    topic = kafka_broker.create_topic("tiny-queue", 2)
    sink = KafkaSink(kafka_broker.bootstrap, topic,
                     config={"queue.buffering.max.messages": 5, "linger.ms": 0})
    events = [ChangeEvent(1, 1 << 33, i, "t", i, "c", None, i) for i in range(500)]
    sink.write_events(EventBatch.from_events(events))
    sink.close()
    raw = read_raw(kafka_broker.bootstrap, topic, 2)
    assert sorted(decode_event(m.value()).seq for msgs in raw for m in msgs) == list(range(500))


# -- configuration errors: clear, and within a bounded time ----------------------------


def test_unknown_broker(kafka_topic: Callable[..., str]) -> None:
    """Nobody listening at the address: KafkaUnavailable at start, for sink and consumer."""
    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(KafkaUnavailable, match="no Kafka broker"):
        KafkaSink(address, "anything", startup_timeout=2)
    with pytest.raises(KafkaUnavailable, match="no Kafka broker"):
        next(consume_consistent(address, "anything", group_id="g", startup_timeout=2))


def test_missing_topic(kafka_bootstrap: str) -> None:
    """A topic that does not exist is a KafkaConfigError, not an auto-created topic."""
    with pytest.raises(KafkaConfigError, match="does not exist"):
        KafkaSink(kafka_bootstrap, "no-such-topic", startup_timeout=10)
    with pytest.raises(KafkaConfigError, match="does not exist"):
        next(consume_consistent(kafka_bootstrap, "no-such-topic", group_id="g",
                                startup_timeout=10))


def test_wrong_encoding_and_partition_count(kafka_topic: Callable[..., str],
                                            kafka_bootstrap: str) -> None:
    """A wrong encoding name or partition count is refused before anything is written."""
    topic = kafka_topic(3)
    with pytest.raises(KafkaConfigError, match="unknown Kafka encoding"):
        KafkaSink(kafka_bootstrap, topic, encoding="avro")
    with pytest.raises(KafkaConfigError, match="unknown Kafka encoding"):
        next(consume_consistent(kafka_bootstrap, topic, group_id="g", encoding="avro"))
    with pytest.raises(KafkaConfigError, match="has 3 partitions"):
        KafkaSink(kafka_bootstrap, topic, partitions=4)


def test_reading_debezium_as_native_is_an_error(debezium_run: Produced,
                                                kafka_bootstrap: str) -> None:
    """Reading a Debezium topic with the native decoder fails clearly, yields nothing."""
    with pytest.raises(InconsistentLog, match="not a cdc-agent native record"):
        list(consume_consistent(kafka_bootstrap, debezium_run.topic, group_id="g-wrong",
                                until_end=True))


# -- Debezium, read by a plain JSON reader ------------------------------------------------


def test_debezium_stream_for_a_plain_json_reader(debezium_run: Produced,
                                                 kafka_bootstrap: str) -> None:
    """Every data message is a Debezium envelope with the documented fields and types
    (markers are tombstones); the transaction topic's counts match the data topic."""
    raw = read_raw(kafka_bootstrap, debezium_run.topic, 3)
    per_tx: Counter[str] = Counter()
    per_tx_table: Counter[tuple[str, str]] = Counter()
    tombstones = 0
    for messages in raw:
        for message in messages:
            if message.value() is None:
                tombstones += 1
                assert "cdc_agent_epoch" in json.loads(message.key())
                continue
            envelope = json.loads(message.value())
            assert envelope["op"] in ("c", "u", "d")
            assert isinstance(envelope["ts_ms"], int)
            source = envelope["source"]
            assert source["connector"] == "cdc-agent"
            assert isinstance(source["domain"], str) and isinstance(source["batch_id"], str)
            assert isinstance(source["seq"], int) and isinstance(source["table"], str)
            for image in ("before", "after"):
                assert envelope[image] is None or set(envelope[image]) == {
                    "$row", source["column"]}
            tx = envelope["transaction"]
            assert set(tx) == {"id", "total_order", "data_collection_order"}
            per_tx[tx["id"]] += 1
            per_tx_table[(tx["id"], source["table"])] += 1
    assert sum(per_tx.values()) == debezium_run.events
    assert tombstones > 0 and tombstones % 3 == 0
    (tx_messages,) = read_raw(kafka_bootstrap, f"{debezium_run.topic}.transaction", 1)
    ends = {}
    begins = set()
    for message in tx_messages:
        record = json.loads(message.value())
        assert json.loads(message.key()) == {"id": record["id"]}
        if record["status"] == "BEGIN":
            begins.add(record["id"])
        else:
            assert record["status"] == "END"
            ends[record["id"]] = record
    assert begins == set(ends) == set(per_tx)
    for txid, end in ends.items():
        assert end["event_count"] == per_tx[txid]
        assert {d["data_collection"]: d["event_count"] for d in end["data_collections"]} == {
            table: n for (t, table), n in per_tx_table.items() if t == txid}


# -- the command line -------------------------------------------------------------------


def test_cli_tail_kafka(native_run: Produced, kafka_bootstrap: str) -> None:
    """`cdc-agent tail kafka --until-end` prints one JSON changeset per quiescence point."""
    run = subprocess.run(
        [sys.executable, "-m", "agent.cli", "tail", "kafka", "--bootstrap", kafka_bootstrap,
         "--topic", native_run.topic, "--group", "g-cli", "--until-end"],
        capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    lines = [json.loads(line) for line in run.stdout.splitlines()]
    assert [line["epoch"] for line in lines] == sorted(k[1] for k in native_run.at_quiescence)
    assert sum(line["events"] for line in lines) == native_run.events
    assert all({"domain", "position", "changes"} <= set(line) for line in lines)


def test_cli_tail_kafka_bad_broker() -> None:
    """An unreachable broker: exit status 2 (cannot start) and a message, within the
    startup timeout."""
    run = subprocess.run(
        [sys.executable, "-m", "agent.cli", "tail", "kafka", "--bootstrap",
         f"127.0.0.1:{free_port()}", "--topic", "t", "--startup-timeout", "2"],
        capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 2
    assert "no Kafka broker" in run.stderr and "Traceback" not in run.stderr


def test_example_configuration_opens_a_kafka_sink(kafka_bootstrap: str) -> None:
    """config/kafka.toml's [sink] keys are KafkaSink's options (address and topic swapped
    for the test broker's)."""
    from pathlib import Path

    from agent._config import load_config

    config = load_config(Path(__file__).resolve().parents[3] / "config" / "kafka.toml")
    config.sink.update(bootstrap=kafka_bootstrap, topic="from-config")
    sink = config.open_sink()
    assert isinstance(sink, KafkaSink) and sink.partitions == 6
    sink.close()
    assert config.consumer["group_id"] == "shop-replica"


def test_cli_tail_killed_and_restarted(native_run: Produced, kafka_bootstrap: str) -> None:
    """SIGKILL `cdc-agent tail kafka` mid-stream, start it again with the same group:
    it continues from its last commit; together the runs print every quiescence point,
    in order, and the second run repeats only what the first printed after its commit."""
    argv = [sys.executable, "-m", "agent.cli", "tail", "kafka", "--bootstrap", kafka_bootstrap,
            "--topic", native_run.topic, "--group", "g-cli-kill", "--commit-every", "1",
            "--until-end"]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          text=True) as first:
        assert first.stdout is not None
        printed = [json.loads(first.stdout.readline())["epoch"] for _ in range(20)]
        first.kill()
        printed += [json.loads(line)["epoch"] for line in first.stdout.read().splitlines()]
        first.wait(30)
    second = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert second.returncode == 0, second.stderr
    resumed = [json.loads(line)["epoch"] for line in second.stdout.splitlines()]
    every = sorted(k[1] for k in native_run.at_quiescence)
    assert printed == every[: len(printed)]
    assert resumed == every[len(every) - len(resumed):]  # a suffix: nothing skipped
    assert len(every) - len(resumed) <= len(printed)  # nothing before the first run's end
