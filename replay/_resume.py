"""An assembler's whole replay state, taken out and put back: checkpoints and stripes.

``capture`` reads what an assembler holds at a log offset (after ``drain``): its state,
its frontier, the records it read whose interval is not complete yet (as codec
messages) and whether its state is the whole store. ``apply_state`` is the other way:
the assembler's hook for a ``sinks.wal3.StateDelta`` that ``read_log`` yields on a
compacted or collected log.

- A checkpoint is adopted by a fresh assembler (no state, no position): it takes the
  cells, the frontier and the carried records, and hands out one changeset holding
  every cell (so a replica built from nothing learns them). An assembler that already
  holds a state (it resumes) skips it.
- A stripe is applied by an assembler standing exactly where it begins (its frontier
  and the cells it changes as they were there): the cells take their values after it,
  the frontier moves, the records pending are the stripe's carried ones. One changeset
  goes out per domain the stripe moved (the cells with the last). An assembler at or
  past where the stripe ends skips it; any other raises ``InconsistentLog`` naming the
  retained points around it: no reader gets a wrong state.

This module is the one place outside ``_assembler.py`` that touches its internals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from replay._bulk import NetChanges
from replay._errors import InconsistentLog
from replay._position import Frontier
from sinks.codec import EventBatch, decode, encode_epoch, encode_events, encode_snapshot
from sinks.wal3 import StateDelta

if TYPE_CHECKING:
    from replay._assembler import Assembler, Changeset

__all__ = ["Captured", "StateDelta", "apply_state", "capture", "frontier_of"]

Points = dict[int, tuple[int, int]]  # domain -> (epoch_seq, end_id)


@dataclass(frozen=True)
class Captured:
    """What an assembler holds at one log offset."""

    state: dict[bytes, bytes]  # encoded cell -> tagged value (present cells only)
    frontier: str  # positions without "seen" hints, domains with nothing applied left out
    carried: tuple[bytes, ...]  # codec messages of the records pending
    trusted: bool


def _points(asm: Assembler) -> Points:
    return {d.domain_id: (d.applied_seq, d.applied_end) for d in asm._domains.values()
            if d.applied_seq or d.applied_end}


def _token(points: Points) -> str:
    return ",".join(f"{d:x}:{s:x}:{e:x}" for d, (s, e) in sorted(points.items()))


def _parse(token: str) -> Points:
    return {p.domain_id: (p.epoch_seq, p.end_id) for p in Frontier.parse(token)}


def frontier_of(asm: Assembler) -> str:
    """The assembler's frontier as ``capture`` writes it."""
    return _token(_points(asm))


def capture(asm: Assembler, offset: int) -> Captured:
    """The assembler's replay state (call ``drain`` first). Raises ``InconsistentLog``
    if a baseline is half applied there (its coverage is not part of a checkpoint)."""
    baselines = asm._baselines
    tracks = baselines._tracks
    if baselines.carry or any(t.covered is not None or t.held is not None
                              for t in tracks.values()):
        raise InconsistentLog(
            f"offset {offset} falls inside a baseline snapshot (or a consumer waiting for "
            "one): a checkpoint cannot stand there; move the cursor past the baseline's "
            "last chunk")
    carried: list[bytes] = []
    for domain_id in sorted(asm._domains):
        domain = asm._domains[domain_id]
        carried += [encode_epoch(domain.epochs[s]) for s in sorted(domain.epochs)]
        batches = list(domain.chunks)
        if domain.loose:
            batches.append(EventBatch.from_events(domain.loose).data)
        for batch in batches:
            if batch.num_rows:
                carried.append(encode_events(EventBatch(batch)))
        track = tracks.get(domain_id)
        if track is not None:
            carried += [encode_snapshot(c) for c in track.pending]
    return Captured(dict(asm._state), frontier_of(asm), tuple(carried), baselines.trusted)


def apply_state(asm: Assembler, delta: StateDelta) -> list[Changeset]:
    """Apply a checkpoint or stripe to ``asm`` (see the module docstring)."""
    current = _points(asm)
    after = _parse(delta.after)
    if delta.kind == "checkpoint":
        if current or asm._state:
            return []  # a resuming consumer holds its own state
        return _enter(asm, delta, {}, after)
    before = _parse(delta.before)
    state = asm._state
    holds_before = all(state.get(k, b"") == b
                       for k, b in zip(delta.keys, delta.befores, strict=True))
    if current == before and holds_before:
        return _enter(asm, delta, current, after)
    past = all(d in current and current[d][0] >= s for d, (s, _e) in after.items())
    if past and (current != before or all(state.get(k, b"") == v for k, v in
                                          zip(delta.keys, delta.values, strict=True))):
        return []
    raise InconsistentLog(
        f"the consumer stands at {_token(current) or 'the start'}, which is not a retained "
        f"point of this compacted log: the stripe it reached goes from offset {delta.lo} "
        f"(frontier {delta.before or 'the start'}) to offset {delta.hi} (frontier "
        f"{delta.after}); resume from one of those retained points")


def _enter(asm: Assembler, delta: StateDelta, current: Points, after: Points
           ) -> list[Changeset]:
    from replay._assembler import _Domain

    state = asm._state
    for key, value in zip(delta.keys, delta.values, strict=True):
        if value:
            state[key] = value
        else:
            state.pop(key, None)
    # The records pending are exactly the ones carried at the stripe's end.
    for domain in asm._domains.values():
        domain.epochs.clear()
        domain.chunks, domain.loose = [], []
    for track in asm._baselines._tracks.values():
        track.pending = []
    asm._pending_events = 0
    for domain_id, (seq, end) in after.items():
        if domain_id not in asm._domains:
            asm._domains[domain_id] = _Domain(domain_id)
        asm._domains[domain_id].applied_seq = seq
        asm._domains[domain_id].applied_end = end
    asm._baselines.trusted = delta.trusted
    for message in delta.carried:
        record = decode(message)
        asm.feed(record, defer=True)
    moved = sorted(d for d in after if current.get(d) != after[d])
    if not moved:
        return []
    from replay._assembler import Changeset

    keys = list(delta.keys)
    done = []
    for i, domain_id in enumerate(moved):
        last = i == len(moved) - 1
        net = (NetChanges(keys, list(delta.values), list(delta.befores), [0, len(keys)],
                          [delta.replaced_events]) if last
               else NetChanges([], [], [], [0, 0], [0]))
        domain = asm._domains[domain_id]
        done.append(Changeset(domain_id, domain.applied_seq,
                              delta.replaced_events if last else 0, domain.position(), net, 0))
    return done
