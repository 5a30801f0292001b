"""Broker-free helpers: capture an agent's records, build the exact Kafka messages the
sink would send (``MessageBuilder``), and feed them to a ``KafkaLog`` in any interleaving."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agent import Agent, MemoryStore
from agent._workload import Workload
from replay import Changeset
from replay.kafka import KafkaLog
from sequencer import ABSENT, EpochRecord
from sinks import RecordingSink
from sinks.codec import EventBatch, SnapshotChunk
from sinks.kafka._builder import MessageBuilder
from sinks.kafka._snapshots import snapshot_message
from tests.helpers import bits

Message = tuple[bytes | None, bytes | None, list[tuple[str, bytes]] | None]


@dataclass
class Run:
    items: list[EventBatch | EpochRecord]
    at_quiescence: dict[tuple[int, int], dict[Any, bytes]]
    final: dict[Any, bytes]
    events: int


def captured_run(seed: int, threads: int = 4, batches: int = 150) -> Run:
    """Run the core's random workload through an Agent; keep records and true states."""
    store = MemoryStore()
    sink = RecordingSink()
    snaps: dict[tuple[int, int], dict[Any, bytes]] = {}
    agent = Agent(store, sink, on_quiescence=lambda m: snaps.__setitem__(
        (m.domain_id, m.epoch_seq), bits(store.snapshot())))
    Workload(threads=threads, batches=batches, seed=seed).run(agent)
    agent.close()
    return Run(sink.items, snaps, bits(store.snapshot()), agent.stats["events"])


def simulate_topic(items: Sequence[EventBatch | EpochRecord | SnapshotChunk], partitions: int,
                   encoding: str) -> list[list[Message]]:
    """The messages of each partition of the data topic, in partition order."""
    builder = MessageBuilder(partitions, encoding)
    topic: list[list[Message]] = [[] for _ in range(partitions)]
    for item in items:
        if isinstance(item, SnapshotChunk):
            chunk = snapshot_message(item, encoding, partitions)
            topic[chunk.partition].append((chunk.key, chunk.value, chunk.headers or None))
            for row in chunk.rows:  # Debezium: the cells' op "r" records
                topic[row.partition].append((row.key, row.value, row.headers))
        elif isinstance(item, EventBatch):
            keys, values, parts = builder.events(item)
            for key, value, part in zip(keys, values, parts, strict=True):
                topic[part].append((key, value, None))
        else:
            for marker in builder.epoch(item).markers:
                topic[marker.partition].append((marker.key, marker.value, marker.headers))
    return topic


@dataclass
class Feeder:
    """Feeds a simulated topic to a KafkaLog, partitions interleaved at random."""

    topic: list[list[Message]]
    rng: random.Random
    next: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.next:
            self.next = [0] * len(self.topic)

    def feed(self, log: KafkaLog, limit: int | None = None) -> list[Changeset]:
        out: list[Changeset] = []
        fed = 0
        while limit is None or fed < limit:
            open_parts = [p for p, msgs in enumerate(self.topic) if self.next[p] < len(msgs)]
            if not open_parts:
                break
            p = self.rng.choice(open_parts)
            for _ in range(self.rng.randrange(1, 20)):
                if self.next[p] >= len(self.topic[p]):
                    break
                key, value, headers = self.topic[p][self.next[p]]
                out += log.feed(p, self.next[p], key, value, headers)
                self.next[p] += 1
                fed += 1
        return out


def apply(state: dict[Any, Any], changeset: Changeset) -> None:
    """Apply a changeset to a decoded state (ABSENT removes the cell)."""
    for cell, value in changeset.changes.items():
        if value is ABSENT:
            state.pop(cell, None)
        else:
            state[cell] = value
