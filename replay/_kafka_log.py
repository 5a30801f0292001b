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

import bisect
import heapq
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from replay._assembler import Assembler, Changeset
from replay._commit_points import CommitPoint, CommitPoints
from replay._errors import InconsistentLog
from replay._kafka_poll import Entry, apply_plan, plan_poll
from replay._kafka_shares import check_shares
from replay._position import Frontier, Position
from sequencer import EpochRecord
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
    encode_native_event,
    encode_value,
    native_event_head,
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
        self._batches: dict[int, dict[int, bytes]] = {}  # batch -> seq -> message value
        self._heap: list[int] = []
        self.events = 0

    def _rel(self, batch_id: int) -> int:
        if self._base is None:
            self._base = (batch_id - (1 << 63)) % _RING
        return (batch_id - self._base) % _RING

    def add(self, batch_id: int, seq: int, value: bytes) -> bytes | None:
        """Keep the event message ``value``; return the one already kept with its
        identity ``(batch_id, seq)``, if any."""
        batch = self._batches.get(batch_id)
        if batch is None:
            batch = self._batches[batch_id] = {}
            heapq.heappush(self._heap, self._rel(batch_id))
        known = batch.get(seq)
        if known is None:
            batch[seq] = value
            self.events += 1
        return known

    def take_before(self, end_id: int) -> list[bytes]:
        """Remove and return every event message of a batch before ``end_id``."""
        out: list[bytes] = []
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

    def take_runs(self, ends: list[int]) -> dict[int, list[bytes]]:
        """``take_before`` for consecutive epochs at once: ``ends`` are their end ids
        relative to the ring base (increasing); returns the event messages of each epoch
        that has any, by its index in ``ends`` (no list for an empty share: with small
        write batches most are, and every object made here lives through the poll)."""
        out: dict[int, list[bytes]] = {}
        heap, batches, base = self._heap, self._batches, self._base
        if not heap:
            return out
        assert base is not None
        limit, taken = ends[-1], 0
        while heap and heap[0] < limit:
            rel = heapq.heappop(heap)
            values = batches.pop((rel + base) % _RING).values()
            at = bisect.bisect_right(ends, rel)
            if at in out:
                out[at].extend(values)
            else:
                out[at] = list(values)
            taken += len(values)
        self.events -= taken
        return out

    def __len__(self) -> int:
        return len(self._batches)


@dataclass
class _Lane:
    """One domain in one partition."""

    next_epoch: int | None = None  # the epoch the next marker must be (None: not known yet)
    verified_end: int | None = None  # events of batches before this id were verified here
    pending: _PendingBatches = field(default_factory=lambda: _PendingBatches())


class _Epoch:
    """One epoch of one domain, as the partitions vouch for it (a plain slotted class:
    one is made per epoch, a dataclass's default factories cost more than the rest).

    It holds no container until it needs one (the usual epoch of a small write batch
    needs none): every object that outlives a few polls while partitions are skewed is
    one the garbage collector's full passes walk, and those passes, not the Python
    work, were most of the consumer's time with write batches of 1."""

    __slots__ = ("batches", "counted", "events", "raw_whole", "shares", "vouched", "whole")

    def __init__(self, whole: EpochRecord, raw_whole: bytes = b"") -> None:
        self.whole = whole
        self.raw_whole = raw_whole  # its header's bytes (the key of KafkaLog._wholes)
        self.batches: Sequence[EventBatch] = ()  # large partition shares (streaming)
        self.events: Sequence[RawEvent] = ()  # small ones, (batch, seq) order (streaming)
        self.vouched = 0  # bit p set: partition p's marker verified it
        self.counted = 0
        # bulk: shares whose per-table counts and setsum are checked at drain, all at once
        self.shares: Sequence[tuple[int, EpochRecord, list[bytes]]] = ()

    def vouch(self, partition: int) -> int:
        """Note ``partition``'s marker; return how many partitions vouched so far."""
        self.vouched |= 1 << partition
        return self.vouched.bit_count()

    def vouched_by(self, partition: int) -> bool:
        return bool(self.vouched >> partition & 1)

    def add_share(self, share: tuple[int, EpochRecord, list[bytes]]) -> None:
        self.shares = [*self.shares, share]

    def add_checked(self, checked: EventBatch | list[RawEvent]) -> None:
        """A partition's share verified at its marker (streaming)."""
        if isinstance(checked, EventBatch):
            self.batches = [*self.batches, checked]
        elif checked:
            self.events = [*self.events, *checked]


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
        # bulk: epochs every partition vouched for (by count), in the order they became
        # complete, whose shares' per-table counts and setsums are checked together at
        # drain before any of them reaches the assembler.
        self._queued: list[_Epoch] = []
        self.duplicates = 0
        self._held = 0  # events of the epochs in _epochs (waiting for other partitions)
        # (changeset, where to restart once it is applied), in the order handed out;
        # a consumer pops them as the application takes the changesets. Bounded: a
        # consumer that never commits keeps only the latest.
        self.commit_points = CommitPoints()
        for position in self.assembler.position:
            self._fed[position.domain_id] = position.epoch_seq
            self._applied_end[position.domain_id] = position.end_id
            self._applied_seq[position.domain_id] = position.epoch_seq
            self._handed[position.domain_id] = position

    @property
    def position(self) -> Frontier:
        """The assembler's position: everything up to it was handed out as changesets."""
        return self.assembler.position

    @property
    def failure(self) -> InconsistentLog | None:
        """The fault ``drain`` met after the changesets it returned (raised from the next
        call); it comes before anything fed since."""
        return self._failure

    def seek(self, partition: int, offset: int) -> None:
        """Say where reading ``partition`` starts (the committed offset, or 0)."""
        self._next_offset[partition] = offset

    # -- intake -----------------------------------------------------------------------------

    def feed(self, partition: int, offset: int, key: bytes | None, value: bytes | None,
             headers: Sequence[tuple[str, bytes | None]] | None) -> list[Changeset]:
        """Take one message of ``partition`` (in the partition's order)."""
        if value is not None and value.startswith(EVENT_MAGIC):
            self.feed_event(partition, offset, value)
            return []
        if self._failure is not None:
            raise self._failure
        self._next_offset[partition] = offset + 1
        marker = _marker_headers(headers, self._wholes, partition)
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
            self._event(partition, offset, change.domain_id, change.batch_id, change.seq,
                        encode_native_event(RawEvent(
                            change.domain_id, change.batch_id, change.seq, change.table,
                            encode_key(change.row), change.column, encode_value(change.old),
                            encode_value(change.new))))
            return []
        raise InconsistentLog(f"partition {partition} offset {offset} holds a message that "
                              f"is not a cdc-agent {self.encoding} record "
                              f"(starts {bytes(value or b'')[:8]!r})")

    def feed_poll(self, entries: Sequence[Entry]) -> list[Changeset]:
        """Take a poll's messages, ``(partition, offset, key, value, headers)`` in the
        order read (an event message with ``headers`` None): as ``feed`` on each in
        turn, but with ``bulk`` the usual poll is planned as a whole, its markers
        handled as columns (``replay._kafka_poll``); anything irregular goes message
        by message, which names the fault where it is. A poll holding a partition's
        first marker (where its epoch sequence is worked out) goes message by message up
        to that marker, and the rest is planned."""
        if self._failure is not None:
            raise self._failure
        plan = plan_poll(self, entries)
        if plan is not None:
            apply_plan(self, plan)
            return []
        firsts = _first_markers(self, entries) if self._defer else []
        if not firsts:
            return self._feed_each(entries)
        # Each such marker alone, message by message; what lies between them, planned.
        out: list[Changeset] = []
        start = 0
        for first in [*firsts, len(entries)]:
            if start < first:
                between = entries[start:first]
                plan = plan_poll(self, between)
                if plan is None:
                    out += self._feed_each(between)
                else:
                    apply_plan(self, plan)
            out += self._feed_each(entries[first:first + 1])
            start = first + 1
        return out

    def _feed_each(self, entries: Sequence[Entry]) -> list[Changeset]:
        """``feed`` each of ``entries`` in turn."""
        out: list[Changeset] = []
        feed, feed_event = self.feed, self.feed_event
        for partition, offset, key, value, headers in entries:
            if headers is None and value is not None and value[:3] == EVENT_MAGIC:
                feed_event(partition, offset, value)
            else:
                out += feed(partition, offset, key, value, headers)
        return out

    def _lane(self, partition: int, domain_id: int) -> _Lane:
        lane = self._lanes[partition].get(domain_id)
        if lane is None:
            lane = self._lanes[partition][domain_id] = _Lane()
        return lane

    def feed_event(self, partition: int, offset: int, value: bytes) -> None:
        """Take one native event message of ``partition`` (``feed``'s hot path: the
        consumer calls it directly for values that start with the event magic). Only its
        head is read here; its names and values are decoded with its epoch's others."""
        if self._failure is not None:
            raise self._failure
        self._next_offset[partition] = offset + 1
        try:
            domain, batch_id, seq = native_event_head(value)
        except CodecError as exc:
            raise InconsistentLog(f"partition {partition} offset {offset} holds a corrupt "
                                  f"event message: {exc}") from exc
        self._event(partition, offset, domain, batch_id, seq, value)

    def _event(self, partition: int, offset: int, domain: int, batch_id: int, seq: int,
               value: bytes) -> None:
        applied_end = self._applied_end.get(domain)
        # id_lt inlined (batch_id before the end on the id ring): this runs per event
        if applied_end is not None and 0 < (applied_end - batch_id) % _RING < _HALF_RING:
            self.duplicates += 1  # a copy of an event already applied
            return
        lane = self._lanes[partition].get(domain) or self._lane(partition, domain)
        verified_end = lane.verified_end
        if verified_end is not None and 0 < (verified_end - batch_id) % _RING < _HALF_RING:
            self.duplicates += 1  # a copy of an event this partition already vouched for
            return
        known = lane.pending.add(batch_id, seq, value)
        if known is None:
            self._open[partition].append((offset, domain, batch_id, False))
        else:
            if known != value:
                raise InconsistentLog(
                    f"partition {partition} holds two different events with identity "
                    f"(batch {batch_id:#x}, seq {seq})", domain_id=domain)
            self.duplicates += 1
            return

    def _marker(self, partition: int, offset: int, part: EpochRecord | None,
                whole: EpochRecord, raw_whole: bytes) -> list[Changeset]:
        """A partition's marker; ``part`` None: its record is the empty share of
        ``whole`` for this partition (``_marker_headers`` checked its bytes)."""
        domain, seq = whole.domain_id, whole.epoch_seq
        if part is not None and ((part.domain_id, part.epoch_seq, part.begin_id, part.end_id,
                                  part.quiescent) != (domain, seq, whole.begin_id,
                                                      whole.end_id, whole.quiescent)
                                 or part.stream != partition):
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
        checked: EventBatch | list[RawEvent] = []
        share: list[bytes] = []  # bulk: checked at drain, with every other share
        if part is None:
            _check_empty_share(partition, whole, covered)
        elif self._defer and covered:
            share = _check_share_count(partition, part, covered)
        else:
            checked = _check_partition(partition, part, _decoded(partition, part, covered))
        lane.next_epoch = seq + 1
        lane.verified_end = whole.end_id
        # Step 3: collect the epoch; feed the assembler once every partition vouched for it.
        epoch = self._epochs.get((domain, seq))
        if epoch is None:
            epoch = self._epochs[(domain, seq)] = _Epoch(whole, raw_whole)
            if whole.begin_id == 0:  # the domain's first epoch: where feeding starts
                self._first.setdefault(domain, (domain, seq))
        elif epoch.raw_whole != raw_whole and epoch.whole != whole:  # bytes first: cheap
            raise InconsistentLog(f"partitions disagree on the record of epoch {seq}: "
                                  f"{epoch.whole} and {whole}", domain_id=domain, epoch_seq=seq)
        epoch.add_checked(checked)
        if share:
            assert part is not None
            epoch.add_share((partition, part, share))
        if part is not None:
            epoch.counted += part.event_count
            self._held += part.event_count
        self._open[partition].append((offset, domain, seq, True))
        if epoch.vouch(partition) < self.partitions:
            return []  # feeding can only move on when an epoch completes
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
            self._release()
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
            if epoch is None or epoch.vouched.bit_count() < self.partitions:
                return out
            del self._epochs[key]  # type: ignore[arg-type]
            self._held -= epoch.counted
            whole = epoch.whole
            if epoch.counted != whole.event_count:
                raise InconsistentLog(
                    f"the partitions hold {epoch.counted} events of this epoch, its record "
                    f"says {whole.event_count}", domain_id=domain, epoch_seq=whole.epoch_seq)
            self._fed[domain] = whole.epoch_seq
            self._wholes.pop(epoch.raw_whole, None)
            chunks = self._chunks.pop((domain, whole.epoch_seq), ())
            if self._defer and not chunks:
                self._queued.append(epoch)  # its shares are checked at drain, in bulk
                continue
            self._release()
            for batch in epoch.batches:
                self.assembler.feed(batch)
            self._ready_events += epoch.events
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
        try:
            self._release()
        except InconsistentLog as exc:
            fault: InconsistentLog | None = exc  # the epochs before it were fed
        else:
            fault = None
        self._flush_events()
        changesets = self.assembler.drain()
        self._hand_out(changesets)
        # Met after good ones: raised next time. The assembler only holds epochs before
        # a share's fault, so its own fault comes first.
        self._failure = self.assembler._failure or fault
        self.assembler._failure = None
        return changesets

    def _release(self) -> None:
        """Check the shares of the queued epochs (bulk: per-table counts and setsums of
        every partition's share, in one vectorised pass), then feed the assembler, in
        order, every epoch before the first that fails; raise that one's fault."""
        if not self._queued:
            return
        queued, self._queued = self._queued, []
        shares = [share for epoch in queued for share in epoch.shares]
        checked = check_shares(shares)
        fault_at = len(queued)
        if checked.fault is not None:
            bad = shares[checked.fault]
            fault_at = next(i for i, epoch in enumerate(queued) if any(
                share is bad for share in epoch.shares))
        good = sum(len(epoch.shares) for epoch in queued[:fault_at])
        if checked.batch is not None and good:
            self.assembler.feed(checked.first(good))
        for epoch in queued[:fault_at]:
            for batch in epoch.batches:
                self.assembler.feed(batch)
            self._ready_events += epoch.events
        # Their whole records in one step (a run of them is kept as columns).
        self.assembler._store_deferred([epoch.whole for epoch in queued[:fault_at]])
        if checked.error is not None:
            raise checked.error

    def _flush_events(self) -> None:
        """Give the assembler the small shares' events waiting, as one batch."""
        if self._ready_events:
            events, self._ready_events = self._ready_events, []
            self.assembler.feed(raw_events_batch(events))

    def _hand_out(self, changesets: list[Changeset]) -> None:
        """Record, for each changeset handed out, where a restart after it begins.

        The last of a run gets its exact restart offsets; the others share those of
        the changeset before the run (earlier offsets: a restart from them re-reads a
        little and drops what its position token says was applied, it skips nothing),
        so the offsets are worked out once per run, not once per changeset, and the run
        is kept as one entry (``replay._commit_points``)."""
        if not changesets:
            return
        before = self.commit_offsets() if len(changesets) > 1 else {}
        handed = dict(self._handed)
        applied_seq, applied_end, now = self._applied_seq, self._applied_end, self._handed
        for changeset in changesets:
            domain = changeset.domain_id
            applied_seq[domain] = changeset.epoch_seq
            applied_end[domain] = changeset._end_id()
            now[domain] = changeset
        self.commit_points.add_run(changesets, before, self.commit_offsets(), handed)

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

    def waiting_events(self) -> int:
        """Events of those epochs that the partitions which vouched hold."""
        return self._held

    def ahead(self) -> list[int]:
        """Partitions that vouched for the oldest waiting epoch of a domain: reading more
        of them only grows what waits; the others hold the cut back."""
        behind: set[int] = set()
        for domain, seq in self._fed.items():
            epoch = self._epochs.get((domain, seq + 1))
            if epoch is not None:
                behind.update(p for p in range(self.partitions) if not epoch.vouched_by(p))
        for domain, key in self._first.items():
            if domain not in self._fed and (epoch := self._epochs.get(key)) is not None:
                behind.update(p for p in range(self.partitions) if not epoch.vouched_by(p))
        if not behind:
            return []
        return [p for p in range(self.partitions) if p not in behind]


def _first_markers(log: KafkaLog, entries: Sequence[Entry]) -> list[int]:
    """Where ``entries`` hold the first marker of a partition that has no epoch sequence
    yet (worked out message by message, at that marker), in order."""
    lanes = log._lanes
    waiting = {p for p in range(log.partitions)
               if not any(lane.next_epoch is not None for lane in lanes[p].values())}
    out: list[int] = []
    if waiting:
        for i, (partition, _offset, _key, _value, headers) in enumerate(entries):
            if headers is not None and partition in waiting:
                waiting.discard(partition)
                out.append(i)
                if not waiting:
                    break
    return out


def _marker_headers(headers: Sequence[tuple[str, bytes | None]] | None,
                    wholes: dict[bytes, EpochRecord], partition: int
                    ) -> tuple[EpochRecord | None, EpochRecord, bytes] | None:
    """The marker's partition record (None: the empty share of the whole record for
    ``partition``, recognised by its bytes without decoding), whole record and the whole
    record's bytes (``wholes``: those already decoded, by their bytes; a new one is
    added)."""
    if not headers:
        return None
    if (len(headers) == 2 and headers[0][0] == HEADER_PARTITION
            and headers[1][0] == HEADER_WHOLE):  # as the sink writes them
        raw_part, raw_whole = headers[0][1], headers[1][1]
        if raw_part is None or raw_whole is None:
            return None
    else:
        found = {name: raw for name, raw in headers if name in _HEADERS and raw is not None}
        if len(found) != 2:
            return None
        raw_part, raw_whole = found[HEADER_PARTITION], found[HEADER_WHOLE]
    raw_whole = bytes(raw_whole)
    try:
        whole: object = wholes.get(raw_whole)
        if whole is None:
            whole = decode(raw_whole)
            if isinstance(whole, EpochRecord):
                if len(wholes) >= _MAX_WHOLES:
                    wholes.clear()  # epochs never completed here (copies): start again
                wholes[raw_whole] = whole
        part: object = None
        if not _is_empty_share(raw_part, raw_whole, partition):
            part = decode(raw_part)
    except CodecError as exc:
        raise InconsistentLog(f"a corrupt epoch marker: {exc}") from exc
    if not isinstance(whole, EpochRecord) or not (part is None or isinstance(part, EpochRecord)):
        raise InconsistentLog("an epoch marker header holds events, not an epoch record")
    return part, whole, raw_whole


# An EPOCH message (sinks.codec): magic, version and kind (5 bytes), domain, epoch, begin
# and end (8 each); then count u64, flags u8, stream u32, setsum 32 bytes, n_tables u16.
_EPOCH_IDS_END: Final = 37
_EPOCH_FLAGS_AT: Final = 45
_EMPTY_SHARE_SIZE: Final = 84
_EMPTY_TAILS: dict[tuple[int, int], bytes] = {}


def _is_empty_share(raw_part: bytes, raw_whole: bytes, partition: int) -> bool:
    """Whether ``raw_part`` is exactly the EPOCH message of ``partition``'s empty share of
    the whole record ``raw_whole`` (same version and ids, count 0, stream set, zero
    setsum, no table): the usual marker of a small epoch, checked without decoding."""
    if (len(raw_part) != _EMPTY_SHARE_SIZE or len(raw_whole) <= _EPOCH_FLAGS_AT
            or raw_part[:_EPOCH_IDS_END] != raw_whole[:_EPOCH_IDS_END]):
        return False
    flags = (raw_whole[_EPOCH_FLAGS_AT] & 1) | 2
    tail = _EMPTY_TAILS.get((flags, partition))
    if tail is None:
        tail = _EMPTY_TAILS[(flags, partition)] = (
            bytes(8) + bytes((flags,)) + partition.to_bytes(4, "big") + bytes(34))
    return raw_part[_EPOCH_IDS_END:] == tail


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


def _decoded(partition: int, part: EpochRecord, values: list[bytes]) -> list[RawEvent]:
    """A share's event messages decoded (their heads were checked when they came)."""
    try:
        return [decode_event(value) for value in values]
    except CodecError as exc:
        raise InconsistentLog(f"partition {partition} holds a corrupt event message of this "
                              f"epoch: {exc}", domain_id=part.domain_id,
                              epoch_seq=part.epoch_seq) from exc


def _check_share_count(partition: int, part: EpochRecord, events: list[bytes]
                       ) -> list[bytes]:
    """Step 2's count only (bulk: per-table counts and setsums are checked at drain by
    ``check_shares``, for many shares at once)."""
    if len(events) != part.event_count:
        raise InconsistentLog(
            f"partition {partition} holds {len(events)} events of this epoch before its "
            f"marker, the marker says {part.event_count}: "
            + ("events were lost" if len(events) < part.event_count else "foreign events"),
            domain_id=part.domain_id, epoch_seq=part.epoch_seq)
    return events


def _check_empty_share(partition: int, whole: EpochRecord, events: list[bytes]) -> None:
    """A partition whose marker says it holds no event of the epoch (step 2)."""
    if events:
        raise InconsistentLog(
            f"partition {partition} holds {len(events)} events of this epoch before its "
            "marker, the marker says 0: foreign events", domain_id=whole.domain_id,
            epoch_seq=whole.epoch_seq)


def _batch_and_seq(event: RawEvent) -> tuple[int, int]:
    return event.batch_id, event.seq
