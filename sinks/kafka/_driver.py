"""The one place that imports confluent-kafka (lazily, with an error naming the extra),
and the one place its exceptions become ours (``kafka_errors``).

Every call the Kafka adapters make into confluent-kafka (the sink's producer and its
admin client, ``replay.kafka``'s consumer) runs inside ``kafka_errors``: a
``KafkaException`` (and, where the caller says so, the ``ValueError``/``TypeError``
librdkafka raises for bad settings) comes out as a ``KafkaSinkError`` subclass whose
message names the adapter and the operation, chained to the vendor's exception.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from sinks.kafka._errors import KafkaSinkError

__all__ = ["confluent_kafka", "kafka_error_code", "kafka_errors", "quiet_logger"]

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


def kafka_error_code(exc: BaseException | None) -> int | None:
    """The librdkafka error code a ``KafkaException`` carries, if any."""
    error = exc.args[0] if exc is not None and exc.args else None
    code = getattr(error, "code", None)
    return int(code()) if callable(code) else None


@contextmanager
def kafka_errors(adapter: str, operation: str, error: type[KafkaSinkError] = KafkaSinkError,
                 advice: str = "", *, also: tuple[type[Exception], ...] = (),
                 ignore: Collection[int] = (),
                 on_error: Callable[[Exception], None] | None = None) -> Iterator[None]:
    """The error boundary of one Kafka adapter call.

    ``adapter`` is ``"producer"``, ``"consumer"`` or ``"admin"``; ``operation`` says what
    was being done (it leads the message); ``advice`` says what was kept and what to do.
    Error codes in ``ignore`` are not failures (the block ends there); ``on_error`` sees
    the vendor exception first (the sink records a refused message with it).
    """
    ck = confluent_kafka()
    try:
        yield
    except (ck.KafkaException, *also) as exc:
        if kafka_error_code(exc) in ignore:
            return
        if on_error is not None:
            on_error(exc)
        detail = exc.args[0].str() if exc.args and hasattr(exc.args[0], "str") else str(exc)
        tail = f"; {advice}" if advice else ""
        raise error(f"Kafka {adapter}: {operation} failed ({detail}){tail}") from exc
