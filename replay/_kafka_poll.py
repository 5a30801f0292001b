"""A whole poll of a native topic fed to ``KafkaLog`` at once: markers as columns.

With small write batches most messages are epoch markers (every epoch record goes to
every partition), and handling each one on its own (decoding it, checking the
partition's sequence and count, collecting the epoch) cost 10 to 15 us of Python. Here
a poll's messages are planned together: the event heads read, the markers' partition
records compared with their whole records' bytes as one numpy array (the usual marker
is its epoch's empty share), each partition's epochs checked to follow one another and
its events assigned to its markers by one ``searchsorted`` over the epochs' ends.

Planning changes nothing in the log (beyond caching decoded records), so giving up
half way costs nothing. It only covers the regular case, where every check that feeding
the messages one at a time (``KafkaLog.feed`` in order) would make passes and the end
state is the same (a property test compares both on clean and damaged logs): one
domain, native events and markers as the sink writes them, every partition's epoch
sequence known and followed, no duplicate, no event a marker before it already covers,
every count right. Anything else (a first
marker, damage, a copy, a baseline chunk) makes ``plan_poll`` return None and the
caller feeds the poll message by message, which names the fault exactly. Per-table
counts and setsums are checked at ``drain`` either way (``replay._kafka_shares``).
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from replay._errors import InconsistentLog
from sequencer import EpochRecord
from sinks.codec import (
    HEADER_PARTITION,
    HEADER_WHOLE,
    KIND_EPOCH,
    MAGIC,
    READABLE_VERSIONS,
    CodecError,
    decode,
    native_event_head,
)
from sinks.codec import NATIVE_MAGIC as EVENT_MAGIC

if TYPE_CHECKING:
    from replay._kafka_log import KafkaLog

__all__ = ["Entry", "PollPlan", "apply_plan", "decode_epoch_messages", "plan_poll"]

# A message as the consumer hands it over: (partition, offset, key, value, headers);
# an event message has headers None.
Entry = tuple[int, int, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]] | None]

_RING: Final = 1 << 64
# Below this share of markers in a poll (large write batches) planning costs more than
# feeding message by message (measured: batches of 100, 6% markers, 12% slower planned;
# batches of 10, 37% markers, a little faster).
MIN_MARKER_SHARE = 0.25
_FIRST, _SECOND, _THIRD = map(operator.itemgetter, (0, 1, 2))
_HALF: Final = np.uint64(1 << 63)
# An EPOCH message (sinks.codec): magic, version, kind (5 bytes), domain, epoch, begin,
# end (8 each), count u64, flags u8, stream u32, setsum 32 bytes, n_tables u16.
_IDS_END: Final = 37
_FLAGS_AT: Final = 45
_HEAD_SIZE: Final = 84  # an empty share's whole message
_EMPTY_SETSUMS: Final = ("", "0" * 64)


@dataclass(slots=True)
class _LanePlan:
    """One partition's markers in the poll (one domain), in offset order."""

    partition: int
    markers: list[int]  # indexes into PollPlan.markers
    ends: list[int]  # the markers' epoch ends, relative to the lane's ring base
    base: int


@dataclass(slots=True)
class PollPlan:
    """What ``apply_plan`` does to the log: checked, nothing changed yet."""

    domain: int
    events: _Events
    partitions: list[int]  # per marker
    offsets: list[int]  # per marker
    wholes: list[EpochRecord]  # per marker
    raw_wholes: list[bytes]
    parts: list[EpochRecord | None]  # per marker; None: its epoch's empty share
    lanes: list[_LanePlan]
    last_offsets: dict[int, int]


def plan_poll(log: KafkaLog, entries: Sequence[Entry]) -> PollPlan | None:
    """The plan of feeding ``entries`` (one poll, in order), or None where only the
    message-at-a-time path can say what happens."""
    if log._chunks or not log._defer or log.encoding != "native":
        return None  # baseline chunks feed the assembler mid-poll; streaming mode verifies
    markers: list[Any] = [e for e in entries if e[4] is not None]
    if len(markers) < MIN_MARKER_SHARE * len(entries) or not markers:
        return None  # mostly events: planning costs more than it saves
    if any([v is not None and v[:3] == EVENT_MAGIC for _p, _o, _k, v, _h in markers]):
        return None  # an event with headers: feed() takes it as an event
    events_in: list[Any] = [e for e in entries if e[4] is None]
    try:
        heads = [native_event_head(e[3]) for e in events_in]
        # The markers' two headers, as the sink writes them (else: the slow path).
        raw_parts: list[Any] = [h[0][1] for _p, _o, _k, _v, h in markers
                                if len(h) == 2 and h[0][0] == HEADER_PARTITION
                                and h[1][0] == HEADER_WHOLE]
        raw_wholes: list[Any] = [h[1][1] for _p, _o, _k, _v, h in markers]
    except (CodecError, TypeError, IndexError):
        return None
    if len(raw_parts) != len(markers) or not all(
            [type(r) is bytes for r in raw_parts] + [type(r) is bytes for r in raw_wholes]):
        return None
    wholes = _wholes(log, raw_wholes)
    if wholes is None:
        return None
    domain = wholes[0].domain_id
    if any([w.domain_id != domain for w in wholes] + [h[0] != domain for h in heads]):
        return None
    partitions: list[int] = [m[0] for m in markers]
    if max(partitions + [e[0] for e in events_in]) >= log.partitions:
        return None
    parts = _parts(raw_parts, raw_wholes, wholes, partitions)
    if parts is None:
        return None
    events = _Events(events_in, heads)
    if not _events_ok(log, domain, events):
        return None
    fed = log._fed.get(domain)
    lanes = []
    for p in dict.fromkeys(partitions):
        mine = [i for i, q in enumerate(partitions) if q == p]
        theirs = np.flatnonzero(events.partition == p)
        lane = log._lanes[p].get(domain)
        if lane is None or lane.next_epoch is None:
            return None  # the partition's first marker: its expected epoch is worked out there
        seqs = [wholes[i].epoch_seq for i in mine]
        if seqs != list(range(lane.next_epoch, lane.next_epoch + len(seqs))):
            return None  # a gap, a copy or an applied epoch
        if fed is not None and seqs[0] <= fed:
            return None
        planned = _lane_plan(lane, p, mine, theirs, markers, wholes, parts, events)
        if planned is None:
            return None
        lanes.append(planned)
    if not _epochs_ok(log, domain, wholes, raw_wholes, parts):
        return None
    last = dict(zip(map(_FIRST, entries), map(_SECOND, entries), strict=True))
    return PollPlan(domain, events, partitions, [m[1] for m in markers], wholes, raw_wholes,
                    parts, lanes, last)


def _wholes(log: KafkaLog, raw_wholes: list[bytes]) -> list[EpochRecord] | None:
    """The markers' whole records, each distinct one decoded once (and kept)."""
    known = log._wholes
    new = [raw for raw in dict.fromkeys(raw_wholes) if raw not in known]
    if new:
        records = decode_epoch_messages(new)
        if records is None:
            return None
        if len(known) + len(new) > _MAX_WHOLES:
            known.clear()  # epochs never completed here (copies): start again
        known.update(zip(new, records, strict=True))
    try:
        return [known[raw] for raw in raw_wholes]
    except KeyError:  # more new ones in one poll than kept: let the slow path do it
        return None


_EPOCH_HEAD: Final = np.dtype([
    ("magic", "S3"), ("version", "u1"), ("kind", "u1"), ("domain", ">u8"), ("seq", ">u8"),
    ("begin", ">u8"), ("end", ">u8"), ("count", ">u8"), ("flags", "u1"), ("stream", ">u4"),
    ("setsum", "V32"), ("tables", ">u2")])
_MAX_WHOLES: Final = 1 << 16
# An EPOCH message's number of tables and tables (its bytes after the setsum), parsed.
_TABLES: dict[bytes, tuple[tuple[str, int], ...] | None] = {}


def decode_epoch_messages(raws: list[bytes]) -> list[EpochRecord] | None:
    """EPOCH messages (``sinks.codec``) decoded together: their fixed heads as one numpy
    array, each distinct list of per-table counts parsed once. The records
    ``sinks.codec.decode`` gives, or None if it would refuse any (or one is no EPOCH)."""
    n = len(raws)
    size = _EPOCH_HEAD.itemsize
    if min(map(len, raws)) < size:
        return None
    heads = np.frombuffer(b"".join([raw[:size] for raw in raws]), dtype=_EPOCH_HEAD)
    if not ((heads["magic"] == MAGIC).all() and (heads["kind"] == KIND_EPOCH).all()
            and np.isin(heads["version"], READABLE_VERSIONS).all()):
        return None
    tables: list[tuple[tuple[str, int], ...]] = [()] * n
    for i in np.flatnonzero(heads["tables"]).tolist():
        tail = raws[i][size - 2:]  # the number of tables, then the tables
        parsed = _TABLES.get(tail, ...)
        if parsed is ...:
            if len(_TABLES) >= 4096:
                _TABLES.clear()
            parsed = _TABLES[tail] = _table_counts(tail[2:], int(heads["tables"][i]))
        if parsed is None or len(parsed) != heads["tables"][i]:
            return None
        tables[i] = parsed
    if any([len(raw) != size for raw, t in zip(raws, tables, strict=True) if not t]):
        return None  # trailing bytes after a head without tables
    flags = heads["flags"].tolist()
    streams = heads["stream"].tolist()
    return [EpochRecord(domain, seq, begin, end, count, bool(flag & 1), table,
                        raw[_FLAGS_AT + 5:_FLAGS_AT + 37].hex(),
                        stream if flag & 2 else None)
            for domain, seq, begin, end, count, flag, stream, table, raw in zip(
                heads["domain"].tolist(), heads["seq"].tolist(), heads["begin"].tolist(),
                heads["end"].tolist(), heads["count"].tolist(), flags, streams, tables, raws,
                strict=True)]


def _table_counts(tail: bytes, count: int) -> tuple[tuple[str, int], ...] | None:
    """An EPOCH message's per-table counts (what follows its head), or None if they do
    not parse exactly (as ``sinks.codec`` reads them)."""
    out = []
    pos = 0
    try:
        for _ in range(count):
            length = int.from_bytes(tail[pos:pos + 2], "big")
            if pos + 2 + length + 8 > len(tail):
                return None
            name = tail[pos + 2:pos + 2 + length].decode()
            pos += 2 + length
            out.append((name, int.from_bytes(tail[pos:pos + 8], "big")))
            pos += 8
    except UnicodeDecodeError:
        return None
    return tuple(out) if pos == len(tail) else None


def _parts(raw_parts: list[bytes], raw_wholes: list[bytes], wholes: list[EpochRecord],
           partitions: list[int]) -> list[EpochRecord | None] | None:
    """Each marker's partition record: None where it is exactly its epoch's empty share
    for its partition (checked on all markers at once), else decoded and matched."""
    n = len(raw_parts)
    sizes = np.fromiter(map(len, raw_parts), dtype=np.int64, count=n)
    empty = np.zeros(n, dtype=bool)
    short = np.flatnonzero(sizes == _HEAD_SIZE)
    if len(short):
        part = np.frombuffer(b"".join([raw_parts[i] for i in short.tolist()]),
                             dtype=np.uint8).reshape(-1, _HEAD_SIZE)
        if min(map(len, raw_wholes)) < _FLAGS_AT + 1:
            return None
        whole = np.frombuffer(b"".join([raw_wholes[i][:_FLAGS_AT + 1]
                                        for i in short.tolist()]),
                              dtype=np.uint8).reshape(-1, _FLAGS_AT + 1)
        stream = np.array([partitions[i] for i in short.tolist()], dtype=">u4")
        ok = (part[:, :_IDS_END] == whole[:, :_IDS_END]).all(axis=1)
        ok &= ~part[:, _IDS_END:_FLAGS_AT].any(axis=1)  # count 0
        ok &= part[:, _FLAGS_AT] == ((whole[:, _FLAGS_AT] & 1) | 2)
        ok &= (part[:, _FLAGS_AT + 1:_FLAGS_AT + 5]
               == stream.view(np.uint8).reshape(-1, 4)).all(axis=1)
        ok &= ~part[:, _FLAGS_AT + 5:].any(axis=1)  # zero setsum, no table
        empty[short[ok]] = True
    out: list[EpochRecord | None] = [None] * n
    for i in np.flatnonzero(~empty).tolist():
        raw, whole_raw, whole_record = raw_parts[i], raw_wholes[i], wholes[i]
        if (len(raw) == len(whole_raw) and raw[_FLAGS_AT + 5:] == whole_raw[_FLAGS_AT + 5:]
                and raw[:_FLAGS_AT] == whole_raw[:_FLAGS_AT]
                and whole_raw[_FLAGS_AT] < 2 and raw[_FLAGS_AT] == whole_raw[_FLAGS_AT] | 2
                and raw[_FLAGS_AT + 1:_FLAGS_AT + 5] == partitions[i].to_bytes(4, "big")):
            # The whole epoch in this partition (the usual share of a small epoch): its
            # count, tables and setsum are the whole record's, no need to decode them.
            record: object = whole_record
        else:
            try:
                record = decode(raw)
            except CodecError:
                return None
            if isinstance(record, EpochRecord) and record.stream != partitions[i]:
                return None
        if not isinstance(record, EpochRecord) or (
                record.domain_id, record.epoch_seq, record.begin_id, record.end_id,
                record.quiescent) != (
                whole_record.domain_id, whole_record.epoch_seq, whole_record.begin_id,
                whole_record.end_id, whole_record.quiescent):
            return None
        if record.event_count == 0 and (record.table_counts
                                        or record.setsum not in _EMPTY_SETSUMS):
            return None
        out[i] = record
    return out


class _Events:
    """A poll's event messages as columns (their heads read)."""

    __slots__ = ("batch", "offset", "partition", "seq", "values")

    def __init__(self, entries: list[Any], heads: Sequence[tuple[int, ...]]) -> None:
        n = len(entries)
        self.values: list[bytes] = [e[3] for e in entries]
        self.partition = np.fromiter(map(_FIRST, entries), dtype=np.int64, count=n)
        self.offset = np.fromiter(map(_SECOND, entries), dtype=np.int64, count=n)
        self.batch = np.fromiter(map(_SECOND, heads), dtype=np.uint64, count=n)
        self.seq = np.fromiter(map(_THIRD, heads), dtype=np.int64, count=n)

    def __len__(self) -> int:
        return len(self.values)


def _events_ok(log: KafkaLog, domain: int, events: _Events) -> bool:
    """No event is a copy (of one applied, vouched for, waiting, or in this poll)."""
    if not len(events):
        return True
    order = np.lexsort((events.seq, events.batch, events.partition))
    same = ((np.diff(events.partition[order]) == 0) & (np.diff(events.batch[order]) == 0)
            & (np.diff(events.seq[order]) == 0))
    if same.any():
        return False
    applied_end = log._applied_end.get(domain)
    if applied_end is not None and _before(events.batch, applied_end).any():
        return False
    for p in np.unique(events.partition).tolist():
        lane = log._lanes[p].get(domain)
        if lane is None:
            continue
        mine = np.flatnonzero(events.partition == p)
        batches = events.batch[mine]
        if lane.verified_end is not None and _before(batches, lane.verified_end).any():
            return False
        held = lane.pending._batches
        if held:
            known = np.isin(batches, np.fromiter(held, dtype=np.uint64, count=len(held)))
            for j in mine[known].tolist():
                if int(events.seq[j]) in held[int(events.batch[j])]:
                    return False
    return True


def _before(ids: np.ndarray, end: int) -> np.ndarray:
    """Which ids come before ``end`` on the id ring (``sequencer.id_lt``, vectorised)."""
    gap = np.uint64(end) - ids  # wraps modulo 2^64, as the ring does
    return (gap > 0) & (gap < _HALF)


def _lane_plan(lane: object, partition: int, mine: list[int], theirs: np.ndarray,
               markers: list[Entry], wholes: list[EpochRecord],
               parts: list[EpochRecord | None], events: _Events) -> _LanePlan | None:
    """Check one partition's markers against its events: each marker covers exactly the
    events its count says, and no event of the poll comes after a marker covering it."""
    pending = lane.pending  # type: ignore[attr-defined]
    base = pending._base
    if base is None:  # set by the lane's first event, as _PendingBatches.add does
        first = int(events.batch[theirs[0]]) if len(theirs) else wholes[mine[0]].end_id
        base = (first - (1 << 63)) % _RING
    ends = [(wholes[i].end_id - base) % _RING for i in mine]
    if any(b <= a for a, b in itertools.pairwise(ends)):
        return None
    counts = [0] * (len(mine) + 1)
    for batch_id, held in pending._batches.items():
        counts[bisect.bisect_right(ends, (batch_id - base) % _RING)] += len(held)
    if len(theirs):
        rel = events.batch[theirs] - np.uint64(base)  # wraps, as on the ring
        covering = np.searchsorted(np.array(ends, dtype=np.uint64), rel, side="right")
        before = np.searchsorted(np.array([markers[i][1] for i in mine], dtype=np.int64),
                                 events.offset[theirs], side="left")
        if (covering < before).any():
            return None  # a marker before it already covers it: the slow path drops it
        counts = (np.array(counts, dtype=np.int64)
                  + np.bincount(covering, minlength=len(mine) + 1)).tolist()
    for k, i in enumerate(mine):
        part = parts[i]
        if counts[k] != (0 if part is None else part.event_count):
            return None
    return _LanePlan(partition, mine, ends, base)


def _epochs_ok(log: KafkaLog, domain: int, wholes: list[EpochRecord], raw_wholes: list[bytes],
               parts: list[EpochRecord | None]) -> bool:
    """Partitions agree on each epoch's record (the same bytes), and every epoch this
    poll completes holds its record's count of events."""
    markers = Counter(raw_wholes)  # markers per epoch (one whole record's bytes each)
    counted = dict.fromkeys(markers, 0)
    for raw, count in [(raw, part.event_count) for raw, part in zip(raw_wholes, parts,
                                                                     strict=True)
                       if part is not None]:
        counted[raw] += count
    record_of = dict(zip(raw_wholes, wholes, strict=True))
    seqs: set[int] = set()
    get = log._epochs.get
    for raw, vouched in markers.items():
        record = record_of[raw]
        seq = record.epoch_seq
        if seq in seqs:
            return False  # two records for one epoch: the slow path compares them
        seqs.add(seq)
        total = counted[raw]
        epoch = get((domain, seq))
        if epoch is not None:
            if epoch.raw_whole != raw:
                return False
            vouched += epoch.vouched.bit_count()
            total += epoch.counted
        if vouched >= log.partitions and total != record.event_count:
            return False
    return True


def apply_plan(log: KafkaLog, plan: PollPlan) -> None:
    """Do what ``plan`` says: the same state as feeding its messages one at a time."""
    from replay._kafka_log import _Epoch

    domain = plan.domain
    lanes = log._lanes
    for lp in plan.lanes:  # the ring base the plan's ends are relative to
        pending = lanes[lp.partition][domain].pending
        if pending._base is None:
            pending._base = lp.base
    opened: dict[int, list[tuple[int, int, int, bool]]] = {}
    events = plan.events
    for p, offset, value, batch_id, seq in zip(
            events.partition.tolist(), events.offset.tolist(), events.values,
            events.batch.tolist(), events.seq.tolist(), strict=True):
        lane = lanes[p].get(domain) or log._lane(p, domain)
        lane.pending.add(batch_id, seq, value)
        opened.setdefault(p, []).append((offset, domain, batch_id, False))
    shares: dict[int, list[bytes]] = {}  # marker -> its share's messages (if any)
    for lp in plan.lanes:
        lane = lanes[lp.partition][domain]
        for k, values in lane.pending.take_runs(lp.ends).items():
            shares[lp.markers[k]] = values
        last = plan.wholes[lp.markers[-1]]
        lane.next_epoch = last.epoch_seq + 1
        lane.verified_end = last.end_id
    epochs, get = log._epochs, log._epochs.get
    seqs = [whole.epoch_seq for whole in plan.wholes]
    held = 0
    for i, (p, whole, raw, part, seq) in enumerate(zip(
            plan.partitions, plan.wholes, plan.raw_wholes, plan.parts, seqs, strict=True)):
        key = (domain, seq)
        epoch = get(key)
        if epoch is None:
            epoch = epochs[key] = _Epoch(whole, raw)
            if whole.begin_id == 0:
                log._first.setdefault(domain, key)
        if part is not None:
            if i in shares:
                epoch.add_share((p, part, shares[i]))
            epoch.counted += part.event_count
            held += part.event_count
        epoch.vouched |= 1 << p
    log._held += held
    for p in dict.fromkeys(plan.partitions):
        opened.setdefault(p, []).extend([
            (offset, domain, seq, True) for offset, seq, q in zip(
                plan.offsets, seqs, plan.partitions, strict=True) if q == p])
    for p, entries in opened.items():
        entries.sort()
        log._open[p].extend(entries)
    for p, offset in plan.last_offsets.items():
        log._next_offset[p] = offset + 1
    if log._feed_complete(domain):  # pragma: no cover - bulk mode queues, returns nothing
        raise InconsistentLog("a planned poll handed out changesets before its drain")
