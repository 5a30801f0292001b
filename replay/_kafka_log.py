"""Reading a Kafka topic written by ``sinks.kafka.KafkaSink``: verify each partition, cut
at the minimum quiescence point across partitions, delegate the cancel-out (pure, no I/O).

``KafkaLog.feed(partition, offset, key, value, headers)`` takes messages in each
partition's order (partitions may interleave freely) and returns the changesets that
became consistent. For each partition and domain it:

1. keeps the partition's events of epochs not yet closed, dropping repeated identities
   and copies of events already applied;
2. on the partition's marker for epoch e (``sinks.kafka._markers``), checks that epoch e
   follows the partition's previous epoch, and that the partition's events of e match
   the marker's count, per-table counts and setsum (the setsum of the partition's
   segments); a shortfall means an event was lost: ``InconsistentLog``;
3. once every partition has verified epoch e (and the partitions' counts add up to the
   epoch's), feeds the epoch's events and its whole record to the ``Assembler``, which
   cancels events out and applies a changeset at each quiescence point.

So nothing reaches the assembler before every partition vouched for it; the cut is the
minimum verified epoch across partitions. ``commit_points`` pairs each changeset handed
out with where a consumer restarted after applying it must begin (per partition, nothing
before that offset is needed again) and the position token to resume with.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from replay._assembler import Assembler, Changeset
from replay._errors import InconsistentLog
from replay._position import Frontier
from sequencer import EpochRecord, id_lt
from sinks._setsum import Setsum
from sinks.codec import CodecError, EventBatch, decode, encode_key, encode_value, segment_digests
from sinks.kafka import _debezium
from sinks.kafka._markers import HEADER_PARTITION, HEADER_WHOLE
from sinks.kafka._native import EVENT_MAGIC, RawEvent, decode_event, raw_events_batch

__all__ = ["CommitPoint", "KafkaLog"]

_HEADERS: Final = (HEADER_PARTITION, HEADER_WHOLE)


_RING: Final = 1 << 64
_MAX_POINTS: Final = 100_000


class _PendingBatches:
    """Events of one domain in one partition waiting for their epoch marker, by batch.

    Batch ids are kept in a heap ordered on the id ring (relative to the first id seen),
    so the events before an epoch's end come out in O(k log n), however many later
    batches wait behind them.
    """

    __slots__ = ("_base", "_batches", "_first_offset", "_heap")

    def __init__(self) -> None:
        self._base: int | None = None
        self._batches: dict[int, dict[int, RawEvent]] = {}
        self._first_offset: dict[int, int] = {}
        self._heap: list[int] = []

    def _rel(self, batch_id: int) -> int:
        if self._base is None:
            self._base = (batch_id - (1 << 63)) % _RING
        return (batch_id - self._base) % _RING

    def add(self, event: RawEvent, offset: int) -> RawEvent | None:
        """Keep ``event`` (read at ``offset``); return the event already kept with its
        identity, if any."""
        batch = self._batches.get(event.batch_id)
        if batch is None:
            batch = self._batches[event.batch_id] = {}
            self._first_offset[event.batch_id] = offset
            heapq.heappush(self._heap, self._rel(event.batch_id))
        known = batch.get(event.seq)
        if known is None:
            batch[event.seq] = event
        return known

    def take_before(self, end_id: int) -> tuple[list[RawEvent], int | None]:
        """Remove and return every event of a batch before ``end_id``, and the smallest
        offset they were read at."""
        out: list[RawEvent] = []
        first: int | None = None
        if not self._heap:
            return out, first
        limit = self._rel(end_id)
        heap, batches, base = self._heap, self._batches, self._base
        assert base is not None
        while heap and heap[0] < limit:
            batch_id = (heapq.heappop(heap) + base) % _RING
            out.extend(batches.pop(batch_id).values())
            offset = self._first_offset.pop(batch_id)
            first = offset if first is None else min(first, offset)
        return out, first

    def first_offset(self) -> int | None:
        """The smallest offset an event still kept was read at."""
        return min(self._first_offset.values(), default=None)

    def __len__(self) -> int:
        return len(self._batches)


@dataclass(frozen=True)
class CommitPoint:
    """Where a consumer restarts once a changeset is applied: offsets and position token."""

    offsets: dict[int, int]
    token: str


@dataclass
class _Lane:
    """One domain in one partition."""

    next_epoch: int | None = None  # the epoch the next marker must be (None: not known yet)
    verified_end: int | None = None  # events of batches before this id were verified here
    pending: _PendingBatches = field(default_factory=lambda: _PendingBatches())


@dataclass
class _Epoch:
    """One epoch of one domain, as the partitions vouch for it."""

    whole: EpochRecord
    batches: list[EventBatch] = field(default_factory=list)  # one per partition with events
    marker_offsets: dict[int, int] = field(default_factory=dict)
    # per partition, the smallest offset of this epoch's messages (events or marker)
    first_offsets: dict[int, int] = field(default_factory=dict)
    counted: int = 0


class KafkaLog:
    """Per-partition verification and the consistent cut over ``partitions`` partitions.

    ``encoding`` is ``"native"`` or ``"debezium"``. ``assembler`` does the cancel-out
    (a fresh ``Assembler()`` by default); its position says what is already applied.
    """

    def __init__(self, partitions: int, *, encoding: str = "native",
                 assembler: Assembler | None = None) -> None:
        if encoding not in ("native", "debezium"):
            raise ValueError(f"unknown Kafka encoding {encoding!r}; choose native or debezium")
        self.partitions = partitions
        self.encoding = encoding
        self.assembler = assembler or Assembler()
        self._lanes: list[dict[int, _Lane]] = [{} for _ in range(partitions)]
        self._next_offset: list[int | None] = [None] * partitions
        self._epochs: dict[tuple[int, int], _Epoch] = {}
        self._fed: dict[int, int] = {}  # domain -> last epoch fed to the assembler
        self._applied_end: dict[int, int] = {}
        # per domain, the first offsets of epochs fed to the assembler but not yet part
        # of a changeset handed out
        self._fed_unsettled: dict[int, list[dict[int, int]]] = {}
        self._first: dict[int, tuple[int, int]] = {}  # domain -> its first epoch's key
        self.duplicates = 0
        # (changeset, where to restart once it is applied), in the order handed out;
        # a consumer pops them as the application takes the changesets. Bounded: a
        # consumer that never commits keeps only the latest.
        self.commit_points: deque[tuple[Changeset, CommitPoint]] = deque(maxlen=_MAX_POINTS)
        for position in self.assembler.position:
            self._fed[position.domain_id] = position.epoch_seq
            self._applied_end[position.domain_id] = position.end_id

    @property
    def position(self) -> Frontier:
        """The assembler's position: everything up to it was handed out as changesets."""
        return self.assembler.position

    def seek(self, partition: int, offset: int) -> None:
        """Say where reading ``partition`` starts (the committed offset, or 0)."""
        self._next_offset[partition] = offset

    # -- intake -----------------------------------------------------------------------------

    def feed(self, partition: int, offset: int, key: bytes | None, value: bytes | None,
             headers: Sequence[tuple[str, bytes | None]] | None) -> list[Changeset]:
        """Take one message of ``partition`` (in the partition's order)."""
        self._next_offset[partition] = offset + 1
        if value is not None and value[:3] == EVENT_MAGIC:
            try:
                event = decode_event(value)
            except CodecError as exc:
                raise InconsistentLog(f"partition {partition} offset {offset} holds a corrupt "
                                      f"event message: {exc}") from exc
            self._event(partition, offset, event)
            return []
        marker = _marker_headers(headers)
        if marker is not None:
            return self._marker(partition, offset, *marker)
        if self.encoding == "debezium" and value is not None:
            try:
                change = _debezium.decode_event(value)
            except CodecError as exc:
                raise InconsistentLog(f"partition {partition} offset {offset} holds a "
                                      f"message that is not a cdc-agent record: {exc}") from exc
            self._event(partition, offset, RawEvent(
                change.domain_id, change.batch_id, change.seq, change.table,
                encode_key(change.row), change.column, encode_value(change.old),
                encode_value(change.new)))
            return []
        raise InconsistentLog(f"partition {partition} offset {offset} holds a message that "
                              f"is not a cdc-agent {self.encoding} record "
                              f"(starts {bytes(value or b'')[:8]!r})")

    def _lane(self, partition: int, domain_id: int) -> _Lane:
        lane = self._lanes[partition].get(domain_id)
        if lane is None:
            lane = self._lanes[partition][domain_id] = _Lane()
        return lane

    def _event(self, partition: int, offset: int, event: RawEvent) -> None:
        domain = event.domain_id
        applied_end = self._applied_end.get(domain)
        if applied_end is not None and id_lt(event.batch_id, applied_end):
            self.duplicates += 1  # a copy of an event already applied
            return
        lane = self._lane(partition, domain)
        if lane.verified_end is not None and id_lt(event.batch_id, lane.verified_end):
            self.duplicates += 1  # a copy of an event this partition already vouched for
            return
        known = lane.pending.add(event, offset)
        if known is not None:
            if known != event:
                raise InconsistentLog(
                    f"partition {partition} holds two different events with identity "
                    f"(batch {event.batch_id:#x}, seq {event.seq})", domain_id=domain)
            self.duplicates += 1
            return

    def _marker(self, partition: int, offset: int, part: EpochRecord, whole: EpochRecord
                ) -> list[Changeset]:
        domain, seq = whole.domain_id, whole.epoch_seq
        if (part.domain_id, part.epoch_seq, part.begin_id, part.end_id, part.quiescent) != (
                domain, seq, whole.begin_id, whole.end_id, whole.quiescent) \
                or part.stream != partition:
            raise InconsistentLog(f"partition {partition} offset {offset}: an epoch marker "
                                  f"for stream {part.stream} does not match its epoch",
                                  domain_id=domain, epoch_seq=seq)
        lane = self._lane(partition, domain)
        covered, first_offset = lane.pending.take_before(whole.end_id)
        fed = self._fed.get(domain)
        if fed is not None and seq <= fed:
            self.duplicates += 1 + len(covered)  # an epoch already applied
            if lane.next_epoch is None or lane.next_epoch <= seq:
                lane.next_epoch, lane.verified_end = seq + 1, whole.end_id
            return []
        if lane.next_epoch is not None and seq < lane.next_epoch:
            self.duplicates += 1 + len(covered)  # this partition already vouched for it
            return []
        # Step 2: the epoch follows this partition's previous one, and its events are all here.
        expected = lane.next_epoch
        if expected is None:
            expected = fed + 1 if fed is not None else seq if whole.begin_id == 0 else None
            if expected is None:
                raise InconsistentLog(
                    f"partition {partition} starts in the middle of the domain (epoch {seq}) "
                    "and no position says what was applied before it: the earlier records "
                    "are gone (retention?); resume with the position token of the last "
                    "changeset applied", domain_id=domain, epoch_seq=seq)
        if seq != expected:
            raise InconsistentLog(
                f"partition {partition} skips from epoch {expected - 1} to epoch {seq}: "
                "epoch markers (and their events) are missing", domain_id=domain,
                epoch_seq=expected)
        checked = _check_partition(partition, part, covered)
        lane.next_epoch = seq + 1
        lane.verified_end = whole.end_id
        # Step 3: collect the epoch; feed the assembler once every partition vouched for it.
        epoch = self._epochs.get((domain, seq))
        if epoch is None:
            epoch = self._epochs[(domain, seq)] = _Epoch(whole)
            if whole.begin_id == 0:  # the domain's first epoch: where feeding starts
                self._first.setdefault(domain, (domain, seq))
        elif epoch.whole != whole:
            raise InconsistentLog(f"partitions disagree on the record of epoch {seq}: "
                                  f"{epoch.whole} and {whole}", domain_id=domain, epoch_seq=seq)
        if checked is not None:
            epoch.batches.append(checked)
        epoch.counted += part.event_count
        epoch.marker_offsets[partition] = offset
        epoch.first_offsets[partition] = offset if first_offset is None else first_offset
        return self._feed_complete(domain)

    def _feed_complete(self, domain: int) -> list[Changeset]:
        out: list[Changeset] = []
        while True:
            seq = self._fed.get(domain)
            key = (domain, seq + 1) if seq is not None else self._first_epoch(domain)
            epoch = self._epochs.get(key) if key is not None else None
            if epoch is None or len(epoch.marker_offsets) < self.partitions:
                return out
            del self._epochs[key]  # type: ignore[arg-type]
            whole = epoch.whole
            if epoch.counted != whole.event_count:
                raise InconsistentLog(
                    f"the partitions hold {epoch.counted} events of this epoch, its record "
                    f"says {whole.event_count}", domain_id=domain, epoch_seq=whole.epoch_seq)
            self._fed[domain] = whole.epoch_seq
            for batch in epoch.batches:
                self.assembler.feed(batch)
            changesets = self.assembler.feed(whole)
            self._fed_unsettled.setdefault(domain, []).append(epoch.first_offsets)
            if changesets:
                self._settle(domain, whole.end_id)
                point = CommitPoint(self.commit_offsets(), str(self.assembler.position))
                self.commit_points.extend((changeset, point) for changeset in changesets)
            out.extend(changesets)

    def _first_epoch(self, domain: int) -> tuple[int, int] | None:
        return self._first.get(domain)

    def _settle(self, domain: int, end_id: int) -> None:
        """A changeset of ``domain`` was handed out: every epoch fed so far is applied."""
        self._applied_end[domain] = end_id
        self._fed_unsettled.pop(domain, None)

    # -- restart points ---------------------------------------------------------------------

    def read_offsets(self) -> dict[int, int]:
        """Per partition, the offset after the last message fed (or the seek offset)."""
        return {p: o for p, o in enumerate(self._next_offset) if o is not None}

    def commit_offsets(self) -> dict[int, int]:
        """Per partition, the offset a restarted consumer must read from: the first
        message not yet part of a changeset handed out (else the next one to read)."""
        starts: list[list[int]] = [[] for _ in range(self.partitions)]
        for partition, lanes in enumerate(self._lanes):
            for lane in lanes.values():
                first = lane.pending.first_offset()
                if first is not None:
                    starts[partition].append(first)
        unsettled = [e.first_offsets for e in self._epochs.values()]
        for fed in self._fed_unsettled.values():
            unsettled += fed
        for first_offsets in unsettled:
            for partition, offset in first_offsets.items():
                starts[partition].append(offset)
        out = {}
        for partition, offsets in enumerate(starts):
            next_offset = self._next_offset[partition]
            if offsets:
                out[partition] = min(offsets)
            elif next_offset is not None:
                out[partition] = next_offset
        return out


def _marker_headers(headers: Sequence[tuple[str, bytes | None]] | None
                    ) -> tuple[EpochRecord, EpochRecord] | None:
    if not headers:
        return None
    found = {name: raw for name, raw in headers if name in _HEADERS and raw is not None}
    if len(found) != 2:
        return None
    try:
        part, whole = decode(found[HEADER_PARTITION]), decode(found[HEADER_WHOLE])
    except CodecError as exc:
        raise InconsistentLog(f"a corrupt epoch marker: {exc}") from exc
    if not isinstance(part, EpochRecord) or not isinstance(whole, EpochRecord):
        raise InconsistentLog("an epoch marker header holds events, not an epoch record")
    return part, whole


def _check_partition(partition: int, part: EpochRecord, events: list[RawEvent]
                     ) -> EventBatch | None:
    """The partition's events of an epoch against the partition's marker (step 2); returns
    them as one batch in (batch, seq) order (None if there are none)."""
    where = {"domain_id": part.domain_id, "epoch_seq": part.epoch_seq}
    if len(events) != part.event_count:
        raise InconsistentLog(
            f"partition {partition} holds {len(events)} events of this epoch before its "
            f"marker, the marker says {part.event_count}: "
            + ("events were lost" if len(events) < part.event_count else "foreign events"),
            **where)
    tables = Counter(e.table for e in events)
    if dict(tables) != dict(part.table_counts):
        raise InconsistentLog(
            f"partition {partition}: per-table counts {dict(tables)} differ from the "
            f"marker's {dict(part.table_counts)}", **where)
    if not events:
        return None
    events.sort(key=lambda e: (e.batch_id, e.seq))
    batch = raw_events_batch(events)
    digests = [digest for _d, _b, digest in segment_digests(batch.data)]
    actual = Setsum().insert_digests(b"".join(digests))
    if (actual.hexdigest() if actual else "") != part.setsum:
        raise InconsistentLog(
            f"partition {partition}: setsum of its events of this epoch is "
            f"{actual.hexdigest()}, the marker says {part.setsum or 'zero'} (an event was "
            "altered or lost)", **where)
    return batch
