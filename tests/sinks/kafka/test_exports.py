"""The public surface of the Kafka modules, and that the driver is imported lazily."""

from __future__ import annotations

import subprocess
import sys

import replay.kafka
import sinks.kafka


def test_exports_are_pinned() -> None:
    """The names docs/kafka.md promises, sorted in __all__."""
    assert sinks.kafka.__all__ == [
        "ENCODINGS", "KafkaConfigError", "KafkaDeliveryError", "KafkaQueueFull",
        "KafkaSink", "KafkaSinkError", "KafkaUnavailable", "confluent_kafka",
        "kafka_error_code", "kafka_errors", "quiet_logger",
    ]
    assert replay.kafka.__all__ == [
        "KafkaConsistentConsumer", "KafkaLog", "aconsume_consistent", "consume_consistent",
    ]
    for module in (sinks.kafka, replay.kafka):
        for name in module.__all__:
            assert hasattr(module, name)


def test_importing_does_not_load_confluent_kafka() -> None:
    """confluent-kafka is loaded when a sink or consumer is made, not on import."""
    code = ("import sys, sinks.kafka, replay.kafka; "
            "assert 'confluent_kafka' not in sys.modules, 'imported eagerly'")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False)
    assert run.returncode == 0, run.stderr


def test_sink_errors_are_sink_errors() -> None:
    """Callers that handle SinkError and SinkTimeout handle the Kafka sink's errors too."""
    from sinks import SinkError, SinkTimeout

    assert issubclass(sinks.kafka.KafkaSinkError, SinkError)
    assert issubclass(sinks.kafka.KafkaUnavailable, SinkTimeout)
    assert issubclass(sinks.kafka.KafkaQueueFull, SinkTimeout)
    assert issubclass(sinks.kafka.KafkaConfigError, ValueError)
