"""Records to Kafka messages, as a pure function of the records: what ``KafkaSink`` sends.

Format apart from destination: the sink only hands these messages to the producer, and
tests (and anyone simulating a topic) can build the exact same messages without a
broker. The builder keeps the per-write-batch tallies the epoch markers need.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

import structlog

from sequencer import EpochRecord
from sinks.codec import (
    EventBatch,
    debezium_transaction_records,
    encode_debezium_event,
    encode_native_events,
    event_keys,
    partitions_of,
)
from sinks.kafka._markers import Marker, marker_messages
from sinks.kafka._tally import PartitionTally

__all__ = ["EpochMessages", "EventMessages", "MessageBuilder"]

log = structlog.get_logger()


class EventMessages(NamedTuple):
    """Messages of change events for the data topic, column-wise."""

    keys: list[bytes]
    values: list[bytes]
    partitions: list[int]


class EpochMessages(NamedTuple):
    """Messages of one epoch record: a marker per data partition, and (Debezium) the
    transaction topic's ``(key, value)`` records."""

    markers: list[Marker]
    transactions: list[tuple[bytes, bytes]]


class MessageBuilder:
    """Builds the messages of records given in log order (``Sink`` protocol order)."""

    def __init__(self, partitions: int, encoding: str = "native", *,
                 name: str = "cdc-agent") -> None:
        if encoding not in ("native", "debezium"):
            raise ValueError(f"unknown Kafka encoding {encoding!r}")
        self.partitions = partitions
        self.encoding = encoding
        self.name = name
        self._tally = PartitionTally(partitions)
        self._dc_order: dict[tuple[int, int], Counter[str]] = {}

    def events(self, batch: EventBatch) -> EventMessages:
        """One message per event, in the partition of its cell."""
        data = batch.data
        if data.num_rows == 0:
            return EventMessages([], [], [])
        keys = event_keys(data)
        parts = partitions_of(keys, self.partitions)
        if self.encoding == "native":
            values = encode_native_events(data)
        else:
            values = self._debezium_values(batch, keys)
        self._tally.add(data, parts)
        return EventMessages(keys, values, parts.tolist())

    def _debezium_values(self, batch: EventBatch, keys: list[bytes]) -> list[bytes]:
        values = []
        orders = self._dc_order
        for i, event in enumerate(batch.to_events()):
            counter = orders.get((event.domain_id, event.batch_id))
            if counter is None:
                counter = orders[(event.domain_id, event.batch_id)] = Counter()
            counter[event.table] += 1
            keys[i], value = encode_debezium_event(
                event, name=self.name, data_collection_order=counter[event.table])
            values.append(value)
        return values

    def epoch(self, record: EpochRecord) -> EpochMessages:
        """The markers of ``record`` (one per partition) and its transaction records."""
        per_partition, batches = self._tally.close_epoch(record)
        shipped = sum(r.event_count for r in per_partition)
        if shipped != record.event_count:
            log.warning("kafka_epoch_count_mismatch", domain_id=record.domain_id,
                        epoch_seq=record.epoch_seq, epoch_count=record.event_count,
                        shipped=shipped)
        transactions: list[tuple[bytes, bytes]] = []
        if self.encoding == "debezium":
            for total in batches:
                self._dc_order.pop((total.domain_id, total.batch_id), None)
                transactions += debezium_transaction_records(
                    total.domain_id, total.batch_id, total.event_count, total.tables)
        return EpochMessages(marker_messages(record, per_partition, self.encoding),
                             transactions)

    def pending_batches(self) -> int:
        """Write batches whose epoch record has not come yet."""
        return len(self._tally)
