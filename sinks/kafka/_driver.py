"""The one place that imports confluent-kafka, lazily, with an error naming the extra."""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

__all__ = ["confluent_kafka", "quiet_logger"]

_quiet = logging.getLogger("cdc_agent.kafka.librdkafka")
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False


def confluent_kafka() -> ModuleType:
    """The ``confluent_kafka`` module, or an ImportError that says what to install."""
    try:
        import confluent_kafka as module
    except ImportError as exc:  # pragma: no cover - the test environment has it
        raise ImportError(
            "the Kafka sink and consumer need confluent-kafka: "
            "pip install 'cdc-agent[kafka]'"
        ) from exc
    return module


def quiet_logger() -> Any:
    """A logger for librdkafka's own log lines (silenced: errors reach us as callbacks)."""
    return _quiet
