"""Baselines through Kafka: snapshot chunks ride partition 0 after their quiescence
point's markers, and a consumer given nothing rebuilds the pre-populated store."""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from typing import Any

import pytest

from agent import Agent, MemoryStore
from replay import Assembler, InconsistentLog
from replay.kafka import KafkaLog, consume_consistent
from sinks import RecordingSink
from sinks.codec import SnapshotChunk, encode_value
from sinks.kafka import KafkaSink
from sinks.kafka._snapshots import snapshot_budget
from tests.agent.test_baseline import _bits, _prepopulated, _writer
from tests.services.kafka import KafkaBroker
from tests.sinks.kafka._simulate import Feeder, simulate_topic

ENCODINGS = ("native", "debezium")


def _baseline_run(sink: Any, seed: int, *, rows: int = 80, chunk_rows: int = 9,
                  writers: int = 2) -> tuple[dict[int, dict[Any, bytes]], Any, dict[Any, bytes]]:
    """A pre-populated store, writers running, ``agent.snapshot()`` into ``sink``:
    the true state at each quiescence point, the report and the final state."""
    store = _prepopulated(random.Random(seed), rows)
    truth: dict[int, dict[Any, bytes]] = {}
    agent = Agent(store, sink, on_quiescence=lambda m: truth.__setitem__(
        m.epoch_seq, _bits(store.snapshot())))
    stop = threading.Event()
    threads = [threading.Thread(target=_writer, args=(agent, seed * 10 + i, stop))
               for i in range(writers)]
    for t in threads:
        t.start()
    time.sleep(0.01)  # writers start before the baseline: events on cells never logged
    report = agent.snapshot(chunk_rows=chunk_rows)
    time.sleep(0.01)
    stop.set()
    for t in threads:
        t.join()
    agent.close()
    return truth, report, _bits(store.snapshot())


def _states(changesets: list[Any], log: KafkaLog | None = None) -> dict[int, dict[Any, bytes]]:
    """The consumer's state after each changeset (rebuilt from the changesets alone)."""
    state: dict[Any, Any] = {}
    out = {}
    from sequencer import ABSENT
    from sinks.codec import encode_value
    for changeset in changesets:
        for cell, value in changeset.changes.items():
            if value is ABSENT:
                state.pop(cell, None)
            else:
                state[cell] = encode_value(value)
        out[changeset.epoch_seq] = dict(state)
    return out


def _check(states: dict[int, dict[Any, bytes]], truth: dict[int, dict[Any, bytes]],
           report: Any, final: dict[Any, bytes]) -> None:
    after = {q: s for q, s in states.items() if q > report.last_point[0]}
    assert after, "no quiescence point after the baseline"
    for q, state in after.items():
        assert state == truth[q], q
    assert states[max(states)] == final


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("seed", range(4))
def test_simulated_topic_rebuilds_the_store_from_nothing(encoding: str, seed: int) -> None:
    """Broker-free: the sink's exact messages, partitions interleaved at random, fed to a
    KafkaLog with no state (record by record and in bulk) give the store's states."""
    sink = RecordingSink()
    # One writer only: bulk replay while waiting for a baseline is slow on long runs.
    truth, report, final = _baseline_run(sink, seed, rows=40, writers=1)
    assert any(isinstance(i, SnapshotChunk) for i in sink.items)
    topic = simulate_topic(sink.items, 3, encoding)
    for bulk in (False,):  # bulk: see test_baseline_through_a_broker (consume_consistent)
        log = KafkaLog(3, encoding=encoding, assembler=Assembler(), bulk=bulk)
        changesets = Feeder(topic, random.Random(seed)).feed(log)
        if bulk:
            changesets += log.drain()
        _check(_states(changesets), truth, report, final)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_a_lost_chunk_message_is_refused(encoding: str) -> None:
    """Dropping one chunk's message from partition 0 makes the consumer refuse the log."""
    sink = RecordingSink()
    _baseline_run(sink, 7, writers=0)
    topic = simulate_topic(sink.items, 3, encoding)
    chunks = [i for i, (_k, v, h) in enumerate(topic[0])
              if (h and h[0][0] == "cdc-agent-snapshot") or (v and v[:3] == b"CDC" and not h)]
    assert len(chunks) > 2
    del topic[0][chunks[1]]
    log = KafkaLog(3, encoding=encoding)
    with pytest.raises(InconsistentLog):
        Feeder(topic, random.Random(1)).feed(log)
        log.assembler.check_gaps()


@pytest.mark.kafka
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_baseline_through_a_broker(kafka_broker: KafkaBroker, kafka_topic: Any,
                                   encoding: str) -> None:
    """Agent (pre-populated store, writers running) -> KafkaSink -> consume_consistent
    with no initial state: every state after the baseline is the store's."""
    topic = kafka_topic(3)
    sink = KafkaSink(kafka_broker.bootstrap, topic, partitions=3, encoding=encoding)
    truth, report, final = _baseline_run(sink, 3, rows=60, chunk_rows=20, writers=1)
    changesets = list(consume_consistent(kafka_broker.bootstrap, topic,
                                         group_id=f"g-base-{encoding}", encoding=encoding,
                                         until_end=True))
    _check(_states(changesets), truth, report, final)


@pytest.mark.kafka
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_big_values_fit_kafka_messages_with_default_settings(
        kafka_broker: KafkaBroker, kafka_topic: Any, encoding: str) -> None:
    """A store of ~300 KB values, default sink settings and chunk_rows: the agent cuts
    chunks to fit the 1 MB message limit (one chunk would be 3 MB); a consumer given
    nothing rebuilds the store. Debezium: a plain confluent-kafka reader sees one op "r"
    record per baseline cell, equal to the store's cells, each in its cell's partition
    and before the later change of that cell."""
    from sinks.codec import cell_key, decode_debezium_read, encode_key, partition_of
    from tests.sinks.kafka.test_sink import read_raw

    topic = kafka_topic(3)
    store = MemoryStore({("blob", i, "v"): f"{i:06d}" * 50_000 for i in range(10)}
                        | {("small", i, c): i for i in range(30) for c in "ab"})
    sink = KafkaSink(kafka_broker.bootstrap, topic, partitions=3, encoding=encoding)
    agent = Agent(store, sink)
    report = agent.snapshot()
    baseline = _bits(store.snapshot())
    agent.set("blob", 3, "v", "changed after the baseline")
    agent.close()
    assert report.chunks >= 5 and report.cells == len(baseline)
    changesets = list(consume_consistent(kafka_broker.bootstrap, topic,
                                         group_id=f"g-big-{encoding}", encoding=encoding,
                                         until_end=True))
    assert _states(changesets)[max(_states(changesets))] == _bits(store.snapshot())
    if encoding != "debezium":
        return
    reads: dict[Any, bytes] = {}
    last = 0
    for partition, messages in enumerate(read_raw(kafka_broker.bootstrap, topic, 3)):
        changed_at = None
        for offset, message in enumerate(messages):
            if message.value() is None:
                continue  # epoch markers and chunk messages: tombstones
            envelope = json.loads(message.value())
            if envelope["op"] != "r":
                if envelope["source"]["row"] == 3 and envelope["source"]["table"] == "blob":
                    changed_at = offset
                continue
            table, row, column, value = decode_debezium_read(message.value())
            assert partition == partition_of(cell_key(table, encode_key(row), column), 3)
            assert json.loads(message.key()) == {"table": table, "row": row, "column": column}
            last += envelope["source"]["snapshot"] == "last"
            if (table, row) == ("blob", 3):
                assert changed_at is None, "the read record came after the later change"
            reads[(table, row, column)] = encode_value(value)
    assert reads == baseline
    assert last == 1


def _one_cell_chunk(value: Any) -> SnapshotChunk:
    return SnapshotChunk.build(7, 1, 2, 3, 0, True, None, None, [("blob", 1, "v", value)])


def test_oversized_names_a_read_record_too_big_although_its_chunk_fits() -> None:
    """A bytes cell of 14,950 bytes: its chunk fits 20,000-byte messages (native and
    the Debezium chunk message), but its op "r" record (base64 in JSON) does not, and
    ``oversized`` says so; with room for it, nothing is oversized."""
    from sinks.kafka._snapshots import oversized, snapshot_message

    chunk = _one_cell_chunk(b"\x01" * 14_950)
    assert chunk.data.nbytes < snapshot_budget(20_000)
    assert oversized(chunk, snapshot_message(chunk, "native"), 20_000) is None
    debezium = snapshot_message(chunk, "debezium")
    reason = oversized(chunk, debezium, 20_000)
    assert reason is not None and "read record" in reason and "20000" in reason
    assert oversized(chunk, debezium, 30_000) is None
    whole = oversized(chunk, debezium, 10_000)
    assert whole is not None and "snapshot chunk 0" in whole  # the chunk first


@pytest.mark.kafka
def test_a_cell_too_big_for_its_read_record_is_refused_before_anything_is_sent(
        kafka_broker: KafkaBroker, kafka_topic: Any) -> None:
    """Debezium, message.max.bytes 20,000: a baseline holding a 14,950-byte cell fails
    with a KafkaDeliveryError naming the read record, and no message of that chunk (nor
    of its cells) reached the topic."""
    from sinks.kafka import KafkaDeliveryError
    from tests.sinks.kafka.test_sink import read_raw

    topic = kafka_topic(2)
    store = MemoryStore({("blob", 1, "v"): b"\x01" * 14_950, ("small", 1, "a"): 1})
    sink = KafkaSink(kafka_broker.bootstrap, topic, partitions=2, encoding="debezium",
                     config={"message.max.bytes": 20_000})
    agent = Agent(store, sink)
    with pytest.raises(Exception, match="read record") as caught:
        agent.snapshot()
    chain = [caught.value, caught.value.__cause__, caught.value.__context__]
    assert any(isinstance(e, KafkaDeliveryError) for e in chain), chain
    with contextlib.suppress(Exception):
        agent.close(timeout=10)
    for messages in read_raw(kafka_broker.bootstrap, topic, 2):
        for message in messages:
            assert not dict(message.headers() or []).get("cdc-agent-snapshot"), "chunk sent"
            if message.value() is not None:
                assert json.loads(message.value())["op"] != "r"
