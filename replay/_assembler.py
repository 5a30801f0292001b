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

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replay._baseline import Baselines
from replay._bulk import BrokenChain, cancel_out
from replay._errors import InconsistentLog
from replay._position import Frontier, Position
from sequencer import ABSENT, Absent, ChangeEvent, EpochRecord, RowKey, Value
from sinks import EventBatch, Setsum
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
_ONE = np.int64(1)


def _encode_cell(cell: Cell) -> bytes:
    table, row, column = cell
    return table.encode() + b"\x00" + column.encode() + b"\x00" + encode_key(row)


def _decode_cell(key: bytes) -> Cell:
    table, column, row = key.split(b"\x00", 2)
    return (table.decode(), decode_key(row), column.decode())


@dataclass(frozen=True)
class Changeset:
    """What one quiescent interval changed: apply it and the state is a real one.

    ``changes`` maps each changed cell to its new value (``ABSENT``: removed);
    ``before`` maps the same cells to the value they had. ``position`` is the token
    to store with the applied state. Cells are decoded on first access.
    """

    domain_id: int
    epoch_seq: int
    event_count: int
    position: Position
    _changes: dict[bytes, bytes] = field(repr=False)
    _before: dict[bytes, bytes] = field(repr=False)

    @cached_property
    def changes(self) -> dict[Cell, Value | Absent]:
        return {_decode_cell(k): decode_value(v) for k, v in self._changes.items()}

    @cached_property
    def before(self) -> dict[Cell, Value | Absent]:
        return {_decode_cell(k): decode_value(v) for k, v in self._before.items()}

    def __len__(self) -> int:
        return len(self._changes)


@dataclass(frozen=True)
class Snapshot:
    """The whole state at a quiescence point (``state``: a copy, ABSENT cells omitted)."""

    domain_id: int
    epoch_seq: int
    state: dict[Cell, Value]
    changeset: Changeset


@dataclass
class _Domain:
    domain_id: int
    applied_seq: int = 0  # epochs up to this one are applied (0: none yet)
    applied_end: int = 0  # ... and every batch before this id
    epochs: dict[int, EpochRecord] = field(default_factory=dict)
    chunks: list[pa.RecordBatch] = field(default_factory=list)
    loose: list[ChangeEvent] = field(default_factory=list)

    def position(self, after: int | None = None, end_id: int | None = None) -> Position:
        """The position at quiescence point ``after`` (default: the last applied), with
        the epochs seen complete beyond it (at most _SEEN_WINDOW of them)."""
        seq = self.applied_seq if after is None else after
        seen = 0
        for offset in range(1, _SEEN_WINDOW + 1):
            if seq + offset in self.epochs:
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

    def feed(self, record: ChangeEvent | EpochRecord | EventBatch | SnapshotChunk, *,
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
        raise TypeError(f"cannot assemble a {type(record).__name__}")

    def drain(self) -> list[Changeset]:
        """Verify and apply every complete quiescent interval held; return the changesets.

        If an interval fails, the changesets before it are applied and returned, and the
        next call raises the ``InconsistentLog`` (at once if there was none before it).
        """
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure
        done: list[Changeset] = []
        for domain in list(self._domains.values()):
            done += self._drain_domain(domain, bulk=True)
        self._pending_events = 0
        return done

    def changesets(self, records: Iterable[ChangeEvent | EpochRecord | EventBatch
                                           | SnapshotChunk]
                   ) -> Iterator[Changeset]:
        """Feed every record; yield each changeset once verified (in bulk, for speed).

        Intervals are verified many at a time, so this assembler's own ``state`` and
        ``position`` may run ahead of the changeset just yielded: store each
        changeset's ``position`` with the state it produced, as a replica does.
        """
        source = iter(records)
        while True:
            try:
                self.feed(next(source), defer=True)
            except StopIteration:
                break
            except Exception:
                # The source (a damaged fragment, a lost connection) or a record failed:
                # hand out every interval verified before it first, then raise its error.
                yield from self._drain_then_raise()
                raise
            if self._pending_events >= _BULK_EVENTS:
                yield from self._drain_then_raise()
        yield from self._drain_then_raise()
        self.check_gaps()

    def replay(self, records: Iterable[ChangeEvent | EpochRecord | EventBatch | SnapshotChunk]
               ) -> Iterator[Snapshot]:
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
        yield from self.drain()
        if self._failure is not None:
            self.drain()  # raises the failure held back for the good changesets

    def check_gaps(self) -> None:
        """Raise if a quiescence point was seen but an epoch before it never came.

        A log may end in the middle of an interval (its tail is still being written);
        it may not skip an epoch.
        """
        self._baselines.check_held()
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
        first = domains[0].as_py()
        if pc.all(pc.equal(domains, first)).as_py():
            self._domain(first).chunks.append(data)
            return
        for domain_id in pc.unique(domains).to_pylist():
            self._domain(domain_id).chunks.append(data.filter(pc.equal(domains, domain_id)))

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
        if self._baselines.wants(domain.domain_id):
            return self._baselines.drain(self, domain)
        done: list[Changeset] = []
        if bulk:
            run = self._complete_run(domain)
            if sum(r.quiescent for r in run) > 1:
                done = self._advance_run(domain, run)
                if done:
                    return done
        try:
            while (changeset := self._advance(domain)) is not None:
                done.append(changeset)
        except InconsistentLog as exc:
            if self._baselines.hold(domain.domain_id, exc):
                return done  # a fresh consumer waits for a baseline (replay._baseline)
            if not done:
                raise
            self._failure = exc  # raised by the next call, after the good changesets
        return done

    # -- one quiescent interval -------------------------------------------------------------

    def _advance(self, domain: _Domain) -> Changeset | None:
        """Apply the next quiescent interval of ``domain`` if all its epochs are here."""
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
        data, rest = self._take_interval(domain, epochs)
        changes, before = self._verify(domain, epochs, data)
        # Verified: apply, then move the position. Nothing above touched the state.
        state = self._state
        for key, final in changes.items():
            if final:
                state[key] = final
            else:
                state.pop(key, None)
        domain.chunks = rest
        for record in epochs:
            del domain.epochs[record.epoch_seq]
        last = epochs[-1]
        domain.applied_seq, domain.applied_end = last.epoch_seq, last.end_id
        return Changeset(domain.domain_id, last.epoch_seq, data.num_rows, domain.position(),
                         changes, before)

    def _complete_run(self, domain: _Domain) -> list[EpochRecord]:
        """The consecutive epochs held after the applied point, up to the last quiescent."""
        run: list[EpochRecord] = []
        seq = domain.applied_seq + 1
        while (record := domain.epochs.get(seq)) is not None:
            run.append(record)
            seq += 1
        while run and not run[-1].quiescent:
            run.pop()
        return run

    def _advance_run(self, domain: _Domain, epochs: list[EpochRecord]) -> list[Changeset]:
        """Verify and apply several intervals in one pass; [] to fall back to one by one."""
        try:
            self._check_tiling(domain, epochs)
            data, rest = self._take_interval(domain, epochs)
            base = np.uint64(domain.applied_end)
            ends = np.array([(r.end_id - domain.applied_end) % (1 << 64) for r in epochs],
                            dtype=np.uint64)
            rel = data.column("batch_id").to_numpy() - base
            epoch_index = np.searchsorted(ends, rel, side="right")
            _check_counts(domain, epochs, data, epoch_index)
            _check_setsums(domain, epochs, data, ends, base)
        except InconsistentLog:
            return []
        quiescent = np.array([r.quiescent for r in epochs])
        interval_of_epoch = np.concatenate(([0], np.cumsum(quiescent[:-1])))
        results = cancel_out(self._state, _cell_keys(data), _flat(data.column("old")),
                             _flat(data.column("new")), interval_of_epoch[epoch_index],
                             int(quiescent.sum()))
        if isinstance(results, BrokenChain):
            return []  # one interval at a time, to hand out the good ones and name the cell
        # Verified: apply, interval by interval, and hand out the changesets.
        state = self._state
        domain.chunks = rest
        markers = [r for r in epochs if r.quiescent]
        for record in epochs:
            del domain.epochs[record.epoch_seq]
        done = []
        for marker, result in zip(markers, results, strict=True):
            for key, final in result.changes.items():
                if final:
                    state[key] = final
                else:
                    state.pop(key, None)
            done.append(Changeset(domain.domain_id, marker.epoch_seq, result.event_count,
                                  domain.position(marker.epoch_seq, marker.end_id),
                                  result.changes, result.before))
        domain.applied_seq, domain.applied_end = markers[-1].epoch_seq, markers[-1].end_id
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

    def _take_interval(self, domain: _Domain, epochs: list[EpochRecord]
                       ) -> tuple[pa.Table, list[pa.RecordBatch]]:
        """Split the domain's pending events: this interval's (deduplicated, sorted by
        batch and seq), and those of later epochs. Late copies of applied events go."""
        if domain.loose:
            domain.chunks.append(EventBatch.from_events(domain.loose).data)
            domain.loose = []
        table = (pa.Table.from_batches(domain.chunks, schema=EVENT_SCHEMA)
                 if domain.chunks else EVENT_SCHEMA.empty_table())
        base = np.uint64(domain.applied_end)
        limit = np.uint64((epochs[-1].end_id - domain.applied_end) % (1 << 64))
        rel = table.column("batch_id").to_numpy() - base  # modular: uint64 wraps
        inside = rel < limit
        later = (rel >= limit) & (rel < _HALF)
        self.late_duplicates += int(len(rel) - inside.sum() - later.sum())
        rest = table.filter(pa.array(later)).to_batches() if later.any() else []
        data = table.filter(pa.array(inside)) if not inside.all() else table
        rel_in = rel[inside]
        seq = data.column("seq").to_numpy().astype(np.int64)
        step = np.diff(rel_in.astype(np.int64, copy=False)) if len(rel_in) > 1 else None
        # A log from one writer is already in (batch, seq) order: skip the sort then.
        if step is None or not ((step > 0) | ((step == 0) & (np.diff(seq) > 0))).all():
            data = data.take(pa.array(np.lexsort((seq, rel_in))))
        return _drop_duplicates(domain, data), rest

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


def _cell_keys(data: pa.Table) -> pa.Array:
    """Each event's cell as one binary key: table NUL column NUL tagged row."""
    return _flat(pc.binary_join_element_wise(
        data.column("table").cast(pa.binary()), data.column("column").cast(pa.binary()),
        data.column("row"), b"\x00"))


def _flat(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _drop_duplicates(domain: _Domain, data: pa.Table) -> pa.Table:
    """Drop repeated identities from ``data`` (sorted by batch, seq)."""
    if data.num_rows < 2:
        return data
    batch = data.column("batch_id").to_numpy()
    seq = data.column("seq").to_numpy()
    repeat = np.concatenate(([False], (batch[1:] == batch[:-1]) & (seq[1:] == seq[:-1])))
    if not repeat.any():
        return data
    for i in np.flatnonzero(repeat).tolist():
        if data.slice(i, 1).to_pylist() != data.slice(i - 1, 1).to_pylist():
            raise InconsistentLog(
                f"two different events share the identity (batch {int(batch[i]):#x}, seq "
                f"{int(seq[i])})", domain_id=domain.domain_id)
    return data.filter(pa.array(~repeat))


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
