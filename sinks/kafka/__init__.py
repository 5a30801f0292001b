"""The Kafka sink: events keyed by cell over a topic's partitions, epoch records in each.

May import ``sequencer`` and ``sinks``; confluent-kafka is imported lazily (install
``cdc-agent[kafka]``). Start with ``_sink.py`` (what is sent, in which order), then
``_builder.py`` (records to messages; the two encodings' bytes are in ``sinks.codec``)
and ``_markers.py`` / ``_tally.py`` (how epoch records are split per partition).
``docs/kafka.md`` documents both encodings with examples; ``replay.kafka`` reads them,
through the driver this package exports (``confluent_kafka``, the lazy import, and
``kafka_errors``, the one boundary where confluent-kafka exceptions become ours).
"""

from sinks.kafka._driver import confluent_kafka, kafka_error_code, kafka_errors, quiet_logger
from sinks.kafka._errors import (
    KafkaConfigError,
    KafkaDeliveryError,
    KafkaQueueFull,
    KafkaSinkError,
    KafkaUnavailable,
)
from sinks.kafka._sink import ENCODINGS, KafkaSink

__all__ = [
    "ENCODINGS",
    "KafkaConfigError",
    "KafkaDeliveryError",
    "KafkaQueueFull",
    "KafkaSink",
    "KafkaSinkError",
    "KafkaUnavailable",
    "confluent_kafka",
    "kafka_error_code",
    "kafka_errors",
    "quiet_logger",
]
