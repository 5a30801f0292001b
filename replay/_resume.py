"""An assembler's whole replay state, taken out and put back: checkpoints and stripes.

``capture`` reads what an assembler holds at a log offset (after ``drain``): its state,
its frontier, the records it read whose interval is not complete yet (as codec
messages), whether its state is the whole store, the baseline chunk changes applied
but not handed out yet (the *carry*) and the bookkeeping of a baseline it is still
applying. ``apply_state`` is the other way: the assembler's hook for a
``sinks.wal3.StateDelta`` that ``read_log`` yields on a compacted or collected log.

- A checkpoint is adopted by a fresh assembler (no state, no position): it takes the
  cells, the frontier, the carried records, the carry and the baseline bookkeeping,
  and hands out one changeset holding every cell as the uncompacted log's changesets
  showed them (carried cells at their value before the carry). An assembler that
  already holds a state (it resumes) skips it.
- A stripe is applied by an assembler standing exactly where it begins (its frontier,
  and the cells it changes as its changesets showed them there): its rows replay each
  domain's changesets (net per cell), one changeset per domain in the order the
  uncompacted log's went out, and the assembler then holds what a reader of the
  uncompacted log holds at the stripe's end. An assembler at or past where the stripe
  ends skips it; any other raises ``InconsistentLog`` naming the retained points
  around it: no reader gets a wrong state.

This module is the one place outside ``_assembler.py`` that touches its internals.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from replay._bulk import NetChanges
from replay._errors import InconsistentLog
from replay._position import Frontier
from sinks.codec import (
    EventBatch,
    decode,
    decode_key,
    encode_epoch,
    encode_events,
    encode_key,
    encode_snapshot,
    records,
)
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
    # Baseline chunk changes not handed out yet: cell -> (state value, value shown).
    carry: dict[bytes, tuple[bytes, bytes]] = field(default_factory=dict)
    baseline: str = ""  # the baseline bookkeeping (compact JSON; "" when there is none)
    domains: tuple[int, ...] = ()  # the order the reader met its domains

    def view(self) -> dict[bytes, bytes]:
        """The state as the changesets handed out so far show it (carry undone)."""
        return _view(self.state, self.carry)


def _view(state: dict[bytes, bytes], carry: dict[bytes, tuple[bytes, bytes]]
          ) -> dict[bytes, bytes]:
    if not carry:
        return state
    view = dict(state)
    for key, (_value, shown) in carry.items():
        if shown:
            view[key] = shown
        else:
            view.pop(key, None)
    return view


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
    if a consumer given nothing waits there for a baseline (its replay broke on a cell
    the log never introduced: that failure cannot be carried)."""
    baselines = asm._baselines
    tracks = baselines._tracks
    if any(t.held is not None for t in tracks.values()):
        raise InconsistentLog(
            f"at offset {offset} a consumer given nothing waits for a baseline snapshot "
            "(the log's events before it change cells it never introduced): no state can "
            "stand there; move the cursor past the baseline's last chunk")
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
    return Captured(dict(asm._state), frontier_of(asm), tuple(carried), baselines.trusted,
                    dict(baselines.carry), _baseline_text(asm), tuple(asm._domains))


def _baseline_text(asm: Assembler) -> str:
    """The baseline bookkeeping a reader of the uncompacted log holds here, as compact
    JSON: per domain the baseline being applied, the chunk due and where it must start,
    and whether a fresh consumer's window is open (rows below ``expect_lo`` covered).
    The window's index of uncovered keys is the state's keys there, except the
    differences listed (cells another domain created or removed meanwhile)."""
    from replay._baseline import _NOTHING, _key_order

    baselines = asm._baselines
    tracks = []
    for domain_id in sorted(baselines._tracks):
        t = baselines._tracks[domain_id]
        if t.baseline_id is None and t.covered is None and not t.next_index \
                and t.expect_lo is None:
            continue
        entry: dict[str, Any] = {
            "domain": domain_id, "baseline": t.baseline_id, "next": t.next_index,
            "expect_lo": None if t.expect_lo is None else _bound(t.expect_lo),
            "window": None}
        if t.covered is not None:
            start = _NOTHING if t.covered == _NOTHING else t.covered
            if t.covered != _NOTHING and (t.expect_lo is None
                                          or t.covered != _order(t.expect_lo)):
                raise InconsistentLog(  # the tiling guarantees it; never silently wrong
                    f"a baseline of domain {domain_id:x} covers rows up to {t.covered!r} "
                    f"but expects its next chunk at {t.expect_lo!r}")
            uncovered = {k for k in asm._state if _key_order(k) >= start}
            indexed = {k for o, k in t.index if o >= start}
            entry["window"] = {
                "from": "nothing" if t.covered == _NOTHING else "expect_lo",
                "index_only": sorted(k.hex() for k in indexed - uncovered),
                "state_only": sorted(k.hex() for k in uncovered - indexed)}
        tracks.append(entry)
    if not tracks and not baselines.completed and not baselines.chunks_applied:
        return ""
    return json.dumps({"completed": baselines.completed, "chunks": baselines.chunks_applied,
                       "tracks": tracks}, sort_keys=True, separators=(",", ":"))


def _bound(bound: Any) -> list[Any]:
    table, row = bound
    return [table, None if row is None else encode_key(row).hex()]


def _unbound(obj: Any) -> Any:
    table, row = obj
    return (table, None if row is None else decode_key(bytes.fromhex(row)))


def _order(bound: Any) -> Any:
    from sinks.codec import row_order

    return row_order(*bound)


def _restore_baseline(asm: Assembler, text: str) -> None:
    """Put back the bookkeeping ``_baseline_text`` wrote (tracks not listed: none)."""
    from replay._baseline import _NOTHING, _key_order, _Track

    baselines = asm._baselines
    obj: Any = json.loads(text)
    baselines.completed = int(obj["completed"])
    baselines.chunks_applied = int(obj["chunks"])
    baselines._tracks = {}
    for entry in obj["tracks"]:
        track = _Track()
        track.baseline_id = entry["baseline"]
        track.next_index = int(entry["next"])
        track.expect_lo = None if entry["expect_lo"] is None else _unbound(entry["expect_lo"])
        window = entry["window"]
        if window is not None:
            track.covered = _NOTHING if window["from"] == "nothing" else _order(track.expect_lo)
            start = track.covered
            keys = {k for k in asm._state if _key_order(k) >= start}
            keys -= {bytes.fromhex(k) for k in window["state_only"]}
            keys |= {bytes.fromhex(k) for k in window["index_only"]}
            track.index = sorted((_key_order(k), k) for k in keys)
        baselines._tracks[int(entry["domain"])] = track


def apply_state(asm: Assembler, delta: StateDelta) -> list[Changeset]:
    """Apply a checkpoint or stripe to ``asm`` (see the module docstring)."""
    current = _points(asm)
    after = _parse(delta.after)
    if delta.kind == "checkpoint":
        if current or asm._state:
            return []  # a resuming consumer holds its own state
        return _enter(asm, delta, {}, after)
    before = _parse(delta.before)
    view = _view(asm._state, asm._baselines.carry)
    first: dict[bytes, bytes] = {}
    last: dict[bytes, bytes] = {}
    for key, value, was in zip(delta.keys, delta.values, delta.befores, strict=True):
        first.setdefault(key, was)
        last[key] = value
    holds_before = all(view.get(k, b"") == b for k, b in first.items())
    if current == before and holds_before:
        return _enter(asm, delta, current, after)
    if _between(delta, current, before, after, view):
        return _enter(asm, delta, current, after)
    past = all(d in current and current[d][0] >= s for d, (s, _e) in after.items())
    if past and (current != before or all(view.get(k, b"") == v for k, v in last.items())):
        return []
    raise InconsistentLog(
        f"the consumer stands at {_token(current) or 'the start'}, which is not a retained "
        f"point of this compacted log: the stripe it reached goes from offset {delta.lo} "
        f"(frontier {delta.before or 'the start'}) to offset {delta.hi} (frontier "
        f"{delta.after}); resume from one of those retained points")


def _between(delta: StateDelta, current: Points, before: Points, after: Points,
             view: dict[bytes, bytes]) -> bool:
    """True if the consumer applied this stripe's changesets of its first few domains
    (version 2, in order) and stored that: a replica that crashed between them. It then
    gets the others' changesets."""
    if not delta.order:
        return False
    ordered = [d for d, _n in delta.order]
    done = 0
    while done < len(ordered) and current.get(ordered[done]) == after.get(ordered[done]):
        done += 1
    if done in (0, len(ordered)):
        return False
    for domain_id in set(after) | set(before) | set(current):
        want = after if domain_id in ordered[:done] else before
        if current.get(domain_id) != want.get(domain_id):
            return False
    applied = set(ordered[:done])
    expected: dict[bytes, bytes] = {}
    for key, value, was, domain_id in zip(delta.keys, delta.values, delta.befores,
                                          delta.domains, strict=True):
        if domain_id in applied:
            expected[key] = value
        else:
            expected.setdefault(key, was)
    return all(view.get(k, b"") == v for k, v in expected.items())


def _enter(asm: Assembler, delta: StateDelta, current: Points, after: Points
           ) -> list[Changeset]:
    from replay._assembler import _Domain

    # The changeset view first (the state with this reader's carry undone): the rows
    # move it, each domain's after the other's, as the uncompacted changesets did.
    state = asm._state
    for key, (_value, was_shown) in asm._baselines.carry.items():
        _put(state, key, was_shown)
    for key, value in zip(delta.keys, delta.values, strict=True):
        _put(state, key, value)
    view_keys = list(delta.keys)
    if delta.kind == "checkpoint":
        listed = set(delta.keys)
        view_keys += [k for k, _v, _b in delta.carry if k not in listed]
    shown = {k: state.get(k, b"") for k in view_keys}
    for key, value, was in delta.carry:  # then the chunk changes not shown yet
        shown.setdefault(key, was)
        if delta.kind == "checkpoint":
            shown[key] = was
        _put(state, key, value)
    asm._baselines.carry = {k: (v, b) for k, v, b in delta.carry}
    # The records pending are exactly the ones carried at the stripe's end.
    for domain in asm._domains.values():
        domain.epochs.clear()
        domain.chunks, domain.loose = [], []
    if delta.baseline:
        _restore_baseline(asm, delta.baseline)
    for track in asm._baselines._tracks.values():
        track.pending = []
    asm._pending_events = 0
    if delta.domain_order:  # changesets go out in the order the domains were met
        domains = asm._domains
        asm._domains = {d: domains.get(d) or _Domain(d) for d in delta.domain_order}
        asm._domains.update((d, v) for d, v in domains.items() if d not in asm._domains)
    for domain_id, (seq, end) in after.items():
        if domain_id not in asm._domains:
            asm._domains[domain_id] = _Domain(domain_id)
        asm._domains[domain_id].applied_seq = seq
        asm._domains[domain_id].applied_end = end
    asm._baselines.trusted = delta.trusted
    for message in delta.carried:
        for record in records(decode(message)):  # a run of epoch records: each one
            asm.feed(record, defer=True)
    moved = sorted(d for d in after if current.get(d) != after[d])
    if not moved:
        return []
    from replay._assembler import Changeset

    if delta.kind == "checkpoint":
        # Every cell with the last domain, the others' changesets empty.
        keys = [k for k in view_keys if shown[k]]
        counts = [0] * (len(moved) - 1) + [delta.replaced_events]
        net = NetChanges(keys, [shown[k] for k in keys], [b""] * len(keys),
                         [0] * len(moved) + [len(keys)], counts)
        return [Changeset(d, asm._domains[d].applied_seq, n, asm._domains[d].position(), net, i)
                for i, (d, n) in enumerate(zip(moved, counts, strict=True))]
    plan: list[tuple[int, int | None, int]]
    if delta.order:  # version 2: each domain its own cells, in the log's order
        ordered = [d for d, _n in delta.order if d in moved]
        events = dict(delta.order)
        ordered += [d for d in moved if d not in ordered]
        plan = [(d, d, events.get(d, 0)) for d in ordered]
    else:  # version 1: every cell with the last domain
        plan = [(d, -1, 0) for d in moved[:-1]] + [(moved[-1], None, delta.replaced_events)]
    rows = [delta.rows_of(sel) if sel != -1 else [] for _d, sel, _n in plan]
    keys = [delta.keys[i] for part in rows for i in part]
    bounds = [0]
    for part in rows:
        bounds.append(bounds[-1] + len(part))
    net = NetChanges(keys, [delta.values[i] for part in rows for i in part],
                     [delta.befores[i] for part in rows for i in part], bounds,
                     [n for _d, _s, n in plan])
    return [Changeset(d, asm._domains[d].applied_seq, n, asm._domains[d].position(), net, i)
            for i, (d, _s, n) in enumerate(plan)]


def _put(state: dict[bytes, bytes], key: bytes, value: bytes) -> None:
    if value:
        state[key] = value
    else:
        state.pop(key, None)
