"""Reading a Kafka topic written by ``sinks.kafka.KafkaSink``: verify each partition, cut
at the minimum quiescence point across partitions, delegate the cancel-out (pure, no I/O).

``KafkaLog.feed(partition, offset, key, value, headers)`` takes messages in each
partition's order (partitions may interleave freely) and returns the changesets that
became consistent. For each partition and domain it:

1. keeps the partition's events of epochs not yet closed, dropping repeated identities
   and copies of events already applied;
2. on the partition's marker for epoch e (layout in ``sinks.codec``), checks that epoch e
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
from replay._position import Frontier, Position
from sequencer import EpochRecord, id_lt
from sinks import Setsum
from sinks.codec import (
    HEADER_PARTITION,
    HEADER_READ,
    HEADER_SNAPSHOT,
    HEADER_WHOLE,
    MAGIC,
    CodecError,
    EventBatch,
    RawEvent,
    SnapshotChunk,
    decode,
    decode_debezium_event,
    encode_key,
    encode_value,
    raw_events_batch,
    row_segment_digests,
    segment_digests,
)
from sinks.codec import NATIVE_MAGIC as EVENT_MAGIC
from sinks.codec import decode_native_event as decode_event

__all__ = ["CommitPoint", "KafkaLog"]

_HEADERS: Final = (HEADER_PARTITION, HEADER_WHOLE)


_RING: Final = 1 << 64
_HALF_RING: Final = 1 << 63
_MAX_POINTS: Final = 100_000
_SMALL_SHARE: Final = 512  # a partition's share of an epoch up to this many events: no Arrow
_EMPTY_SETSUMS: Final = ("", "0" * 64)  # an empty share's setsum (not computed / zero)
_MAX_WHOLES: Final = 4096  # decoded whole-epoch headers kept (each partition repeats one)


class _PendingBatches:
    """Events of one domain in one partition waiting for their epoch marker, by batch.

    Batch ids are kept in a heap ordered on the id ring (relative to the first id seen),
    so the events before an epoch's end come out in O(k log n), however many later
    batches wait behind them.
    """

    __slots__ = ("_base", "_batches", "_heap", "events")

    def __init__(self) -> None:
        self._base: int | None = None
        self._batches: dict[int, dict[int, RawEvent]] = {}
        self._heap: list[int] = []
        self.events = 0

    def _rel(self, batch_id: int) -> int:
        if self._base is None:
            self._base = (batch_id - (1 << 63)) % _RING
        return (batch_id - self._base) % _RING

    def add(self, event: RawEvent) -> RawEvent | None:
        """Keep ``event``; return the event already kept with its identity, if any."""
        batch = self._batches.get(event.batch_id)
        if batch is None:
            batch = self._batches[event.batch_id] = {}
            heapq.heappush(self._heap, self._rel(event.batch_id))
        known = batch.get(event.seq)
        if known is None:
            batch[event.seq] = event
            self.events += 1
        return known

    def take_before(self, end_id: int) -> list[RawEvent]:
        """Remove and return every event of a batch before ``end_id``."""
        out: list[RawEvent] = []
        if not self._heap:
            return out
        limit = self._rel(end_id)
        heap, batches, base = self._heap, self._batches, self._base
        assert base is not None
        while heap and heap[0] < limit:
            batch_id = (heapq.heappop(heap) + base) % _RING
            out.extend(batches.pop(batch_id).values())
        self.events -= len(out)
        return out

    def __len__(self) -> int:
        return len(self._batches)


class CommitPoint:
    """Where a consumer restarts once a changeset is applied: ``offsets`` (per partition,
    the first message not yet part of a changeset handed out) and ``token`` (the
    position to resume with, formatted when first asked)."""

    __slots__ = ("_parts", "_token", "offsets")

    def __init__(self, offsets: dict[int, int], parts: dict[int, Changeset | Position]
                 ) -> None:
        self.offsets = offsets
        self._parts = parts
        self._token: str | None = None

    @property
    def token(self) -> str:
        if self._token is None:
            positions = (p if isinstance(p, Position) else p.position
                         for p in self._parts.values())
            self._token = str(Frontier.of(positions))
        return self._token


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
    raw_whole: bytes = b""  # its header's bytes (the key of KafkaLog._wholes)
    batches: list[EventBatch] = field(default_factory=list)  # large partition shares
    events: list[RawEvent] = field(default_factory=list)  # small ones, (batch, seq) order
    vouched: set[int] = field(default_factory=set)  # partitions whose marker verified it
    counted: int = 0


class KafkaLog:
    """Per-partition verification and the consistent cut over ``partitions`` partitions.

    ``encoding`` is ``"native"`` or ``"debezium"``. ``assembler`` does the cancel-out
    (a fresh ``Assembler()`` by default); its position says what is already applied.
    With ``bulk``, ``feed`` only stores what every partition vouched for and ``drain``
    verifies all of it in one pass (much faster for small intervals); otherwise ``feed``
    verifies each quiescent interval as it completes.
    """

    def __init__(self, partitions: int, *, encoding: str = "native",
                 assembler: Assembler | None = None, bulk: bool = False) -> None:
        if encoding not in ("native", "debezium"):
            raise ValueError(f"unknown Kafka encoding {encoding!r}; choose native or debezium")
        self.partitions = partitions
        self.encoding = encoding
        self.assembler = assembler or Assembler()
        self._defer = bulk
        self._failure: InconsistentLog | None = None
        self._lanes: list[dict[int, _Lane]] = [{} for _ in range(partitions)]
        self._next_offset: list[int | None] = [None] * partitions
        self._epochs: dict[tuple[int, int], _Epoch] = {}
        self._fed: dict[int, int] = {}  # domain -> last epoch fed to the assembler
        # What changesets handed out cover, per domain: batches before this id, epochs
        # up to this one (a message of either is settled: never needed again).
        self._applied_end: dict[int, int] = {}
        self._applied_seq: dict[int, int] = {}
        self._handed: dict[int, Changeset | Position] = {}  # domain -> last handed out
        # Per partition, every message kept and not yet known settled, in offset order:
        # (offset, domain, batch id or epoch, is a marker). The first one not settled is
        # where a restart must begin; settled ones are dropped from the front as the
        # position moves, so finding a restart point is O(1) amortised.
        self._open: list[deque[tuple[int, int, int, bool]]] = [
            deque() for _ in range(partitions)]
        self._first: dict[int, tuple[int, int]] = {}  # domain -> its first epoch's key
        # Baseline chunks read before their quiescence point was fed: (domain, epoch) ->
        # chunks, fed to the assembler right after that epoch (sinks.kafka._snapshots).
        self._chunks: dict[tuple[int, int], list[SnapshotChunk]] = {}
        # Every partition repeats an epoch's whole record: decode its bytes once.
        self._wholes: dict[bytes, EpochRecord] = {}
        # Events of epochs every partition vouched for, not yet given to the assembler:
        # small shares go over as one Arrow batch (building one per share costs more
        # than the share), always before the assembler verifies anything.
        self._ready_events: list[RawEvent] = []
        self.duplicates = 0
        # (changeset, where to restart once it is applied), in the order handed out;
        # a consumer pops them as the application takes the changesets. Bounded: a
        # consumer that never commits keeps only the latest.
        self.commit_points: deque[tuple[Changeset, CommitPoint]] = deque(maxlen=_MAX_POINTS)
        for position in self.assembler.position:
            self._fed[position.domain_id] = position.epoch_seq
            self._applied_end[position.domain_id] = position.end_id
            self._applied_seq[position.domain_id] = position.epoch_seq
            self._handed[position.domain_id] = position

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
        if self._failure is not None:
            raise self._failure
        self._next_offset[partition] = offset + 1
        if value is not None and value.startswith(EVENT_MAGIC):
            try:
                event = decode_event(value)
            except CodecError as exc:
                raise InconsistentLog(f"partition {partition} offset {offset} holds a corrupt "
                                      f"event message: {exc}") from exc
            self._event(partition, offset, event)
            return []
        marker = _marker_headers(headers, self._wholes)
        if marker is not None:
            return self._marker(partition, offset, *marker)
        chunk = _snapshot_chunk(partition, offset, value, headers, self.encoding)
        if chunk is not None:
            return self._snapshot(partition, offset, chunk)
        if headers and any(name == HEADER_READ for name, _raw in headers):
            return []  # a baseline cell as op "r" for plain Debezium readers: the chunk has it
        if self.encoding == "debezium" and value is not None:
            try:
                change = decode_debezium_event(value)
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
        lane = self._lanes[partition].get(domain) or self._lane(partition, domain)
        if lane.verified_end is not None and id_lt(event.batch_id, lane.verified_end):
            self.duplicates += 1  # a copy of an event this partition already vouched for
            return
        known = lane.pending.add(event)
        if known is None:
            self._open[partition].append((offset, domain, event.batch_id, False))
        else:
            if known != event:
                raise InconsistentLog(
                    f"partition {partition} holds two different events with identity "
                    f"(batch {event.batch_id:#x}, seq {event.seq})", domain_id=domain)
            self.duplicates += 1
            return

    def _marker(self, partition: int, offset: int, part: EpochRecord, whole: EpochRecord,
                raw_whole: bytes) -> list[Changeset]:
        domain, seq = whole.domain_id, whole.epoch_seq
        if (part.domain_id, part.epoch_seq, part.begin_id, part.end_id, part.quiescent) != (
                domain, seq, whole.begin_id, whole.end_id, whole.quiescent) \
                or part.stream != partition:
            raise InconsistentLog(f"partition {partition} offset {offset}: an epoch marker "
                                  f"for stream {part.stream} does not match its epoch",
                                  domain_id=domain, epoch_seq=seq)
        lane = self._lane(partition, domain)
        covered = lane.pending.take_before(whole.end_id)
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
            epoch = self._epochs[(domain, seq)] = _Epoch(whole, raw_whole)
            if whole.begin_id == 0:  # the domain's first epoch: where feeding starts
                self._first.setdefault(domain, (domain, seq))
        elif epoch.whole != whole:
            raise InconsistentLog(f"partitions disagree on the record of epoch {seq}: "
                                  f"{epoch.whole} and {whole}", domain_id=domain, epoch_seq=seq)
        if isinstance(checked, EventBatch):
            epoch.batches.append(checked)
        elif checked:
            epoch.events += checked
        epoch.counted += part.event_count
        epoch.vouched.add(partition)
        self._open[partition].append((offset, domain, seq, True))
        return self._feed_complete(domain)

    def _snapshot(self, partition: int, offset: int, chunk: SnapshotChunk) -> list[Changeset]:
        """A baseline chunk: fed to the assembler right after its quiescence point, as
        a wal3 log orders it (now if that point was fed, else once it is)."""
        domain, seq = chunk.domain_id, chunk.epoch_seq
        fed = self._fed.get(domain)
        before_first = chunk.end_id == 0  # read before the domain's first quiescence point
        if fed is not None and (before_first or seq < fed):
            self.duplicates += 1  # its quiescence point is behind what was applied
            return []
        # Open until a changeset after its point is handed out (its differences go there).
        self._open[partition].append((offset, domain, seq + 1, True))
        if (fed is None and before_first) or seq == fed:
            self._flush_events()
            changesets = self.assembler.feed(chunk, defer=self._defer)
            self._hand_out(changesets)
            return changesets
        self._chunks.setdefault((domain, seq), []).append(chunk)
        return []

    def _feed_complete(self, domain: int) -> list[Changeset]:
        out: list[Changeset] = []
        while True:
            seq = self._fed.get(domain)
            key = (domain, seq + 1) if seq is not None else self._first.get(domain)
            epoch = self._epochs.get(key) if key is not None else None
            if epoch is None or len(epoch.vouched) < self.partitions:
                return out
            del self._epochs[key]  # type: ignore[arg-type]
            whole = epoch.whole
            if epoch.counted != whole.event_count:
                raise InconsistentLog(
                    f"the partitions hold {epoch.counted} events of this epoch, its record "
                    f"says {whole.event_count}", domain_id=domain, epoch_seq=whole.epoch_seq)
            self._fed[domain] = whole.epoch_seq
            self._wholes.pop(epoch.raw_whole, None)
            for batch in epoch.batches:
                self.assembler.feed(batch)
            self._ready_events += epoch.events
            chunks = self._chunks.pop((domain, whole.epoch_seq), ())
            if not self._defer or chunks:
                self._flush_events()  # the assembler verifies now: it needs the events
            changesets = self.assembler.feed(whole, defer=self._defer)
            for chunk in chunks:
                changesets += self.assembler.feed(chunk, defer=self._defer)
            self._hand_out(changesets)
            out.extend(changesets)

    def drain(self) -> list[Changeset]:
        """Verify the epochs fed with ``defer`` (all intervals complete, in one pass) and
        return their changesets. If one is at fault, those before it are returned and
        the next call raises its ``InconsistentLog``."""
        if self._failure is not None:
            raise self._failure
        self._flush_events()
        changesets = self.assembler.drain()
        self._hand_out(changesets)
        self._failure = self.assembler._failure  # met after good ones: raised next time
        self.assembler._failure = None
        return changesets

    def _flush_events(self) -> None:
        """Give the assembler the small shares' events waiting, as one batch."""
        if self._ready_events:
            events, self._ready_events = self._ready_events, []
            self.assembler.feed(raw_events_batch(events))

    def _hand_out(self, changesets: list[Changeset]) -> None:
        """Record, for each changeset handed out, where a restart after it begins."""
        for changeset in changesets:
            domain = changeset.domain_id
            self._applied_seq[domain] = changeset.epoch_seq
            self._applied_end[domain] = changeset._end_id()
            self._handed[domain] = changeset
            self.commit_points.append(
                (changeset, CommitPoint(self.commit_offsets(), dict(self._handed))))

    # -- restart points ---------------------------------------------------------------------

    def read_offsets(self) -> dict[int, int]:
        """Per partition, the offset after the last message fed (or the seek offset)."""
        return {p: o for p, o in enumerate(self._next_offset) if o is not None}

    def commit_offsets(self) -> dict[int, int]:
        """Per partition, the offset a restarted consumer must read from: the first
        message not yet part of a changeset handed out (else the next one to read)."""
        out = {}
        applied_end, applied_seq = self._applied_end, self._applied_seq
        for partition, open_messages in enumerate(self._open):
            while open_messages:
                _offset, domain, key, marker = open_messages[0]
                if marker:
                    if key > applied_seq.get(domain, 0):
                        break
                else:
                    end = applied_end.get(domain)
                    # settled if its batch id is before the applied end, on the id ring
                    if end is None or not 0 < (end - key) % _RING < _HALF_RING:
                        break
                open_messages.popleft()
            if open_messages:
                out[partition] = open_messages[0][0]
            elif (next_offset := self._next_offset[partition]) is not None:
                out[partition] = next_offset
        return out

    # -- memory while partitions are skewed ---------------------------------------------------

    def waiting_epochs(self) -> int:
        """Epochs some partitions vouched for, waiting for the others."""
        return len(self._epochs)

    def ahead(self) -> list[int]:
        """Partitions that vouched for the oldest waiting epoch of a domain: reading more
        of them only grows what waits; the others hold the cut back."""
        behind: set[int] = set()
        for domain, seq in self._fed.items():
            epoch = self._epochs.get((domain, seq + 1))
            if epoch is not None:
                behind |= set(range(self.partitions)) - epoch.vouched
        for domain, key in self._first.items():
            if domain not in self._fed and (epoch := self._epochs.get(key)) is not None:
                behind |= set(range(self.partitions)) - epoch.vouched
        if not behind:
            return []
        return [p for p in range(self.partitions) if p not in behind]


def _marker_headers(headers: Sequence[tuple[str, bytes | None]] | None,
                    wholes: dict[bytes, EpochRecord]
                    ) -> tuple[EpochRecord, EpochRecord, bytes] | None:
    """The marker's partition record, whole record and the whole record's bytes
    (``wholes``: those already decoded, by their bytes; a new one is added)."""
    if not headers:
        return None
    found = {name: raw for name, raw in headers if name in _HEADERS and raw is not None}
    if len(found) != 2:
        return None
    raw_whole = bytes(found[HEADER_WHOLE])
    try:
        part = decode(found[HEADER_PARTITION])
        whole: object = wholes.get(raw_whole)
        if whole is None:
            whole = decode(raw_whole)
            if isinstance(whole, EpochRecord):
                if len(wholes) >= _MAX_WHOLES:
                    wholes.clear()  # epochs never completed here (copies): start again
                wholes[raw_whole] = whole
    except CodecError as exc:
        raise InconsistentLog(f"a corrupt epoch marker: {exc}") from exc
    if not isinstance(part, EpochRecord) or not isinstance(whole, EpochRecord):
        raise InconsistentLog("an epoch marker header holds events, not an epoch record")
    return part, whole, raw_whole


def _snapshot_chunk(partition: int, offset: int, value: bytes | None,
                    headers: Sequence[tuple[str, bytes | None]] | None, encoding: str
                    ) -> SnapshotChunk | None:
    """The baseline chunk a message carries (``sinks.kafka._snapshots``), else None."""
    raw = next((r for name, r in headers or () if name == HEADER_SNAPSHOT and r is not None),
               None)
    if raw is None and encoding == "native" and value is not None and value[:3] == MAGIC:
        raw = value
    if raw is None:
        return None
    try:
        record = decode(raw)
    except CodecError as exc:
        raise InconsistentLog(f"partition {partition} offset {offset} holds a corrupt "
                              f"snapshot message: {exc}") from exc
    if not isinstance(record, SnapshotChunk):
        raise InconsistentLog(f"partition {partition} offset {offset} holds a "
                              f"{type(record).__name__} where a snapshot chunk or epoch "
                              "marker belongs")
    return record


def _check_partition(partition: int, part: EpochRecord, events: list[RawEvent]
                     ) -> EventBatch | list[RawEvent]:
    """The partition's events of an epoch against the partition's marker (step 2); returns
    them in (batch, seq) order: as one batch, or as they are when there are few."""
    where = {"domain_id": part.domain_id, "epoch_seq": part.epoch_seq}
    if len(events) != part.event_count:
        raise InconsistentLog(
            f"partition {partition} holds {len(events)} events of this epoch before its "
            f"marker, the marker says {part.event_count}: "
            + ("events were lost" if len(events) < part.event_count else "foreign events"),
            **where)
    if not events:  # the usual share of a small epoch: no counting, no hashing
        if part.table_counts:
            raise InconsistentLog(
                f"partition {partition}: per-table counts {{}} differ from the "
                f"marker's {dict(part.table_counts)}", **where)
        if part.setsum not in _EMPTY_SETSUMS:
            raise InconsistentLog(
                f"partition {partition}: it holds no events of this epoch, but the marker's "
                f"setsum is {part.setsum} (the marker was altered)", **where)
        return events
    tables = Counter(e.table for e in events)
    if dict(tables) != dict(part.table_counts):
        raise InconsistentLog(
            f"partition {partition}: per-table counts {dict(tables)} differ from the "
            f"marker's {dict(part.table_counts)}", **where)
    events.sort(key=_batch_and_seq)
    checked: EventBatch | list[RawEvent]
    if len(events) <= _SMALL_SHARE:
        checked = events
        actual = Setsum.of_digests(row_segment_digests(events))
    else:
        checked = raw_events_batch(events)
        actual = Setsum.of_digests([digest for _d, _b, digest in segment_digests(checked.data)])
    if (actual.hexdigest() if actual else "") != part.setsum:
        raise InconsistentLog(
            f"partition {partition}: setsum of its events of this epoch is "
            f"{actual.hexdigest()}, the marker says {part.setsum or 'zero'} (an event was "
            "altered or lost)", **where)
    return checked


def _batch_and_seq(event: RawEvent) -> tuple[int, int]:
    return event.batch_id, event.seq
