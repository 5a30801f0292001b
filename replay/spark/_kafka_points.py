"""A stream's look at a Kafka topic: which quiescence points every partition vouched for.

The streaming source (``_stream``) asks, at each trigger, how far a micro-batch may go.
For a topic written by ``KafkaSink`` that is the furthest quiescence point whose epoch
(and every epoch before it) has its marker in *every* partition: a cut at a mere
per-partition offset would split epochs. ``TopicScan`` reads only the messages that are
new since its last look, in the driver, with a consumer (assigned partitions, from the
offset it reached to each partition's end now; closed after each look). Events are
skipped by their first bytes; markers are kept (two small records each) and checked as
``LogReplay`` checks them (``vouched_epochs``: each partition's epochs follow one
another, copies agree, counts add up), so a lost marker stops the stream at once; the
baselines' chunk headers are kept so that no cut enters a baseline that is not whole.

What is kept does not grow with the topic's history: once every partition vouched for
a domain's epoch, its markers (and those of the epochs before it) go, and the next
check starts after it (``vouched_epochs(starts=...)``; a later copy of such a marker
is a duplicate, skipped as before); of the chunk headers only those the cut reads stay
(a domain's first chunk, and the last of that baseline); of a domain's quiescence
points, the few the cut can use (``_baselines.points_a_cut_needs``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from replay._errors import InconsistentLog
from replay._position import Frontier, Position
from replay.spark._baselines import points_a_cut_needs
from replay.spark._kafka import (
    _CHUNK,
    _FOREIGN,
    _MARKER,
    ENCODINGS,
    _epoch_record,
    decode_chunk,
    foreign_message,
    message_kind,
    parse_topic_uri,
    topic_consumer,
    vouched_epochs,
)
from sinks.codec import HEADER_PARTITION, HEADER_SNAPSHOT, HEADER_WHOLE

__all__ = ["ChunkSeen", "TopicScan"]


@dataclass(frozen=True, slots=True)
class ChunkSeen:
    """What the frontier needs of a baseline chunk: whose, which, where, the last?"""

    domain_id: int
    baseline_id: int
    epoch_seq: int
    last: bool


@dataclass
class TopicScan:
    """What the cut needs of the markers and chunk headers of a topic read so far
    (``advance`` reads more)."""

    uri: str
    encoding: str = "native"
    read: list[int] = field(default_factory=list)  # per partition: the next offset to read
    # The markers of epochs not vouched for by every partition yet, in the order read.
    markers: list[tuple[int, int, bytes, bytes]] = field(default_factory=list)
    chunks: list[ChunkSeen] = field(default_factory=list)  # in partition 0's order
    taken: int = 0  # markers read in all
    # Each domain's last epoch every partition vouched for (its markers are gone) ...
    vouched: dict[int, Position] = field(default_factory=dict)
    # ... and its quiescence points up to there that the cut can use, in order.
    points: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    # Where the first look starts, if not at the first offsets held (``resume_from``).
    seed: list[int] | None = None

    def __post_init__(self) -> None:
        if self.encoding not in ENCODINGS:
            raise ValueError(f"unknown Kafka encoding {self.encoding!r}; choose native or "
                             "debezium")
        self.bootstrap, self.topic = parse_topic_uri(self.uri)

    def resume_from(self, offsets: Sequence[int], at: Frontier) -> None:
        """Start the first look at a stream's saved point (``_topic_resume``): from
        ``offsets`` every marker of an epoch after ``at`` is in the topic, so ``at``
        stands for what comes before (its epochs vouched, its points the first). If the
        topic no longer holds those offsets (retention), the look starts from the first
        held, as without a saved point."""
        self.seed = list(offsets)
        self.vouched = {p.domain_id: p for p in at}
        self.points = {p.domain_id: [(p.epoch_seq, p.end_id)] for p in at}

    def advance(self, timeout: float = 15.0) -> tuple[int, ...]:
        """Read every partition's messages up to its end now; return those ends.

        Raises ``InconsistentLog`` for a foreign message or messages removed (retention)
        before they were read, ``KafkaUnavailable`` when reading stalls ``timeout``."""
        from sinks.kafka import KafkaUnavailable, kafka_errors

        with topic_consumer(self.bootstrap, self.topic, timeout=timeout) as (
                ck, consumer, start, end):
            if not self.read:
                self.read = list(start)
                seed, self.seed = self.seed, None
                if seed is not None and len(seed) == len(start) and all(
                        first <= at <= stop for first, at, stop in zip(start, seed, end,
                                                                       strict=True)):
                    self.read = seed
                elif seed is not None:  # trimmed: nothing stands for the epochs before
                    self.vouched, self.points = {}, {}
            if len(end) != len(self.read):
                raise ValueError(f"topic {self.topic!r} now has {len(end)} partitions, it had "
                                 f"{len(self.read)}: a topic's partition count must not change")
            for p, (first, done) in enumerate(zip(start, self.read, strict=True)):
                if done < first:
                    raise InconsistentLog(
                        f"partition {p} of topic {self.topic!r} lost offsets {done}..{first - 1}"
                        " before the stream read them (retention?): restart the stream on a "
                        "new checkpoint and table")
            todo = {p for p, (done, stop) in enumerate(zip(self.read, end, strict=True))
                    if done < stop}
            if not todo:
                return tuple(end)
            with kafka_errors("consumer", f"assigning the partitions of {self.topic!r}"):
                consumer.assign([ck.TopicPartition(self.topic, p, self.read[p]) for p in todo])
            deadline = time.monotonic() + timeout
            while todo:
                with kafka_errors("consumer", f"reading {self.topic!r}", KafkaUnavailable):
                    messages = consumer.consume(10_000, 0.5)
                took = False
                for m in messages:
                    err = m.error()
                    if err is not None:
                        if err.code() == ck.KafkaError._PARTITION_EOF:
                            continue
                        raise KafkaUnavailable(f"Kafka consumer: reading {self.topic!r} "
                                               f"failed ({err.str()})")
                    p, offset = m.partition(), m.offset()
                    if self.read[p] <= offset < end[p]:
                        self._take(p, offset, m.value(), m.headers())
                        self.read[p] = offset + 1
                        took = True
                if took:
                    deadline = time.monotonic() + timeout
                else:  # a transaction's control records end no message (only the
                    # consumer's position moves past them); or a partition is stuck
                    for tp in consumer.position([ck.TopicPartition(self.topic, p)
                                                 for p in todo]):
                        if tp.offset >= end[tp.partition]:
                            self.read[tp.partition] = end[tp.partition]
                    if time.monotonic() > deadline:
                        raise KafkaUnavailable(
                            f"Kafka consumer: reading {self.topic!r} stalled for {timeout}s "
                            f"before the ends {end} (reached {self.read})")
                reached = [p for p in todo if self.read[p] >= end[p]]
                if reached:  # no more fetching of what comes after the ends
                    with kafka_errors("consumer", f"pausing partitions of {self.topic!r}"):
                        consumer.pause([ck.TopicPartition(self.topic, p) for p in reached])
                    todo.difference_update(reached)
            return tuple(end)

    def _take(self, partition: int, offset: int, value: bytes | None, headers: Any) -> None:
        kind = message_kind(value, headers, self.encoding == "native")
        if kind == _FOREIGN:
            raise foreign_message(self.topic, self.encoding, partition, offset)
        if kind not in (_MARKER, _CHUNK):
            return
        first: dict[str, bytes | None] = {}
        for name, raw in headers or ():
            first.setdefault(name, raw)
        if kind == _MARKER:
            part, whole = first[HEADER_PARTITION], first[HEADER_WHOLE]
            assert part is not None and whole is not None
            self.markers.append((partition, offset, part, whole))
            self.taken += 1
            return
        body = first.get(HEADER_SNAPSHOT) or value
        assert body is not None
        chunk = decode_chunk(partition, offset, body)
        seen = ChunkSeen(chunk.domain_id, chunk.baseline_id, chunk.epoch_seq, chunk.last)
        # The cut reads a domain's first chunk (its first baseline and where it starts)
        # and that baseline's last chunk; other chunks need not stay.
        first_seen = next((c for c in self.chunks if c.domain_id == seen.domain_id), None)
        if first_seen is None or (seen.last and seen.baseline_id == first_seen.baseline_id):
            self.chunks.append(seen)

    def quiescence_points(self) -> dict[int, list[tuple[int, int]]]:
        """Each domain's quiescence points ``(epoch_seq, end_id)`` that every partition
        vouched for (with every epoch before them), in order. Forgets the markers of the
        epochs every partition vouched for (the next look starts after them)."""
        records, _offsets = vouched_epochs(self.markers, len(self.read), self.vouched)
        for record in records:
            d = record.domain_id
            if record.quiescent:
                self.points.setdefault(d, []).append((record.epoch_seq, record.end_id))
            self.vouched[d] = Position(d, record.epoch_seq, record.end_id)
        for d, points in self.points.items():  # only those the cut can use stay
            if len(points) > 2:
                first = next((c for c in self.chunks if c.domain_id == d), None)
                self.points[d] = points_a_cut_needs(
                    points, None if first is None else first.epoch_seq)
        # (checked, so a copy of a vouched epoch goes too: it was a duplicate)
        self.markers = [m for m in self.markers if self._pending(m)]
        return self.points  # (the scan's own lists: read them, do not change them)

    def _pending(self, marker: tuple[int, int, bytes, bytes]) -> bool:
        """Is ``marker`` of an epoch not vouched for by every partition yet?"""
        whole = _epoch_record(marker[3], f"partition {marker[0]} offset {marker[1]}")
        done = self.vouched.get(whole.domain_id)
        return done is None or whole.epoch_seq > done.epoch_seq
