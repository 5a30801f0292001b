"""Errors of the Kafka sink: subclasses of the sink errors every caller already handles."""

from __future__ import annotations

from sinks._protocol import SinkError, SinkTimeout

__all__ = [
    "KafkaConfigError",
    "KafkaDeliveryError",
    "KafkaQueueFull",
    "KafkaSinkError",
    "KafkaUnavailable",
]


class KafkaSinkError(SinkError):
    """The Kafka sink failed; the message says what was kept and what to do."""


class KafkaConfigError(KafkaSinkError, ValueError):
    """The sink's configuration cannot work: a wrong encoding, a missing topic, ..."""


class KafkaUnavailable(KafkaSinkError, SinkTimeout):
    """The brokers did not answer within the time allowed."""


class KafkaDeliveryError(KafkaSinkError):
    """Kafka refused or lost messages; the log now has a gap a consumer will report."""


class KafkaQueueFull(KafkaSinkError, SinkTimeout):
    """The producer's local queue stayed full for longer than the time allowed."""
