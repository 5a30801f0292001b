"""The test broker itself: a real produce/consume round trip, and a restart keeps data."""

from __future__ import annotations

import logging
import time

import pytest

from tests.services.kafka import KafkaBroker

pytestmark = pytest.mark.kafka

_quiet = logging.getLogger("tests.kafka.quiet")
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "logger": _quiet})
    for i, value in enumerate(values):
        producer.produce(topic, value, key=b"k%d" % i, partition=i % 3)
    assert producer.flush(30) == 0


def _consume_all(bootstrap: str, topic: str, expected: int) -> list[bytes]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}",
                         "enable.auto.commit": False, "logger": _quiet})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
    got: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(got) < expected and time.monotonic() < deadline:
        for message in consumer.consume(1000, timeout=0.5):
            assert message.error() is None, message.error()
            got.append(message.value())
    consumer.close()
    return got


def test_round_trip(kafka_bootstrap: str, kafka_topic) -> None:
    """Messages produced to the session broker come back, all of them, exactly once."""
    topic = kafka_topic(3)
    values = [b"v%d" % i for i in range(300)]
    _produce(kafka_bootstrap, topic, values)
    assert sorted(_consume_all(kafka_bootstrap, topic, 300)) == sorted(values)


def test_restart_keeps_data_and_address(kafka_broker: KafkaBroker, kafka_topic) -> None:
    """After stop + start, the same address serves the messages written before."""
    topic = kafka_topic(3)
    _produce(kafka_broker.bootstrap, topic, [b"before"] * 30)
    address = kafka_broker.bootstrap
    kafka_broker.restart()
    assert kafka_broker.bootstrap == address
    _produce(kafka_broker.bootstrap, topic, [b"after"] * 30)
    got = _consume_all(kafka_broker.bootstrap, topic, 60)
    assert sorted(got) == [b"after"] * 30 + [b"before"] * 30
