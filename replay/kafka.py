"""Consistent consumption of a Kafka topic written by ``sinks.kafka.KafkaSink``.

``consume_consistent`` (and ``aconsume_consistent`` for asyncio) yield a verified
``replay.Changeset`` per quiescence point; ``KafkaConsistentConsumer`` is the object
underneath, ``KafkaLog`` its pure, broker-free core. confluent-kafka is imported lazily
(install ``cdc-agent[kafka]``). See ``docs/kafka.md``.
"""

from replay._kafka_consumer import (
    KafkaConsistentConsumer,
    aconsume_consistent,
    consume_consistent,
)
from replay._kafka_log import KafkaLog

__all__ = [
    "KafkaConsistentConsumer",
    "KafkaLog",
    "aconsume_consistent",
    "consume_consistent",
]
