"""The assembler: cancel out events between quiescence points, verify, then apply.

Each event is a Z-set delta on its cell: +1 for ``new``, -1 for ``old``. Summed over a
quiescent interval (the epochs after one quiescence point up to the next), everything
cancels except ``+final -initial``, whatever order the events came in. So the
assembler needs no order among the events of an interval. For each interval it:

1. drops duplicated deliveries by event identity (a duplicate whose content differs
   is an error);
2. checks each cell: ``news - olds + {current state}`` must be exactly ``{final}``
   (the events chain from the state it holds to one final value), and where the
   chain returns to where it started, the state must be where it started;
3. checks each epoch's event count, per-table counts and setsum (``sinks.codec``);
4. only then applies the finals to its state and hands out a ``Changeset``.

Any failure raises ``InconsistentLog`` naming domain, epoch and cell, and applies
nothing of that interval. The work is vectorised over Arrow: one interval costs a few
sorts and group-bys plus one SHA3 call per segment, not a Python loop per event.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import operator
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replay._baseline import Baselines
from replay._bulk import BrokenChain, NetChanges, cancel_out, net_changes
from replay._epoch_columns import (
    EpochColumns,
    first_count_fault,
    first_setsum_fault,
    first_table_fault,
    first_tiling_fault,
)
from replay._errors import InconsistentLog
from replay._position import Frontier, Position
from replay._resume import StateDelta, apply_state
from sequencer import ABSENT, Absent, ChangeEvent, EpochRecord, RowKey, Value
from sinks import EpochRun, EventBatch, Setsum
from sinks.codec import (
    EVENT_SCHEMA,
    SnapshotChunk,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    segment_digests,
)

__all__ = ["Assembler", "Changeset", "Snapshot"]

Cell = tuple[str, RowKey, str]
_HALF: Final = np.uint64(1 << 63)
_SEEN_WINDOW: Final = 64  # epochs a position token's "seen" suffix covers at most
_BULK_EVENTS: Final = 1 << 16  # changesets() verifies this many events at once
_RECORDS_AS_COLUMNS: Final = 16  # epoch records met together: kept as columns from this many
_ONE = np.int64(1)
_ONE_U = np.uint64(1)


def _encode_cell(cell: Cell) -> bytes:
    table, row, column = cell
    return table.encode() + b"\x00" + column.encode() + b"\x00" + encode_key(row)


def _decode_cell(key: bytes) -> Cell:
    table, column, row = key.split(b"\x00", 2)
    return (table.decode(), decode_key(row), column.decode())


class Changeset:
    """What one quiescent interval changed: apply it and the state is a real one.

    ``changes`` maps each changed cell to its new value (``ABSENT``: removed);
    ``before`` maps the same cells to the value they had. ``position`` is the token
    to store with the applied state. Read-only; cells are decoded on first access (a
    run of intervals verified together shares one flat store of encoded cells, and
    one record of their quiescence points, counts and positions).
    """

    # A changeset is its run and its index in it (_RunChangeset: two slots, built for
    # each of a run's intervals); the position and the decoded cells are cached.
    __slots__ = ("_decoded", "_index", "_position", "_run")
    _decoded: tuple[dict[Cell, Value | Absent], dict[Cell, Value | Absent]]
    _position: Position
    _run: _Run | _One

    def __init__(self, domain_id: int, epoch_seq: int, event_count: int,
                 position: Position | _RunPositions, net: NetChanges, index: int) -> None:
        self._run = _One(domain_id, epoch_seq, event_count, position, net, index)
        self._index = index

    @property
    def domain_id(self) -> int:
        return self._run.domain_id

    @property
    def epoch_seq(self) -> int:
        """The quiescence point this changeset ends at."""
        return self._run.seqs[self._index]

    @property
    def event_count(self) -> int:
        """How many events (duplicates dropped) the interval held."""
        return self._run.counts[self._index]

    @property
    def position(self) -> Position:
        try:
            return self._position
        except AttributeError:
            position = self._position = self._run.position_at(self._index)
            return position

    @property
    def _net(self) -> NetChanges:
        return self._run.net

    def _end_id(self) -> int:
        """The position's end id, without building the position."""
        return self._run.end_id_at(self._index)

    def _slice(self, column: list[bytes]) -> list[bytes]:
        bounds = self._run.net.bounds
        return column[bounds[self._index]:bounds[self._index + 1]]

    @property
    def _changes(self) -> dict[bytes, bytes]:
        """Encoded cell -> encoded final value (``b""``: ABSENT)."""
        net = self._run.net
        return dict(zip(self._slice(net.keys), self._slice(net.finals), strict=True))

    @property
    def _before(self) -> dict[bytes, bytes]:
        net = self._run.net
        return dict(zip(self._slice(net.keys), self._slice(net.initials), strict=True))

    def _decode(self) -> tuple[dict[Cell, Value | Absent], dict[Cell, Value | Absent]]:
        try:
            return self._decoded
        except AttributeError:
            pass
        net = self._run.net
        cells = [_decode_cell(k) for k in self._slice(net.keys)]
        self._decoded = (
            dict(zip(cells, map(decode_value, self._slice(net.finals)), strict=True)),
            dict(zip(cells, map(decode_value, self._slice(net.initials)), strict=True)))
        return self._decoded

    @property
    def changes(self) -> dict[Cell, Value | Absent]:
        return self._decode()[0]

    @property
    def before(self) -> dict[Cell, Value | Absent]:
        return self._decode()[1]

    def __len__(self) -> int:
        bounds = self._run.net.bounds
        return bounds[self._index + 1] - bounds[self._index]

    def __repr__(self) -> str:
        return (f"Changeset(domain_id={self.domain_id}, epoch_seq={self.epoch_seq}, "
                f"event_count={self.event_count}, cells={len(self)}, "
                f"position={self.position})")


@dataclass(frozen=True)
class Snapshot:
    """The whole state at a quiescence point (``state``: a copy, ABSENT cells omitted)."""

    domain_id: int
    epoch_seq: int
    state: dict[Cell, Value]
    changeset: Changeset


@dataclass
class _TailRun:
    """Epoch records held as columns: seqs ``first`` to ``last``, consecutive; from
    EPOCHS messages (``runs``) and records that came one by one (``records``: a
    shipper's flush of one epoch comes so, between its runs), each list in seq order,
    the two interleaved. Their columns are read once, when first needed: the runs
    joined, the records in one pass, then put in seq order."""

    first: int
    last: int
    runs: list[EpochRun]
    cached: EpochColumns | None = None
    records: list[EpochRecord] = field(default_factory=list)

    @property
    def columns(self) -> EpochColumns:
        if self.cached is None:
            parts = [EpochColumns.of_run(self._run())] if self.runs else []
            if self.records:
                parts.append(EpochColumns.of_records(self.records))
            columns = EpochColumns.concat(parts)
            if len(parts) > 1:
                columns = columns.take(np.argsort(columns.seqs, kind="stable"))
            self.cached = columns
        return self.cached

    def _run(self) -> EpochRun:
        """The runs as one."""
        if len(self.runs) > 1:
            self.runs = [EpochRun(pa.concat_batches([run.data for run in self.runs]))]
        return self.runs[0]

    def extend(self, run: EpochRun, last: int) -> bool:
        """Take ``run`` (seqs ``last + 1`` on) into this piece, if its layout is the
        one of the runs held."""
        if self.runs and run.data.schema != self.runs[-1].data.schema:
            return False
        self.runs.append(run)
        self.last, self.cached = last, None
        return True

    def append(self, record: EpochRecord) -> None:
        """Take ``record`` (seq ``last + 1``) into this piece."""
        self.records.append(record)
        self.last, self.cached = record.epoch_seq, None

    def expand(self) -> Iterable[EpochRecord]:
        """The records held, in seq order."""
        from_runs = itertools.chain.from_iterable(run.records() for run in self.runs)
        if not self.records:
            return from_runs
        return heapq.merge(from_runs, self.records, key=_epoch_seq)

    def after(self, seq: int) -> _TailRun:
        """The records beyond ``seq`` (which lies inside this piece)."""
        records = self.records[bisect.bisect_right(self.records, seq, key=_epoch_seq):]
        runs = []
        if self.runs:
            data = self._run().data
            skip = int(np.searchsorted(data.column(1).to_numpy(), seq, side="right"))
            if skip < data.num_rows:
                runs.append(EpochRun(data.slice(skip)))
        return _TailRun(seq + 1, self.last, runs, None, records)


_epoch_seq: Final = operator.attrgetter("epoch_seq")


@dataclass
class _Domain:
    """One domain's applied point and what waits beyond it.

    Epoch records wait in ``records`` (one by one) and, after every one of them, in
    ``tail``: runs kept as columns, ascending, each starting above everything held
    before it. Reading ``epochs`` turns the tail into records (the one-interval
    reference path and the rarer paths work on records).
    """

    domain_id: int
    applied_seq: int = 0  # epochs up to this one are applied (0: none yet)
    applied_end: int = 0  # ... and every batch before this id
    records: dict[int, EpochRecord] = field(default_factory=dict)
    tail: list[_TailRun] = field(default_factory=list)
    chunks: list[pa.RecordBatch] = field(default_factory=list)
    loose: list[ChangeEvent] = field(default_factory=list)

    @property
    def epochs(self) -> dict[int, EpochRecord]:
        """Every epoch record held, by seq (the tail expanded into records)."""
        if self.tail:
            records = self.records
            for piece in self.tail:
                for record in piece.expand():
                    records[record.epoch_seq] = record
            self.tail = []
        return self.records

    def last_held(self) -> int:
        """The highest epoch seq held (0: none)."""
        if self.tail:
            return self.tail[-1].last
        return max(self.records) if self.records else 0

    def holds(self, seq: int) -> bool:
        return seq in self.records or any(p.first <= seq <= p.last for p in self.tail)

    def held_after(self, limit: int) -> tuple[int, ...]:
        """The first ``limit`` epoch seqs held, ascending."""
        seqs = sorted(self.records)[:limit]
        for piece in self.tail:
            if len(seqs) >= limit:
                break
            seqs += range(piece.first, min(piece.last, piece.first + limit) + 1)
        return tuple(seqs[:limit])

    def position(self, after: int | None = None, end_id: int | None = None) -> Position:
        """The position at quiescence point ``after`` (default: the last applied), with
        the epochs seen complete beyond it (at most _SEEN_WINDOW of them)."""
        seq = self.applied_seq if after is None else after
        seen = 0
        for offset in range(1, _SEEN_WINDOW + 1):
            if self.holds(seq + offset):
                seen |= 1 << (offset - 1)
        end = self.applied_end if end_id is None else end_id
        return Position(self.domain_id, seq, end, seen)


class Assembler:
    """Turns records (any order within a quiescent interval, duplicates allowed) into
    verified changesets and snapshots.

    ``initial_state`` is the state the log starts from (empty by default);
    ``position`` (a token, ``Position`` or ``Frontier``) resumes after a quiescence
    point already applied: older records are skipped.
    """

    def __init__(
        self,
        initial_state: Mapping[Cell, Value] | None = None,
        position: str | Position | Frontier | None = None,
    ) -> None:
        self._state: dict[bytes, bytes] = {
            _encode_cell(cell): encode_value(value) for cell, value in (initial_state or {}).items()
        }
        self._domains: dict[int, _Domain] = {}
        self._pending_events = 0
        self._failure: InconsistentLog | None = None
        self.late_duplicates = 0
        self._ready: list[Changeset] = []  # from checkpoints and stripes (replay._resume)
        # Snapshot chunks (replay._baseline): a consumer given no state learns it there.
        self._baselines = Baselines(fresh=initial_state is None and position is None)
        if isinstance(position, str):
            position = Frontier.parse(position)
        if isinstance(position, Position):
            position = Frontier.of([position])
        for p in position or ():
            self._domains[p.domain_id] = _Domain(p.domain_id, p.epoch_seq, p.end_id)

    # -- public ---------------------------------------------------------------------------

    @property
    def position(self) -> Frontier:
        """Where this assembler stands: one position per domain seen."""
        return Frontier.of(d.position() for d in self._domains.values())

    @property
    def state(self) -> dict[Cell, Value]:
        """A decoded copy of the state at the last verified quiescence point."""
        return {_decode_cell(k): decode_value(v) for k, v in self._state.items()}  # type: ignore[misc]

    def feed(self, record: ChangeEvent | EpochRecord | EpochRun | EventBatch | SnapshotChunk
             | StateDelta, *,
             defer: bool = False) -> list[Changeset]:
        """Take one record; return the changesets it completed (often none).

        With ``defer``, only store it: ``drain()`` later verifies everything complete
        in one vectorised pass, which is much faster when intervals are small.
        """
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure  # held back while the changesets before it were handed out
        if isinstance(record, ChangeEvent):
            domain = self._domain(record.domain_id)
            domain.loose.append(record)
            self._pending_events += 1
            return []
        if isinstance(record, EventBatch):
            self._feed_events(record.data)
            self._pending_events += record.data.num_rows
            return []
        if isinstance(record, EpochRecord):
            if not self._store_epoch(record) or defer:
                return []
            return self._drain_domain(self._domains[record.domain_id], bulk=False)
        if isinstance(record, SnapshotChunk):
            return self._baselines.feed(self, record, defer=defer)
        if isinstance(record, EpochRun):  # a decoded EPOCHS message: its records in order
            return self._feed_run(record, defer=defer)
        if isinstance(record, StateDelta):  # a checkpoint or stripe (replay._resume)
            done = self.drain() + apply_state(self, record)
            if defer:
                self._ready += done
                return []
            return done
        raise TypeError(f"cannot assemble a {type(record).__name__}")

    def drain(self) -> list[Changeset]:
        """Verify and apply every complete quiescent interval held; return the changesets.

        If an interval fails, the changesets before it are applied and returned, and the
        next call raises the ``InconsistentLog`` (at once if there was none before it).
        """
        return [c for part in self._drain_parts() for c in part]

    def _drain_parts(self) -> list[_Run | list[Changeset]]:
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure
        ready, self._ready = self._ready, []  # from checkpoints and stripes, first
        parts: list[_Run | list[Changeset]] = [ready]
        for domain in list(self._domains.values()):
            parts += self._drain_domain_parts(domain, bulk=True)
        self._pending_events = 0
        return parts

    def changesets(self, records: Iterable[ChangeEvent | EpochRecord | EpochRun
                                           | EventBatch | SnapshotChunk | StateDelta]
                   ) -> Iterator[Changeset]:
        """Feed every record; yield each changeset once verified (in bulk, for speed).

        Intervals are verified many at a time, so this assembler's own ``state`` and
        ``position`` may run ahead of the changeset just yielded: store each
        changeset's ``position`` with the state it produced, as a replica does.
        """
        source = iter(records)
        while True:
            try:
                finished = self._take(source)
            except Exception:
                # The source (a damaged fragment, a lost connection) or a record failed:
                # hand out every interval verified before it first, then raise its error.
                yield from self._drain_then_raise()
                raise
            if finished:
                break
            yield from self._drain_then_raise()
        # The usual last (often only) drain, unrolled: one generator frame less per
        # changeset, which counts when each holds one event.
        for part in self._drain_parts():
            yield from part
        self.check_gaps()  # raises a failure held back behind those changesets first

    def replay(self, records: Iterable[ChangeEvent | EpochRecord | EpochRun | EventBatch
                                       | SnapshotChunk | StateDelta]) -> Iterator[Snapshot]:
        """Like ``changesets``, but yield the whole state at every quiescence point."""
        state = self.state
        for changeset in self.changesets(records):
            for cell, value in changeset.changes.items():
                if value is ABSENT:
                    state.pop(cell, None)
                else:
                    state[cell] = value  # type: ignore[assignment]
            yield Snapshot(changeset.domain_id, changeset.epoch_seq, dict(state), changeset)

    def _drain_then_raise(self) -> Iterator[Changeset]:
        for part in self._drain_parts():
            yield from part
        if self._failure is not None:
            self.drain()  # raises the failure held back for the good changesets

    def check_gaps(self) -> None:
        """Raise if a quiescence point was seen but an epoch before it never came.

        A log may end in the middle of an interval (its tail is still being written);
        it may not skip an epoch. A fault held back while the changesets before it were
        handed out is raised first.
        """
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure
        self._baselines.check_held(self)
        for domain in self._domains.values():
            waiting = [r.epoch_seq for r in domain.epochs.values() if r.quiescent]
            if waiting:
                point = min(waiting)
                # The first epoch not held between the last applied point and the first
                # quiescence point held (one is missing, or that interval would be applied).
                missing = next((s for s in range(domain.applied_seq + 1, point)
                                if s not in domain.epochs), domain.applied_seq + 1)
                raise InconsistentLog(
                    f"epoch {missing} never arrived, but quiescence point {point} after it "
                    "did", domain_id=domain.domain_id, epoch_seq=missing)

    # -- intake -------------------------------------------------------------------------------

    def _domain(self, domain_id: int) -> _Domain:
        domain = self._domains.get(domain_id)
        if domain is None:
            domain = self._domains[domain_id] = _Domain(domain_id)
        return domain

    def _feed_events(self, data: pa.RecordBatch) -> None:
        if not data.num_rows:
            return
        domains = data.column(0)
        ids = domains.to_numpy(zero_copy_only=False)
        if (ids == ids[0]).all():  # the usual case: numpy, a few us less than pyarrow.compute
            self._domain(int(ids[0])).chunks.append(data)
            return
        for domain_id in pc.unique(domains).to_pylist():
            self._domain(domain_id).chunks.append(data.filter(pc.equal(domains, domain_id)))

    def _take(self, source: Iterator[ChangeEvent | EpochRecord | EpochRun | EventBatch
                                     | SnapshotChunk | StateDelta]) -> bool:
        """Store records from ``source`` until _BULK_EVENTS events wait (False) or it
        ends (True). The loop is ``feed(record, defer=True)`` unrolled for speed: epoch
        records are gathered and stored together (``_store_records``) before any other
        record, when the source ends and when it fails."""
        # groupby gathers each run of epoch records in C. It holds no record back while
        # one is handled (only between groups, where none is), so returning mid-group
        # loses nothing; list.extend keeps what it took before the source failed.
        epoch_type, batch_type, run_type = EpochRecord, EventBatch, EpochRun
        for kind, group in itertools.groupby(source, type):
            if kind is epoch_type:
                pending: list[EpochRecord] = []
                try:
                    pending.extend(group)  # type: ignore[arg-type]
                finally:
                    if pending:
                        self._store_records(pending)
                continue
            is_batch, is_run = kind is batch_type, kind is run_type
            for record in group:
                if not self._take_one(record, is_batch, is_run):
                    return False
        return True

    def _store_deferred(self, records: list[EpochRecord]) -> None:
        """``feed(record, defer=True)`` for each of ``records``, in order, in one step."""
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure
        if records:
            self._store_records(records)

    def _store_records(self, records: list[EpochRecord]) -> None:
        """Store epoch records as ``_take`` met them. The usual case (one domain,
        consecutive seqs, all beyond what is held) becomes one piece of the tail, as
        columns read in one C pass; any other goes record by record."""
        if len(records) >= _RECORDS_AS_COLUMNS:
            found = EpochColumns.of_records_native(records)
            if found is not None:
                columns, domain_ids = found
                seqs = columns.seqs
                if (domain_ids == domain_ids[0]).all() and (np.diff(seqs) == _ONE_U).all():
                    domain = self._domain(int(domain_ids[0]))
                    first = int(seqs[0])
                    if first > domain.applied_seq and first > domain.last_held():
                        domain.tail.append(_TailRun(first, int(seqs[-1]), [], columns,
                                                    records))
                        return
        domains = self._domains
        for record in records:
            domain = domains.get(record.domain_id) or self._domain(record.domain_id)
            seq = record.epoch_seq
            tail = domain.tail
            if tail and seq > tail[-1].last:
                # Beyond everything held: it joins the tail (reading ``epochs`` would
                # expand the tail into records, one Python object each).
                if tail[-1].last + 1 == seq:
                    tail[-1].append(record)
                else:
                    tail.append(_TailRun(seq, seq, [], None, [record]))
                continue
            if seq > domain.applied_seq:
                known = domain.epochs.setdefault(seq, record)
                if known is not record and known != record:
                    self._store_epoch(record)  # raises

    def _take_one(self, record: ChangeEvent | EpochRecord | EpochRun | EventBatch
                  | SnapshotChunk | StateDelta, is_batch: bool, is_run: bool) -> bool:
        """``_take`` for a record other than an epoch record; False once _BULK_EVENTS
        events wait."""
        if is_batch:
            self._feed_events(record.data)  # type: ignore[union-attr]
            self._pending_events += record.data.num_rows  # type: ignore[union-attr]
            return self._pending_events < _BULK_EVENTS
        if is_run:
            self._store_run(record)  # type: ignore[arg-type]
        else:
            self.feed(record, defer=True)
        return True

    def _feed_run(self, run: EpochRun, *, defer: bool) -> list[Changeset]:
        """``feed`` for a run: as its records fed in order, verified in one pass."""
        try:
            domain_ids = self._store_run(run)
        except InconsistentLog as exc:
            # Two records for one epoch differ: the records before it were taken; hand
            # out what they completed, then the fault.
            if defer:
                raise
            done = self.drain()
            if not done:
                raise
            if self._failure is None:
                self._failure = exc
            return done
        if defer:
            return []
        return [c for domain_id in domain_ids
                for c in self._drain_domain(self._domains[domain_id], bulk=True)]

    def _store_run(self, run: EpochRun) -> list[int]:
        """Keep a run's new records; return the domains it named.

        The usual run (one domain, consecutive seqs, all beyond what is held) is kept
        as columns, with no Python step per record; any other goes record by record.
        """
        data = run.data
        n = data.num_rows
        if not n:
            return []
        domain_id, first, last, plain = _run_shape(data)
        if plain:
            domain = self._domain(domain_id)
            if last <= domain.applied_seq:
                return [domain_id]  # copies of applied epochs
            if first > domain.applied_seq and first > domain.last_held():
                tail = domain.tail
                if not (tail and tail[-1].last + 1 == first and tail[-1].extend(run, last)):
                    tail.append(_TailRun(first, last, [run]))
                return [domain_id]
        for record in run.records():
            self._store_epoch(record)
        return list(dict.fromkeys(data.column(0).to_pylist()))

    def _store_epoch(self, record: EpochRecord) -> bool:
        """Keep ``record`` if new; False for a copy of one already held or applied."""
        domain = self._domain(record.domain_id)
        if record.epoch_seq <= domain.applied_seq:
            return False  # a duplicate of an applied epoch
        known = domain.epochs.get(record.epoch_seq)
        if known is not None:
            if known != record:
                raise InconsistentLog(
                    f"two different records for one epoch: {known} and {record}",
                    domain_id=record.domain_id, epoch_seq=record.epoch_seq)
            return False
        domain.epochs[record.epoch_seq] = record
        return True

    def _drain_domain(self, domain: _Domain, *, bulk: bool) -> list[Changeset]:
        return [c for part in self._drain_domain_parts(domain, bulk=bulk) for c in part]

    def _drain_domain_parts(self, domain: _Domain, *, bulk: bool
                            ) -> list[_Run | list[Changeset]]:
        """Apply what is complete in ``domain``; return its changesets, a run's built
        only when iterated (so a long run of tiny intervals never holds them all)."""
        if self._baselines.wants(domain.domain_id):
            return [self._baselines.drain(self, domain)]
        done: list[Changeset] = []
        parts: list[_Run | list[Changeset]] = [done]
        try:
            if bulk:
                run = self._complete_run(domain)
                if run and (verified := self._advance_run(domain, run)) is not None:
                    parts.insert(0, verified)
            while (changeset := self._advance(domain)) is not None:
                done.append(changeset)
        except InconsistentLog as exc:
            if self._baselines.hold(domain.domain_id, exc):
                return parts  # a fresh consumer waits for a baseline (replay._baseline)
            if not any(len(part) for part in parts):
                raise
            self._failure = exc  # raised by the next call, after the good changesets
        return parts

    # -- one quiescent interval (the reference path) -----------------------------------------

    def _advance(self, domain: _Domain) -> Changeset | None:
        """Apply the next quiescent interval of ``domain`` if all its epochs are here."""
        if domain.tail and not _interval_held(domain):
            return None  # (keeps the tail as columns: reading ``epochs`` would expand it)
        interval = self._next_interval(domain)
        if interval is None:
            return None
        epochs, data, rest, late = interval
        changes, before = self._verify(domain, epochs, data)
        # Verified: apply, then move the position. Nothing above touched the state.
        self._commit(domain, epochs, changes, rest, late)
        last = epochs[-1]
        keys = list(changes)
        net = NetChanges(keys, list(changes.values()), [before[k] for k in keys],
                         [0, len(keys)], [data.num_rows])
        return Changeset(domain.domain_id, last.epoch_seq, data.num_rows, domain.position(),
                         net, 0)

    def _next_interval(self, domain: _Domain
                       ) -> tuple[list[EpochRecord], pa.Table, list[pa.RecordBatch], int] | None:
        """The epochs of ``domain``'s next quiescent interval (None: not all here yet),
        checked to tile, with its deduplicated events, the later epochs' events and the
        count of late duplicates."""
        seq = domain.applied_seq + 1
        epochs: list[EpochRecord] = []
        while (record := domain.epochs.get(seq)) is not None:
            epochs.append(record)
            if record.quiescent:
                break
            seq += 1
        else:
            return None
        self._check_tiling(domain, epochs)
        data, rest, late, conflict = self._take_interval(domain, epochs[-1].end_id)
        if conflict is not None:
            raise _identity_conflict(domain, data, conflict)
        return epochs, data, rest, late

    def _commit(self, domain: _Domain, epochs: list[EpochRecord], changes: dict[bytes, bytes],
                rest: list[pa.RecordBatch], late: int) -> None:
        """Apply a verified interval's net changes, keep the later epochs' events
        (``rest``), and move the domain's applied point past ``epochs``."""
        state = self._state
        for key, final in changes.items():
            if final:
                state[key] = final
            else:
                state.pop(key, None)
        self.late_duplicates += late
        domain.chunks = rest
        for record in epochs:
            del domain.epochs[record.epoch_seq]
        last = epochs[-1]
        domain.applied_seq, domain.applied_end = last.epoch_seq, last.end_id

    # -- a run of intervals in one pass (the fast path) ------------------------------------

    def _complete_run(self, domain: _Domain) -> EpochColumns | None:
        """The consecutive epochs held after the applied point, up to the last quiescent,
        as columns (None: no complete interval)."""
        records = domain.records
        parts: list[EpochColumns] = []
        following = domain.applied_seq + 1
        if records:
            seqs = list(records)
            if seqs == list(range(following, following + len(seqs))):  # stored in order
                run = list(records.values())
            else:
                run = []
                while (record := records.get(following + len(run))) is not None:
                    run.append(record)
            if run:
                parts.append(EpochColumns.of_records(run))
            following += len(run)
            if len(run) != len(records):  # a gap: nothing after it is consecutive
                following = -1
        for piece in domain.tail:
            if piece.first != following:
                break
            parts.append(piece.columns)
            following = piece.last + 1
        if not parts:
            return None
        columns = EpochColumns.concat(parts)
        markers = np.flatnonzero(columns.quiescent)
        if not len(markers):
            return None
        return columns.head(int(markers[-1]) + 1)

    def _advance_run(self, domain: _Domain, epochs: EpochColumns) -> _Run | None:
        """Verify and apply the intervals of ``epochs`` in one vectorised pass.

        If one is at fault, the intervals before it are verified again without it and
        applied; the one at fault is left for ``_advance``, which names the fault exactly
        as the one-interval path does.
        """
        while len(epochs):
            outcome = self._try_run(domain, epochs)
            if not isinstance(outcome, int):
                return outcome
            # The first epoch at fault: drop its interval and what follows.
            before = np.flatnonzero(epochs.quiescent[:outcome])
            if not len(before):
                return None
            epochs = epochs.head(int(before[-1]) + 1)
        return None

    def _try_run(self, domain: _Domain, epochs: EpochColumns) -> _Run | int:
        """The changesets of the run, applied; or the index of the first epoch at fault
        (nothing applied)."""
        tiling = first_tiling_fault(epochs, domain.applied_end)
        if tiling is not None:
            return tiling
        end_id = int(epochs.ends[-1])
        data, rest, late, conflict = self._take_interval(domain, end_id)
        base = np.uint64(domain.applied_end)
        ends = epochs.ends - base
        rel = data.column("batch_id").to_numpy() - base
        epoch_index = np.searchsorted(ends, rel, side="right")
        faults = [first_count_fault(epochs, epoch_index)]
        if len(epochs.table_names):
            faults.append(first_table_fault(epochs, _flat(data.column("table")), epoch_index))
        if conflict is not None:
            faults.append(int(epoch_index[conflict]))
        else:
            faults.append(first_setsum_fault(epochs, data, epoch_index))
        quiescent = epochs.quiescent
        markers = np.flatnonzero(quiescent)
        interval_of_epoch = np.concatenate(([0], np.cumsum(quiescent[:-1])))
        net: NetChanges | BrokenChain | None = None
        if conflict is None:
            net = net_changes(self._state, _cell_keys(data), _flat(data.column("old")),
                              _flat(data.column("new")), interval_of_epoch[epoch_index],
                              len(markers))
            if isinstance(net, BrokenChain):
                faults.append(int(markers[net.interval - 1]) + 1 if net.interval else 0)
        found = [f for f in faults if f is not None]
        if found or not isinstance(net, NetChanges):
            return min(found)
        # Verified: apply (each cell's last final), then move the position.
        state = self._state
        state.update(zip(net.keys, net.finals, strict=True))  # in order: the last stays
        if not all(net.finals):  # some cell ended ABSENT (b""): the state holds none
            for key in [k for k, v in zip(net.keys, net.finals, strict=True) if not v]:
                if state.get(key) == b"":
                    del state[key]
        self.late_duplicates += late
        domain.chunks = rest
        last_seq = int(epochs.seqs[-1])
        _drop_applied(domain, last_seq)
        positions = _RunPositions(domain.domain_id, domain.held_after(_SEEN_WINDOW),
                                  epochs.ends[markers].tolist())
        done = _Run(domain.domain_id, epochs.seqs[markers].tolist(), net, positions)
        domain.applied_seq, domain.applied_end = last_seq, end_id
        return done

    def _check_tiling(self, domain: _Domain, epochs: list[EpochRecord]) -> None:
        expected_begin = domain.applied_end
        for record in epochs:
            if record.begin_id != expected_begin:
                raise InconsistentLog(
                    f"epoch begins at id {record.begin_id:#x}, but the previous one ended "
                    f"at {expected_begin:#x}: epochs must tile the id space",
                    domain_id=domain.domain_id, epoch_seq=record.epoch_seq)
            expected_begin = record.end_id

    def _take_interval(self, domain: _Domain, end_id: int
                       ) -> tuple[pa.Table, list[pa.RecordBatch], int, int | None]:
        """Split the domain's pending events: those of batches before ``end_id``
        (deduplicated, sorted by batch and seq), and those of later epochs; count the
        late copies of applied events (dropped). The last item is the row of an event
        whose identity another, different event shares (None: no such conflict)."""
        if domain.loose:
            domain.chunks.append(EventBatch.from_events(domain.loose).data)
            domain.loose = []
        table = (pa.Table.from_batches(domain.chunks, schema=EVENT_SCHEMA)
                 if domain.chunks else EVENT_SCHEMA.empty_table())
        base = np.uint64(domain.applied_end)
        limit = np.uint64((end_id - domain.applied_end) % (1 << 64))
        rel = table.column("batch_id").to_numpy() - base  # modular: uint64 wraps
        inside = rel < limit
        later = (rel >= limit) & (rel < _HALF)
        late = int(len(rel) - inside.sum() - later.sum())
        rest = table.filter(pa.array(later)).to_batches() if later.any() else []
        data = table.filter(pa.array(inside)) if not inside.all() else table
        rel_in = rel[inside]
        seq = data.column("seq").to_numpy().astype(np.int64)
        step = np.diff(rel_in.astype(np.int64, copy=False)) if len(rel_in) > 1 else None
        # A log from one writer is already in (batch, seq) order: skip the sort then.
        if step is None or not ((step > 0) | ((step == 0) & (np.diff(seq) > 0))).all():
            data = data.take(pa.array(np.lexsort((seq, rel_in))))
        data, conflict = _drop_duplicates(data)
        return data, rest, late, conflict

    def _verify(self, domain: _Domain, epochs: list[EpochRecord], data: pa.Table
                ) -> tuple[dict[bytes, bytes], dict[bytes, bytes]]:
        base = np.uint64(domain.applied_end)
        ends = np.array([(r.end_id - domain.applied_end) % (1 << 64) for r in epochs],
                        dtype=np.uint64)
        rel = data.column("batch_id").to_numpy() - base
        epoch_index = np.searchsorted(ends, rel, side="right")
        changes, before = self._cancel_out(domain, epochs, data, epoch_index)
        _check_counts(domain, epochs, data, epoch_index)
        _check_setsums(domain, epochs, data, ends, base)
        return changes, before

    def _cancel_out(self, domain: _Domain, epochs: list[EpochRecord], data: pa.Table,
                    epoch_index: np.ndarray) -> tuple[dict[bytes, bytes], dict[bytes, bytes]]:
        keys = _cell_keys(data)
        result = cancel_out(self._state, keys, _flat(data.column("old")),
                            _flat(data.column("new")), np.zeros(data.num_rows, np.int64), 1)
        if isinstance(result, BrokenChain):
            raise self._cell_error(domain, epochs, data, keys, result.key, result.why)
        return result[0].changes, result[0].before

    def _cell_error(self, domain: _Domain, epochs: list[EpochRecord], data: pa.Table,
                    keys: pa.Array, key: bytes, why: str) -> InconsistentLog:
        rows = pc.indices_nonzero(pc.equal(keys, pa.scalar(key, pa.binary()))).to_pylist()
        base = np.uint64(domain.applied_end)
        ends = np.array([(r.end_id - domain.applied_end) % (1 << 64) for r in epochs],
                        dtype=np.uint64)
        batch = np.uint64(data.column("batch_id")[rows[0]].as_py()) if rows else base
        epoch = epochs[min(int(np.searchsorted(ends, batch - base, side="right")),
                           len(epochs) - 1)].epoch_seq
        held = decode_value(self._state.get(key, b""))
        return InconsistentLog(f"cell state cannot be rebuilt: {why}; value held {held!r}",
                               domain_id=domain.domain_id, epoch_seq=epoch,
                               cell=_decode_cell(key))


def _run_shape(data: pa.RecordBatch) -> tuple[int, int, int, bool]:
    """A run's first domain, first and last seq, and whether it is one domain's
    consecutive seqs (the usual run). A usual run has a few rows: as Python ints they
    cost a fraction of numpy's fixed cost; a long run goes through numpy."""
    n = data.num_rows
    if n <= _FEW_ROWS:
        domains, seqs = _uint64s(data.column(0)), _uint64s(data.column(1))
        first = seqs[0]
        plain = domains.count(domains[0]) == n and seqs == list(range(first, first + n))
        return domains[0], first, seqs[-1], plain
    domains, seqs = data.column(0).to_numpy(), data.column(1).to_numpy()
    plain = bool((domains == domains[0]).all() and (np.diff(seqs) == _ONE_U).all())
    return int(domains[0]), int(seqs[0]), int(seqs[-1]), plain


_FEW_ROWS: Final = 32


def _uint64s(column: pa.Array) -> list[int]:
    """A uint64 column with no nulls as ints: for the few values of a usual run, several
    times cheaper than through numpy."""
    start = 8 * column.offset
    return memoryview(column.buffers()[1])[start:start + 8 * len(column)].cast("Q").tolist()


def _cell_keys(data: pa.Table) -> pa.Array:
    """Each event's cell as one binary key: table NUL column NUL tagged row."""
    return _flat(pc.binary_join_element_wise(
        data.column("table").cast(pa.binary()), data.column("column").cast(pa.binary()),
        data.column("row"), b"\x00"))


def _flat(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _drop_duplicates(data: pa.Table) -> tuple[pa.Table, int | None]:
    """Drop repeated identities from ``data`` (sorted by batch, seq). The second item is
    the row (in the returned table) of an event another, different one repeats."""
    if data.num_rows < 2:
        return data, None
    batch = data.column("batch_id").to_numpy()
    seq = data.column("seq").to_numpy()
    repeat = np.concatenate(([False], (batch[1:] == batch[:-1]) & (seq[1:] == seq[:-1])))
    if not repeat.any():
        return data, None
    kept = data.filter(pa.array(~repeat))
    for i in np.flatnonzero(repeat).tolist():
        if data.slice(i, 1).to_pylist() != data.slice(i - 1, 1).to_pylist():
            return kept, int(np.count_nonzero(~repeat[:i])) - 1
    return kept, None


def _identity_conflict(domain: _Domain, data: pa.Table, row: int) -> InconsistentLog:
    batch, seq = data.column("batch_id")[row].as_py(), data.column("seq")[row].as_py()
    return InconsistentLog(
        f"two different events share the identity (batch {batch:#x}, seq {seq})",
        domain_id=domain.domain_id)


def _interval_held(domain: _Domain) -> bool:
    """Whether every epoch of ``domain``'s next interval is held."""
    seq = domain.applied_seq + 1
    records = domain.records
    while (record := records.get(seq)) is not None:
        if record.quiescent:
            return True
        seq += 1
    for piece in domain.tail:
        if piece.first != seq:
            return False
        if piece.columns.quiescent.any():
            return True
        seq = piece.last + 1
    return False


def _drop_applied(domain: _Domain, last_seq: int) -> None:
    """Forget the epoch records up to ``last_seq`` (a run just applied)."""
    records = domain.records
    if records:
        if max(records) <= last_seq:
            records.clear()
        else:
            for seq in [s for s in records if s <= last_seq]:
                del records[seq]
    tail = domain.tail
    while tail and tail[0].last <= last_seq:
        tail.pop(0)
    if tail and tail[0].first <= last_seq:
        tail[0] = tail[0].after(last_seq)


class _Run:
    """The changesets of a run of intervals verified and applied together, each built
    when iterated: a consumer that lets each go keeps one alive, not one per interval.
    Each changeset is this run and its index: what they share lives here once."""

    __slots__ = ("counts", "domain_id", "net", "positions", "seqs")

    def __init__(self, domain_id: int, seqs: list[int], net: NetChanges,
                 positions: _RunPositions) -> None:
        self.domain_id = domain_id
        self.seqs = seqs  # each changeset's quiescence point
        self.counts = net.counts  # ... and event count
        self.net = net
        self.positions = positions

    def __len__(self) -> int:
        return len(self.seqs)

    def __iter__(self) -> Iterator[Changeset]:
        return map(_RunChangeset, itertools.repeat(self, len(self.seqs)), range(len(self.seqs)))

    def position_at(self, index: int) -> Position:
        return self.positions.at(index, self.seqs[index])

    def end_id_at(self, index: int) -> int:
        return self.positions.end_ids[index]


class _RunChangeset(Changeset):
    """A changeset of a ``_Run``: two slots set, the fewest a changeset can cost."""

    __slots__ = ()

    def __init__(self, run: _Run, index: int) -> None:
        self._run = run
        self._index = index


class _One:
    """What ``Changeset(...)`` was given, for one changeset: a run of one, kept at its
    index in ``net`` (several may share one ``net``)."""

    __slots__ = ("_position", "counts", "domain_id", "net", "seqs")

    def __init__(self, domain_id: int, epoch_seq: int, event_count: int,
                 position: Position | _RunPositions, net: NetChanges, index: int) -> None:
        self.domain_id = domain_id
        self.seqs = {index: epoch_seq}
        self.counts = {index: event_count}
        self.net = net
        self._position = position

    def position_at(self, index: int) -> Position:
        position = self._position
        if isinstance(position, Position):
            return position
        return position.at(index, self.seqs[index])

    def end_id_at(self, index: int) -> int:
        position = self._position
        if isinstance(position, Position):
            return position.end_id
        return position.end_ids[index]


@dataclass(frozen=True, slots=True)
class _RunPositions:
    """The positions of a run's changesets, built when asked. The ``seen`` hint names
    the epochs held beyond the run (those of the run itself are applied with it)."""

    domain_id: int
    extra: tuple[int, ...]
    end_ids: list[int]  # per changeset of the run

    def at(self, index: int, seq: int) -> Position:
        seen = 0
        for epoch in self.extra:
            if 0 < epoch - seq <= _SEEN_WINDOW:
                seen |= 1 << (epoch - seq - 1)
        return Position(self.domain_id, seq, self.end_ids[index], seen)


def _check_counts(domain: _Domain, epochs: list[EpochRecord], data: pa.Table,
                  epoch_index: np.ndarray) -> None:
    counts = np.bincount(epoch_index, minlength=len(epochs))
    for record, count in zip(epochs, counts.tolist(), strict=False):
        if count != record.event_count:
            raise InconsistentLog(
                f"the log holds {count} events of this epoch, its record says "
                f"{record.event_count}", domain_id=domain.domain_id, epoch_seq=record.epoch_seq)
    if not any(r.table_counts for r in epochs):
        return
    tables = pc.dictionary_encode(_flat(data.column("table")))
    names = tables.dictionary.to_pylist()
    combined = epoch_index.astype(np.int64) * len(names) + tables.indices.to_numpy()
    pairs, counts = np.unique(combined, return_counts=True)
    seen: dict[int, dict[str, int]] = {}
    for pair, count in zip(pairs.tolist(), counts.tolist(), strict=True):
        epoch, name = divmod(pair, len(names))
        seen.setdefault(epoch, {})[names[name]] = count
    for i, record in enumerate(epochs):
        if record.event_count and dict(record.table_counts) != seen.get(i, {}):
            raise InconsistentLog(
                f"per-table counts {seen.get(i, {})} differ from the record's "
                f"{dict(record.table_counts)}", domain_id=domain.domain_id,
                epoch_seq=record.epoch_seq)


def _check_setsums(domain: _Domain, epochs: list[EpochRecord], data: pa.Table,
                   ends: np.ndarray, base: np.uint64) -> None:
    if not any(r.setsum for r in epochs):
        return
    segments = list(segment_digests(data))
    batch_ids = np.array([batch for _, batch, _ in segments], dtype=np.uint64)
    owner = np.searchsorted(ends, batch_ids - base, side="right").tolist()
    per_epoch: dict[int, list[bytes]] = {}
    for index, (_, _, digest) in zip(owner, segments, strict=True):
        per_epoch.setdefault(index, []).append(digest)
    for index, record in enumerate(epochs):
        if not record.setsum:
            continue
        digests = per_epoch.get(index)
        actual = _EMPTY_SETSUM if digests is None else Setsum.of_digests(digests).hexdigest()
        if actual != record.setsum:
            raise InconsistentLog(
                f"setsum of the epoch's events is {actual}, its record says {record.setsum} "
                "(an event was altered, lost or foreign)",
                domain_id=domain.domain_id, epoch_seq=record.epoch_seq)


_EMPTY_SETSUM: Final = Setsum().hexdigest()
