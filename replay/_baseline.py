"""Baselines on the reading side: snapshot chunks folded into the assembler's state.

A chunk (``sinks.codec.SnapshotChunk``) says: right after quiescence point Q of its
domain, the rows ``lo <= row < hi`` held exactly these cells. The assembler applies it
at Q, between the interval ending at Q and the next one, as a changeset of its own
(same position): cells that differ take the chunk's value, cells of those rows the
chunk does not list go.

A consumer that starts from nothing (no ``initial_state``, no position) cannot check
events on cells that existed before the agent: it only learns their values from the
baseline. So while a baseline runs (its chunk 0 applied, its last not yet), such a
consumer checks the cancel-out chains of the rows already covered (below the last
chunk's ``hi``) and leaves the others to their chunk; counts and setsums are checked
for every event. If its strict replay breaks on a cell before any baseline came, the
failure is held (the domain waits, and says so in a warning) until a chunk 0 of that
domain arrives; from there it replays with nothing covered until the baseline covers
the rows. A log that ends without one raises the held failure, and so does a stream
with ``HOLD_LIMIT_EPOCHS`` epochs waiting behind it. Once the last chunk is applied the state is
whole and every later interval is checked strictly again.

Each chunk is verified like an epoch: its cell count and its setsum, that chunks come
in order and tile the row space (each ``lo`` is the previous ``hi``).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import pyarrow as pa
import structlog

from replay._bulk import BrokenChain, cancel_out
from replay._errors import InconsistentLog
from sinks.codec import SnapshotChunk, decode_key, row_order

if TYPE_CHECKING:
    from replay._assembler import Assembler, Changeset, _Domain
    from replay._position import Position

__all__ = ["HOLD_LIMIT_EPOCHS", "Baselines"]

log = structlog.get_logger()

_NOTHING: Final = ("", -2, 0)  # below every row: nothing covered yet
# A held failure is raised once this many epochs of its domain wait behind it with no
# baseline in sight (a stream never "ends": it must not stall forever in silence).
HOLD_LIMIT_EPOCHS: Final = 100_000


@dataclass
class _Track:
    """One domain's baseline state."""

    pending: list[SnapshotChunk] = field(default_factory=list)
    baseline_id: int | None = None  # the baseline being applied
    next_index: int = 0
    expect_lo: Any = None
    covered: tuple[Any, ...] | None = None  # None: strict; else rows below are covered
    # While covered is set, the state's rows not covered yet do not change (their
    # events are left to their chunk): their keys, sorted by row, found once.
    index: list[tuple[Any, bytes]] = field(default_factory=list)
    held: InconsistentLog | None = None
    held_before: int = 0  # baselines completed when the failure was held


class Baselines:
    """The assembler's baseline bookkeeping (one per assembler)."""

    def __init__(self, *, fresh: bool) -> None:
        # trusted: the state is the whole store (given, or rebuilt by a finished
        # baseline); a fresh consumer's is not until a baseline completes.
        self.trusted = not fresh
        self._tracks: dict[int, _Track] = {}
        self.chunks_applied = 0
        self.completed = 0  # baselines applied to their last chunk
        # Chunk changes not handed out yet: they go out with the next changeset (of any
        # domain), so every changeset keeps a position of its own (a replica skips a
        # repeated one), and a domain that ended mid-baseline strands nothing.
        self.carry: dict[bytes, tuple[bytes, bytes]] = {}

    def _track(self, domain_id: int) -> _Track:
        track = self._tracks.get(domain_id)
        if track is None:
            track = self._tracks[domain_id] = _Track()
        return track

    # -- dispatch from the assembler ---------------------------------------------------

    def wants(self, domain_id: int) -> bool:
        """True if this domain's intervals must go through ``drain`` (not the fast path)."""
        if self.carry:
            return True
        track = self._tracks.get(domain_id)
        return track is not None and (bool(track.pending) or track.covered is not None
                                      or track.held is not None)

    def feed(self, asm: Assembler, chunk: SnapshotChunk, *, defer: bool) -> list[Changeset]:
        domain = asm._domain(chunk.domain_id)
        if chunk.actual_setsum() != chunk.setsum:
            raise InconsistentLog(
                f"snapshot chunk {chunk.index} of baseline {chunk.baseline_id:#x}: setsum of "
                f"its cells is {chunk.actual_setsum()}, the chunk says {chunk.setsum} "
                "(a cell was altered, lost or foreign)",
                domain_id=chunk.domain_id, epoch_seq=chunk.epoch_seq)
        track = self._track(chunk.domain_id)
        if chunk.epoch_seq < domain.applied_seq and track.baseline_id != chunk.baseline_id:
            return []  # an old baseline, already behind this consumer's position
        if chunk in track.pending:
            return []  # a duplicate delivery
        track.pending.append(chunk)
        if defer:
            return []
        return self.drain(asm, domain)

    def hold(self, domain_id: int, exc: InconsistentLog) -> bool:
        """A fresh consumer's chain broke before any baseline: hold the failure (the
        domain waits for one) instead of raising. False: raise it."""
        if self.trusted or exc.cell is None:
            return False
        track = self._track(domain_id)
        if track.covered is not None:
            return False
        track.held, track.held_before = exc, self.completed
        log.warning("cdc.replay_waiting_for_baseline", domain_id=f"{domain_id:016x}",
                    error=str(exc))
        return True

    def check_held(self, asm: Assembler) -> None:
        """At the end of a log: a failure held for a baseline that never came.

        A baseline of another domain completed after the failure was held supersedes
        it: that baseline is the whole store at a point after the held domain's records
        in the log (a crashed agent whose own baseline was cut short, and the restart's
        baseline). The held domain's unverifiable intervals are dropped, never applied.
        """
        for domain_id, track in self._tracks.items():
            if track.held is None:
                continue
            if self.completed <= track.held_before:
                raise track.held
            log.warning("cdc.replay_skipped_unverifiable", domain_id=f"{domain_id:016x}",
                        error=str(track.held))
            track.held, track.pending = None, []
            domain = asm._domain(domain_id)
            domain.epochs.clear()
            domain.chunks, domain.loose = [], []

    def drain(self, asm: Assembler, domain: _Domain) -> list[Changeset]:
        """Apply intervals and chunks of ``domain`` in log order, as far as possible."""
        track = self._track(domain.domain_id)
        done: list[Changeset] = []
        while True:
            if track.held is not None:
                if not any(c.index == 0 for c in track.pending):
                    if len(domain.epochs) > HOLD_LIMIT_EPOCHS:
                        raise track.held
                    return done  # wait for a baseline
                track.held = None
                self._open_window(asm, track)
            self._apply_ready(asm, domain, track)
            changeset = self._advance(asm, domain, track)
            if changeset is not None and self.carry:
                changeset = _with_carry(changeset, self.carry)
                self.carry = {}
            if changeset is None:
                if track.held is not None:
                    continue  # held just now: a chunk 0 may be waiting already
                return done
            done.append(changeset)

    # -- chunks --------------------------------------------------------------------------

    def _apply_ready(self, asm: Assembler, domain: _Domain, track: _Track) -> None:
        for chunk in sorted(track.pending, key=lambda c: (c.baseline_id, c.index)):
            if chunk.epoch_seq > domain.applied_seq:
                continue
            track.pending.remove(chunk)
            if chunk.epoch_seq < domain.applied_seq:
                if track.baseline_id == chunk.baseline_id:
                    raise InconsistentLog(
                        f"snapshot chunk {chunk.index} of baseline {chunk.baseline_id:#x} "
                        f"belongs after quiescence point {chunk.epoch_seq}, but arrived "
                        f"after {domain.applied_seq} was applied", domain_id=domain.domain_id,
                        epoch_seq=chunk.epoch_seq)
                continue
            self._apply(asm, domain, track, chunk)

    def _apply(self, asm: Assembler, domain: _Domain, track: _Track,
               chunk: SnapshotChunk) -> None:
        from replay._assembler import _encode_cell

        if chunk.index == 0:
            track.baseline_id, track.next_index, track.expect_lo = chunk.baseline_id, 0, None
            if not self.trusted and track.covered is None:
                self._open_window(asm, track)
        if chunk.baseline_id != track.baseline_id or chunk.index != track.next_index:
            if track.covered is not None:
                raise InconsistentLog(
                    f"snapshot chunk {chunk.index} of baseline {chunk.baseline_id:#x} came "
                    f"where chunk {track.next_index} of baseline {track.baseline_id or 0:#x} "
                    "was due (a chunk is missing)", domain_id=domain.domain_id,
                    epoch_seq=chunk.epoch_seq)
            # A trusted consumer joining a baseline midway: its chunks only confirm.
            track.baseline_id, track.expect_lo = chunk.baseline_id, chunk.lo
        if chunk.lo != track.expect_lo:
            raise InconsistentLog(
                f"snapshot chunk {chunk.index} starts at {chunk.lo!r}, but the previous one "
                f"ended at {track.expect_lo!r}: chunks must tile the rows",
                domain_id=domain.domain_id, epoch_seq=chunk.epoch_seq)
        track.next_index = chunk.index + 1
        track.expect_lo = chunk.hi
        lo = None if chunk.lo is None else row_order(*chunk.lo)
        hi = None if chunk.hi is None else row_order(*chunk.hi)
        state = asm._state
        listed = {_encode_cell((t, r, c)): v
                  for t, r, c, v in zip(chunk.data.column(0).to_pylist(),
                                        map(decode_key, chunk.data.column(1).to_pylist()),
                                        chunk.data.column(2).to_pylist(),
                                        chunk.data.column(3).to_pylist(), strict=True)}
        changes: dict[bytes, bytes] = {}
        before: dict[bytes, bytes] = {}
        keys = (_index_keys_in(track.index, lo, hi) if track.covered is not None
                else _state_keys_in(state, lo, hi))
        for key in keys:
            if key not in listed:
                changes[key], before[key] = b"", state[key]
        for key, value in listed.items():
            held = state.get(key, b"")
            if held != value:
                changes[key], before[key] = value, held
        for key, value in changes.items():
            if value:
                state[key] = value
            else:
                state.pop(key, None)
            first_before = self.carry[key][1] if key in self.carry else before[key]
            self.carry[key] = (value, first_before)
        if track.covered is not None:
            if chunk.last:
                track.covered = None
                track.index = []
                self.trusted = True
                self.completed += 1
            else:
                assert hi is not None
                track.covered = hi
        self.chunks_applied += 1

    def _open_window(self, asm: Assembler, track: _Track) -> None:
        track.covered = _NOTHING
        track.index = sorted((_key_order(key), key) for key in asm._state)

    # -- intervals -------------------------------------------------------------------------

    def _advance(self, asm: Assembler, domain: _Domain, track: _Track) -> Changeset | None:
        if track.covered is None:
            try:
                return asm._advance(domain)
            except InconsistentLog as exc:
                if self.hold(domain.domain_id, exc):
                    return None
                raise
        from replay._assembler import (
            _cell_keys,
            _check_counts,
            _check_setsums,
            _flat,
        )

        interval = asm._next_interval(domain)
        if interval is None:
            return None
        epochs, data, rest, late = interval
        base = np.uint64(domain.applied_end)
        ends = np.array([(r.end_id - domain.applied_end) % (1 << 64) for r in epochs],
                        dtype=np.uint64)
        rel = data.column("batch_id").to_numpy() - base
        epoch_index = np.searchsorted(ends, rel, side="right")
        _check_counts(domain, epochs, data, epoch_index)
        _check_setsums(domain, epochs, data, ends, base)
        covered = track.covered
        mask = [row_order(t, decode_key(r)) < covered
                for t, r in zip(data.column("table").to_pylist(),
                                data.column("row").to_pylist(), strict=True)]
        inside = data.filter(pa.array(mask, pa.bool_())) if data.num_rows else data
        keys = _cell_keys(inside)
        result = cancel_out(asm._state, keys, _flat(inside.column("old")),
                            _flat(inside.column("new")), np.zeros(inside.num_rows, np.int64), 1)
        if isinstance(result, BrokenChain):
            raise asm._cell_error(domain, epochs, inside, keys, result.key, result.why)
        changes, before = result[0].changes, result[0].before
        asm._commit(domain, epochs, changes, rest, late)
        last = epochs[-1]
        return _changeset(domain.domain_id, last.epoch_seq, data.num_rows, domain.position(),
                          changes, before)


def _changeset(domain_id: int, epoch_seq: int, event_count: int, position: Position,
               changes: dict[bytes, bytes], before: dict[bytes, bytes]) -> Changeset:
    """A one-interval changeset from encoded cells (final and initial values)."""
    from replay._assembler import Changeset
    from replay._bulk import NetChanges

    keys = list(changes)
    net = NetChanges(keys, [changes[k] for k in keys], [before[k] for k in keys],
                     [0, len(keys)], [event_count])
    return Changeset(domain_id, epoch_seq, event_count, position, net, 0)


def _encoded(changeset: Changeset) -> tuple[dict[bytes, bytes], dict[bytes, bytes]]:
    """The changeset's cells, encoded: (final values, initial values)."""
    net, i = changeset._net, changeset._index
    lo, hi = net.bounds[i], net.bounds[i + 1]
    keys = net.keys[lo:hi]
    return (dict(zip(keys, net.finals[lo:hi], strict=True)),
            dict(zip(keys, net.initials[lo:hi], strict=True)))


def _with_carry(changeset: Changeset, carry: dict[bytes, tuple[bytes, bytes]]
                ) -> Changeset:
    """The changeset with the chunk changes made before its interval folded in."""
    changes = {k: v for k, (v, _b) in carry.items()}
    before = {k: b for k, (_v, b) in carry.items()}
    finals, initials = _encoded(changeset)
    for key, final in finals.items():
        changes[key] = final
        before.setdefault(key, initials[key])
    keep = [k for k in changes if changes[k] != before[k]]
    return _changeset(changeset.domain_id, changeset.epoch_seq, changeset.event_count,
                      changeset.position, {k: changes[k] for k in keep},
                      {k: before[k] for k in keep})


def _key_order(key: bytes) -> tuple[Any, ...]:
    table, _column, row = key.split(b"\x00", 2)
    return row_order(table.decode(), decode_key(row))


def _index_keys_in(index: list[tuple[Any, bytes]], lo: Any, hi: Any) -> list[bytes]:
    """The keys of ``index`` (sorted by row) whose row lies in [lo, hi)."""
    start = 0 if lo is None else bisect.bisect_left(index, (lo,))
    end = len(index) if hi is None else bisect.bisect_left(index, (hi,))
    return [key for _order, key in index[start:end]]


def _state_keys_in(state: dict[bytes, bytes], lo: Any, hi: Any) -> list[bytes]:
    """The state's cell keys whose row lies in [lo, hi) (None: open)."""
    found = []
    for key in state:
        table, _column, row = key.split(b"\x00", 2)
        order = row_order(table.decode(), decode_key(row))
        if (lo is None or order >= lo) and (hi is None or order < hi):
            found.append(key)
    return found
