"""KafkaSink: change events and epoch records onto the partitions of a Kafka topic."""

from __future__ import annotations

import contextlib
import functools
import importlib
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

import structlog

from sequencer import EpochRecord
from sinks._protocol import SinkClosed
from sinks.codec import SNAPSHOT_PARTITION, EventBatch, SnapshotChunk
from sinks.kafka._builder import MessageBuilder
from sinks.kafka._driver import confluent_kafka, kafka_errors, quiet_logger
from sinks.kafka._errors import (
    KafkaConfigError,
    KafkaDeliveryError,
    KafkaQueueFull,
    KafkaSinkError,
    KafkaUnavailable,
)
from sinks.kafka._snapshots import (
    MESSAGE_MAX_BYTES,
    oversized,
    snapshot_budget,
    snapshot_message,
)

__all__ = ["ENCODINGS", "KafkaSink"]

ENCODINGS: Final = ("native", "debezium")
log = structlog.get_logger()


class KafkaSink:
    """Ships records to a Kafka topic; implements the ``Sink`` protocol.

    - Events: one message per event, in the partition of its cell
      (``crc32(key) mod partitions``), so one cell's events stay in order in one
      partition. ``encoding`` is ``"native"`` (compact binary)
      or ``"debezium"`` (JSON envelopes); both are laid out in ``sinks.codec``.
    - Epoch records: one marker per partition, after that partition's events, with the
      partition's count, per-table counts and setsum (``sinks.kafka._markers``). In the
      Debezium encoding, ``BEGIN``/``END`` transaction records per write batch also go
      to ``transaction_topic`` (default ``<topic>.transaction``).
    - The producer is idempotent: retries after a broker outage neither duplicate nor
      reorder messages within a partition. A message Kafka finally refuses or times out
      (``delivery_timeout``) makes every later call raise ``KafkaDeliveryError``.
    - When librdkafka's local queue is full the writer waits for room, up to
      ``queue_full_timeout`` seconds, then raises ``KafkaQueueFull``; nothing is dropped.

    The topic must exist, unless ``partitions`` is given: then a missing topic is created
    with that many partitions (and ``replication_factor``), and an existing one must have
    exactly that many. The partition count must not change while a domain is shipped.
    The constructor fails within ``startup_timeout`` seconds if no broker answers.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        partitions: int | None = None,
        encoding: str = "native",
        transaction_topic: str | None = None,
        name: str = "cdc-agent",
        replication_factor: int = 1,
        config: Mapping[str, Any] | None = None,
        startup_timeout: float = 15.0,
        flush_timeout: float = 120.0,
        queue_full_timeout: float = 60.0,
        delivery_timeout: float = 300.0,
    ) -> None:
        if encoding not in ENCODINGS:
            raise KafkaConfigError(
                f"unknown Kafka encoding {encoding!r}; choose one of {', '.join(ENCODINGS)}"
            )
        if partitions is not None and partitions < 1:
            raise KafkaConfigError(f"partitions must be at least 1, got {partitions}")
        ck = confluent_kafka()
        self.topic = topic
        self.encoding = encoding
        self.name = name
        self.transaction_topic = transaction_topic or f"{topic}.transaction"
        self.flush_timeout = flush_timeout
        self.queue_full_timeout = queue_full_timeout
        self._bootstrap = bootstrap
        self._failures: list[tuple[str, int, str]] = []
        self._fatal: str | None = None
        self._closed = False
        settings: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "message.timeout.ms": int(delivery_timeout * 1000),
            "allow.auto.create.topics": False,
            "delivery.report.only.error": True,
            "on_delivery": self._on_delivery,
            "error_cb": self._on_error,
            "logger": quiet_logger(),
        }
        settings.update(config or {})
        # A baseline chunk is one message: the agent cuts chunks to fit (issue 9).
        self.message_max_bytes = int(settings.get("message.max.bytes", MESSAGE_MAX_BYTES))
        self.snapshot_max_bytes = snapshot_budget(self.message_max_bytes)
        with kafka_errors("producer", "creating the producer (librdkafka refused the "
                          "settings)", KafkaConfigError, "nothing was written; fix the config",
                          also=(ValueError, TypeError)):
            self._producer = ck.Producer(settings)
        self.partitions = self._check_topic(self.topic, partitions, replication_factor,
                                            startup_timeout)
        if encoding == "debezium":
            self._check_topic(self.transaction_topic, partitions and 1, replication_factor,
                              startup_timeout)
        self._builder = MessageBuilder(self.partitions, encoding, name=name)

    # -- start-up --------------------------------------------------------------------

    def _metadata(self, topic: str, timeout: float) -> Any:
        with kafka_errors("producer", f"reading the metadata of topic {topic!r}",
                          KafkaUnavailable, f"no Kafka broker at {self._bootstrap} answered "
                          f"within {timeout}s; nothing was written; check the bootstrap "
                          "address and that the broker runs"):
            return self._producer.list_topics(topic, timeout=timeout)

    def _check_topic(self, topic: str, partitions: int | None, replication_factor: int,
                     timeout: float) -> int:
        """The partition count of ``topic``, creating it if asked to."""
        deadline = time.monotonic() + timeout
        meta = self._metadata(topic, timeout).topics.get(topic)
        missing = meta is None or meta.error is not None or not meta.partitions
        if missing and partitions is None:
            reason = meta.error.str() if meta is not None and meta.error else "no metadata"
            raise KafkaConfigError(
                f"Kafka topic {topic!r} does not exist on {self._bootstrap} ({reason}); "
                "nothing was written; create it, or pass partitions=N to let the sink "
                "create it"
            )
        if missing:
            assert partitions is not None
            self._create_topic(topic, partitions, replication_factor, deadline)
            return partitions
        count = len(meta.partitions)
        if partitions is not None and count != partitions:
            raise KafkaConfigError(
                f"Kafka topic {topic!r} has {count} partitions, not the {partitions} asked "
                "for; events are keyed by partition count, so use partitions=None or "
                f"partitions={count}"
            )
        return count

    def _create_topic(self, topic: str, partitions: int, replication_factor: int,
                      deadline: float) -> None:
        ck = confluent_kafka()
        what = f"creating topic {topic!r}"
        timeout = max(deadline - time.monotonic(), 1.0)
        with kafka_errors("admin", what, KafkaConfigError, "nothing was written"):
            admin_module = importlib.import_module("confluent_kafka.admin")
            admin = admin_module.AdminClient({"bootstrap.servers": self._bootstrap,
                                              "logger": quiet_logger()})
            future = admin.create_topics(
                [admin_module.NewTopic(topic, partitions, replication_factor)],
                request_timeout=timeout)[topic]
        with kafka_errors("admin", what, KafkaConfigError, "nothing was written",
                          ignore={ck.KafkaError.TOPIC_ALREADY_EXISTS}):
            future.result(timeout)
        while time.monotonic() < deadline:
            meta = self._metadata(topic, max(deadline - time.monotonic(), 0.1)).topics.get(topic)
            if meta is not None and meta.error is None and len(meta.partitions) == partitions \
                    and all(p.leader >= 0 for p in meta.partitions.values()):
                return
            time.sleep(0.05)
        raise KafkaUnavailable(f"Kafka topic {topic!r} was created but has no leader for "
                               "every partition in time; nothing was written")

    # -- callbacks (run inside poll/flush, on the writer's thread) ------------------------

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._failures.append((msg.topic(), msg.partition(), err.str()))

    def _on_error(self, err: Any) -> None:
        if err.fatal():
            self._fatal = err.str()
        else:
            log.debug("kafka_transient_error", error=err.str(), bootstrap=self._bootstrap)

    def _check_healthy(self) -> None:
        if self._closed:
            raise SinkClosed(f"KafkaSink for topic {self.topic!r} is closed")
        if self._fatal is not None:
            raise KafkaDeliveryError(
                f"the idempotent producer for topic {self.topic!r} hit a fatal error "
                f"({self._fatal}); messages after it were not kept, so the log has a gap a "
                "consumer reports as InconsistentLog; restart the agent (a new domain)"
            )
        if self._failures:
            topic, part, reason = self._failures[0]
            raise KafkaDeliveryError(
                f"Kafka did not keep {len(self._failures)} message(s) (first: topic "
                f"{topic!r} partition {part}: {reason}); the log has a gap a consumer "
                "reports as InconsistentLog; the sink accepts nothing more: restart the "
                "agent (a new domain)"
            )

    # -- the Sink protocol ---------------------------------------------------------------

    def write_events(self, batch: EventBatch) -> None:
        """Send every event of ``batch`` to the partition of its cell.

        Step 1. Refuse if the sink is closed or a delivery already failed.
        Step 2. Encode keys and values column-wise; pick each event's partition.
        Step 3. Tally counts and segment digests per (write batch, partition), for the
                epoch markers.
        Step 4. Hand the messages to the idempotent producer (waiting if its queue is
                full); durability comes with ``flush()``.
        """
        # Step 1.
        self._check_healthy()
        # Step 2 and 3.
        keys, values, parts = self._builder.events(batch)
        # Step 4.
        produce = self._producer.produce
        topic = self.topic
        with self._handing_over():
            for key, value, part in zip(keys, values, parts, strict=True):
                try:
                    produce(topic, value, key, part)
                except BufferError:
                    self._wait_for_room(functools.partial(produce, topic, value, key, part))
        self._producer.poll(0)

    def write_epoch(self, record: EpochRecord) -> None:
        """Write ``record`` into every partition, each copy with that partition's share.

        Step 1. Refuse if the sink is closed or a delivery already failed.
        Step 2. Sum the shares of the write batches the epoch covers, per partition.
        Step 3. Send one marker per partition (after the partition's events: the
                idempotent producer keeps a partition in order).
        Step 4. Debezium: send BEGIN/END transaction records for the covered batches.
        """
        # Step 1.
        self._check_healthy()
        # Step 2.
        markers, transactions = self._builder.epoch(record)
        # Step 3.
        for marker in markers:
            self._produce_one(self.topic, marker.value, marker.key, marker.partition,
                              marker.headers)
        # Step 4.
        for key, value in transactions:
            self._produce_one(self.transaction_topic, value, key, 0, None)
        self._producer.poll(0)

    def write_snapshot(self, chunk: SnapshotChunk) -> None:
        """Write a baseline chunk as one message in partition 0, after the epoch markers
        of its quiescence point (``sinks.kafka._snapshots``); durable with ``flush()``."""
        self._check_healthy()
        message = snapshot_message(chunk, self.encoding, self.partitions, self.name)
        reason = oversized(chunk, message, self.message_max_bytes)
        if reason is not None:
            self._failures.append((self.topic, SNAPSHOT_PARTITION, reason))
            raise KafkaDeliveryError(
                f"{reason}; nothing of it was sent and the sink accepts nothing more; raise "
                "message.max.bytes (the producer's config and the topic's "
                "max.message.bytes) above it (a smaller chunk_rows cannot cut a row)")
        self._produce_one(self.topic, message.value, message.key, message.partition,
                          message.headers or None)
        for row in message.rows:  # Debezium: the chunk's cells as op "r" records
            self._produce_one(self.topic, row.value, row.key, row.partition, row.headers)
        self._producer.poll(0)

    def _produce_one(self, topic: str, value: bytes | None, key: bytes | None, partition: int,
                     headers: list[tuple[str, bytes]] | None) -> None:
        def send() -> None:
            self._producer.produce(topic, value, key, partition, headers=headers)

        with self._handing_over():
            try:
                send()
            except BufferError:
                self._wait_for_room(send)

    def _handing_over(self) -> contextlib.AbstractContextManager[None]:
        """The boundary of ``produce``: a message the producer refuses outright (too
        large, ...) breaks the sink, which then accepts nothing more."""
        return kafka_errors(
            "producer", f"handing a message for topic {self.topic!r} to the producer",
            KafkaDeliveryError, "the messages before it were handed over, the ones after "
            "it were not, so the log has a gap a consumer reports as InconsistentLog; the "
            "sink accepts nothing more",
            on_error=lambda exc: self._failures.append((self.topic, -1, str(exc))))

    def _wait_for_room(self, send: Callable[[], None]) -> None:
        """Serve delivery reports until the local queue takes the message, or time out."""
        deadline = time.monotonic() + self.queue_full_timeout
        while True:
            self._producer.poll(0.05)
            self._check_healthy()
            try:
                send()
                return
            except BufferError:
                if time.monotonic() > deadline:
                    raise KafkaQueueFull(
                        f"the producer queue for topic {self.topic!r} stayed full for "
                        f"{self.queue_full_timeout}s ({len(self._producer)} messages not yet "
                        "acknowledged, kept and retried); the broker is down or too slow; "
                        "nothing was dropped: retry the write or restart the agent"
                    ) from None

    def flush(self) -> None:
        """Return once every message handed to the producer is acknowledged, or raise.

        Step 1. Wait for the producer's queue to drain (``flush_timeout``).
        Step 2. Raise ``KafkaDeliveryError`` if any message was refused or timed out.
        """
        if self._closed:
            return
        # Step 1.
        with kafka_errors("producer", f"flushing the producer of topic {self.topic!r}",
                          KafkaSinkError, "unacknowledged messages stay queued; call flush() "
                          "again"):
            remaining = self._producer.flush(self.flush_timeout)
        # Step 2.
        self._check_healthy()
        if remaining:
            raise KafkaUnavailable(
                f"{remaining} message(s) to topic {self.topic!r} were not acknowledged "
                f"within {self.flush_timeout}s; they stay queued and retried until "
                "delivery_timeout; call flush() again once the broker is back"
            )

    def close(self) -> None:
        """Flush, then release the producer. A second call does nothing.

        If the flush fails, the messages still queued are purged (nothing will send them
        after close) and the flush's error is raised.
        """
        if self._closed:
            return
        try:
            self.flush()
        except BaseException:
            self._producer.purge()
            self._producer.poll(0)
            raise
        finally:
            self._closed = True

    def __len__(self) -> int:
        """Messages handed to the producer and not yet acknowledged."""
        return len(self._producer)
