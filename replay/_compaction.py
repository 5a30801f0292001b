"""Checkpoints and logical compaction of a wal3 log, against its cursors (seed 004).

Cursors are the vantage points. For retained points ``P1 < ... < Pn`` (log offsets a
reader may stand at), the log is replayed once through the ``Assembler`` (every
interval verified as any consumer would), its state captured at each point
(``replay._resume.capture``), and written beside the log (``sinks.wal3._state``): a
checkpoint at ``P1``, then one stripe per pair of consecutive points holding only the
net change of each cell. Once the index naming them is published (one manifest
compare-and-swap), garbage collection may free every fragment wholly below ``Pn``,
after checking that what the checkpoint and stripes replaced (their record setsums)
is exactly what the log collected plus what it still holds below ``Pn``.

Three entry points share that run:

- ``checkpoint_log(uri, at=None)``: a checkpoint at ``at`` (default: the lowest cursor,
  else the log's end); nothing collected.
- ``collect_log(uri, keep_at_least=None)``: a checkpoint at the lowest cursor (or
  ``keep_at_least``), then garbage collection below it (``cdc-agent log gc``).
- ``compact_log(uri)``: every cursor is a retained point; collect below the newest.

Cursors already standing in a compacted part of the log keep their retained points.
A crash anywhere leaves the old state published or the new one, never a mix: objects
are written first (content-addressed), published by one compare-and-swap, and what
was superseded is deleted after; a rerun finishes or redoes the work (same objects).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any

from replay._assembler import Assembler, Changeset
from replay._resume import Captured, capture
from sinks import Setsum
from sinks.codec import EventBatch, decode
from sinks.codec import records as expand_records
from sinks.objstore import ObjectStore
from sinks.wal3 import (
    CorruptState,
    GarbageCollector,
    GcReport,
    LogReader,
    Manifest,
    NotARetainedPoint,
    StateContention,
    StateDelta,
    StateIndex,
    check_accounting,
    iter_state_deltas,
    load_state_index,
    moved_setsum,
    publish_state_index,
    record_setsum,
    write_state_objects,
)
from sinks.wal3._state import check_chain, state_moves

__all__ = ["CompactionReport", "checkpoint_log", "collect_log", "compact_log"]

_DRAIN_EVENTS = 1 << 16


@dataclass
class CompactionReport:
    """What a checkpoint, collection or compaction wrote and freed."""

    points: list[int]
    index: str = ""
    checkpoint_cells: int = 0
    stripe_cells: list[int] = field(default_factory=list)
    events_replaced: int = 0
    records_replaced: int = 0
    bytes_written: int = 0
    gc: GcReport | None = None


@dataclass
class _Span:
    """What the records of one span [lo, hi) held (the replaced accounting)."""

    records: int = 0
    events: int = 0
    setsum: Setsum = field(default_factory=Setsum)

    def add(self, records: int, events: int, setsum: Setsum) -> None:
        self.records += records
        self.events += events
        self.setsum = self.setsum + setsum


@dataclass
class _Attribution:
    """Which domain's changesets changed each cell over one span: per cell the runs of
    consecutive changes by one domain, ``[domain, value before, value after]``, and the
    domains in the order their first changeset went out, with their event counts."""

    order: dict[int, int] = field(default_factory=dict)
    runs: dict[bytes, list[list[Any]]] = field(default_factory=dict)

    def add(self, changesets: list[Changeset]) -> None:
        runs = self.runs
        for changeset in changesets:
            domain = changeset.domain_id
            self.order[domain] = self.order.get(domain, 0) + changeset.event_count
            net, i = changeset._net, changeset._index
            lo, hi = net.bounds[i], net.bounds[i + 1]
            for key, before, after in zip(net.keys[lo:hi], net.initials[lo:hi],
                                          net.finals[lo:hi], strict=True):
                cell = runs.get(key)
                if cell is None:
                    runs[key] = [[domain, before, after]]
                elif cell[-1][0] == domain:
                    cell[-1][2] = after
                else:
                    cell.append([domain, before, after])

    def rows(self) -> list[tuple[int, bytes, bytes, bytes]]:
        """``(domain, cell, before, after)`` in changeset order: a cell changed by
        several domains one after the other (in the order their changesets go out)
        keeps a row per domain; one they changed interleaved goes whole with the last
        domain that changed it (no per-domain split of it is a state the log held)."""
        rank = {d: i for i, d in enumerate(self.order)}
        out = []
        for key, runs in self.runs.items():
            ranks = [rank[r[0]] for r in runs]
            if all(a < b for a, b in itertools.pairwise(ranks)):
                out += [(rank[d], key, d, b, a) for d, b, a in runs if b != a]
            elif runs[0][1] != runs[-1][2]:
                d = runs[-1][0]
                out.append((rank[d], key, d, runs[0][1], runs[-1][2]))
        out.sort(key=lambda row: (row[0], row[1]))
        return [(d, k, b, a) for _r, k, d, b, a in out]


def _reader(store_or_uri: ObjectStore | str, prefix: str, endpoint_url: str | None
            ) -> LogReader:
    return LogReader(store_or_uri, prefix, endpoint_url=endpoint_url)


def _verify_published(reader: LogReader, expected: str | None) -> Any:
    """The check a collection runs before it frees anything: the manifest still points
    at the index ``expected`` (None: whatever it points at), and what that index's
    checkpoint and stripes replaced balances with what the log collected and holds."""
    def verify(current: Manifest) -> None:
        published = load_state_index(reader.store, current)
        if expected is not None and (published is None or published.path != expected):
            raise StateContention("another checkpoint or compaction published since; "
                                  "nothing was collected: run it again")
        if published is not None:
            check_accounting(reader, current, published)
    return verify


def _finish_collection(reader: LogReader) -> GcReport | None:
    """Finish a collection a crash left half done (its garbage file is installed)."""
    collector = GarbageCollector(reader.store)
    garbage, _ = collector.load_garbage()
    if garbage.is_empty():
        return None
    return collector.collect(verify=_verify_published(reader, None))


def _cursor_positions(reader: LogReader, keep_at_least: int | None = None) -> list[int]:
    """The cursors' positions (and ``keep_at_least``), each checked to lie in the log
    (read before the manifest, as the garbage collector does: ``CorruptCursor`` names
    one past the end)."""
    collector = GarbageCollector(reader.store)
    positions = collector.positions(keep_at_least)
    collector._check_positions(positions, reader.manifest())
    return sorted(set(positions.values()))


def checkpoint_log(store_or_uri: ObjectStore | str, at: int | None = None, *, prefix: str = "",
                   endpoint_url: str | None = None) -> CompactionReport:
    """Write and publish a checkpoint at offset ``at`` (default: the lowest cursor, or
    the log's end when there is none). Collects nothing. Cursors below ``at`` stay
    retained points (with a stripe between each two)."""
    reader = _reader(store_or_uri, prefix, endpoint_url)
    _finish_collection(reader)
    cursors = _cursor_positions(reader)
    manifest = reader.manifest()
    if at is None:
        at = cursors[0] if cursors else manifest.next_offset
    # Every cursor below the new limit must stay a retained point: those below ``at``,
    # and those in the already collected part.
    points = sorted({at, *(c for c in cursors if c < max(at, manifest.oldest_offset))})
    return _run(reader, points, collect=False)


def collect_log(store_or_uri: ObjectStore | str, keep_at_least: int | None = None, *,
                prefix: str = "", endpoint_url: str | None = None) -> CompactionReport:
    """Checkpoint at the lowest cursor (lowered to ``keep_at_least``), then collect the
    fragments below it. Nothing to collect (no cursor, no bound): an empty report."""
    reader = _reader(store_or_uri, prefix, endpoint_url)
    _finish_collection(reader)
    cursors = _cursor_positions(reader)
    bounds = _cursor_positions(reader, keep_at_least)
    if not bounds:
        return CompactionReport([])
    manifest = reader.manifest()
    cutoff = min(bounds)
    points = sorted({cutoff, *(c for c in cursors if c < manifest.oldest_offset)})
    return _run(reader, points, collect=True)


def compact_log(store_or_uri: ObjectStore | str, *, prefix: str = "",
                endpoint_url: str | None = None, points: list[int] | None = None,
                collect: bool = True) -> CompactionReport:
    """Compact the log against its cursors (or ``points``): a checkpoint at the lowest,
    a stripe between each two, and (``collect``) the fragments below the newest freed."""
    reader = _reader(store_or_uri, prefix, endpoint_url)
    _finish_collection(reader)
    chosen = sorted(set(points if points is not None else _cursor_positions(reader)))
    if not chosen:
        raise ValueError(
            f"{reader.store.describe()} has no cursor: compaction keeps the states readers "
            "stand at, so give it points (or create the readers' cursors first)")
    return _run(reader, chosen, collect=collect)


# -- the run ----------------------------------------------------------------------------------

def _run(reader: LogReader, points: list[int], *, collect: bool) -> CompactionReport:
    manifest = reader.manifest()
    old = load_state_index(reader.store, manifest)
    captures, spans, first, attributions = _replay(reader, manifest, old, points)
    deltas = _deltas(points, captures, spans, first, attributions)
    # Each stripe's rows must lead to the state captured at its end (a bug here would
    # otherwise be published): the same check every reader runs.
    list(check_chain(deltas, [f"the new {d.kind} at offset {d.hi}" for d in deltas]))
    index = write_state_objects(reader.store, deltas)
    index = publish_state_index(reader.store, index, old.path if old is not None else None)
    report = CompactionReport(points, index.path, len(deltas[0].keys),
                              [len(d.keys) for d in deltas[1:]],
                              sum(d.replaced_events for d in deltas),
                              sum(d.replaced_records for d in deltas),
                              sum(e.num_bytes for e in index.entries))
    if collect:
        report.gc = GarbageCollector(reader.store).collect(
            keep_at_least=points[-1], served=frozenset(points),
            verify=_verify_published(reader, index.path))
    return report


def _replay(reader: LogReader, manifest: Manifest, old: StateIndex | None, points: list[int]
            ) -> tuple[list[Captured], list[_Span], int, list[_Attribution]]:
    """Replay the log from its start, capturing the assembler at each point; return the
    captures, the spans' accounting (below P1, then between points), the log's first
    offset and which domain changed which cells in each span."""
    end = manifest.next_offset
    for p in points:
        if p > end or p < 1:
            raise ValueError(f"offset {p} is outside {reader.store.describe()} (its records "
                             f"end before offset {end})")
    use_old = old is not None and manifest.oldest_offset > old.entries[0].lo
    if old is None and manifest.collected != Setsum():
        raise CorruptState(
            f"{reader.store.describe()} was garbage-collected without a checkpoint (by wal3's "
            "collector alone): the state before its first record is lost, so no checkpoint "
            "can be built; rebuild the log from a baseline snapshot")
    asm = Assembler()
    captures: list[Captured] = []
    spans = [_Span() for _ in points]
    attributions = [_Attribution() for _ in points]
    targets = iter(points)
    target: int | None = next(targets)
    span = 0

    def reach(offset: int) -> None:
        """Capture every point at or below ``offset`` (the next record's)."""
        nonlocal target, span
        while target is not None and target <= offset:
            attribute(asm.drain())
            captures.append(capture(asm, target))
            span += 1
            target = next(targets, None)

    def attribute(changesets: list[Changeset]) -> None:
        if span:  # the checkpoint's span needs none
            attributions[span].add(changesets)

    if use_old and old is not None:
        first = old.entries[0].lo
        for p in points:
            if p < old.limit and p not in old.points:
                raise NotARetainedPoint(f"offset {p} was compacted and is not a retained point: "
                                        f"{old.nearest(p)}")
        raw_begin = old.limit
        for delta in iter_state_deltas(reader.store, old):
            reach(delta.lo if delta.kind == "stripe" else first)
            if target is None:
                break
            attribute(asm.feed(delta))
            spans[span].add(delta.replaced_records, delta.replaced_events,
                            Setsum.from_hexdigest(delta.replaced_setsum))
    else:
        first = manifest.oldest_offset
        raw_begin = first
    pending = 0
    fragments = reader.scan(raw_begin, manifest=manifest) if target is not None else []
    for fragment in fragments:
        records = reader.fetch(fragment)
        # A fragment wholly inside one span adds its setsum (checked by fetch) at once.
        whole = (target is not None and raw_begin <= fragment.start < target
                 and fragment.limit <= target)
        if whole:
            spans[span].add(len(records), 0, fragment.setsum)
        for record in records:
            if record.offset < raw_begin:
                continue
            reach(record.offset)
            if target is None:
                break
            message = decode(record.body)
            events = len(message) if isinstance(message, EventBatch) else 0
            if whole:
                spans[span].events += events
            else:
                spans[span].add(1, events, record_setsum(record.offset, record.timestamp_us,
                                                         [record.body]))
            for item in expand_records(message):  # a run of epoch records: each one
                asm.feed(item, defer=True)
            pending += events
            if pending >= _DRAIN_EVENTS:
                attribute(asm.drain())
                pending = 0
        if target is None:
            break
    reach(end)
    return captures, spans, first, attributions


def _deltas(points: list[int], captures: list[Captured], spans: list[_Span], first: int,
            attributions: list[_Attribution]) -> list[StateDelta]:
    out: list[StateDelta] = []
    running = Setsum()
    previous: Captured | None = None
    lo = first
    for point, cap, span, attribution in zip(points, captures, spans, attributions,
                                             strict=True):
        carry = tuple(sorted((k, v, b) for k, (v, b) in cap.carry.items()))
        extra: dict[str, Any] = {
            "carry": carry, "baseline": cap.baseline,
            "domain_order": cap.domains if list(cap.domains) != sorted(cap.domains) else ()}
        if previous is None:
            keys = sorted(cap.state)
            values = [cap.state[k] for k in keys]
            befores = [b""] * len(keys)
            kind, before = "checkpoint", ""
        elif len(attribution.order) <= 1 and not (previous.carry or carry or cap.baseline
                                                  or extra["domain_order"]):
            # Version 1: the net change of each cell (one domain moved, or none).
            old_state, new_state = previous.state, cap.state
            keys = sorted(k for k in old_state.keys() | new_state.keys()
                          if old_state.get(k, b"") != new_state.get(k, b""))
            values = [new_state.get(k, b"") for k in keys]
            befores = [old_state.get(k, b"") for k in keys]
            kind, before = "stripe", previous.frontier
        else:
            # Version 2: each domain's changesets, net per cell, in the order they went
            # out; the carry at the end is undone in them (the reader redoes it).
            rows = attribution.rows()
            keys = [k for _d, k, _b, _a in rows]
            befores = [b for _d, _k, b, _a in rows]
            values = [a for _d, _k, _b, a in rows]
            extra.update(domains=tuple(d for d, _k, _b, _a in rows),
                         order=tuple(attribution.order.items()))
            kind, before = "stripe", previous.frontier
        delta = StateDelta(
            kind=kind, lo=lo, hi=point, before=before, after=cap.frontier,
            trusted=cap.trusted, keys=tuple(keys), values=tuple(values),
            befores=tuple(befores), carried=cap.carried, state_setsum="",
            replaced_records=span.records, replaced_events=span.events,
            replaced_setsum=span.setsum.hexdigest(), **extra)
        moves = state_moves(delta, previous.carry if previous is not None else {})
        if previous is not None:
            _check_moves(previous.state, cap.state, moves, point)
        else:
            running = Setsum()
        running = moved_setsum(running, *moves)
        out.append(replace(delta, state_setsum=running.hexdigest()))
        previous, lo = cap, point
    return out


def _check_moves(old: dict[bytes, bytes], new: dict[bytes, bytes],
                 moves: tuple[list[bytes], list[bytes], list[bytes]], point: int) -> None:
    """The state a stripe's rows lead to is the one captured at its end."""
    keys, befores, values = moves
    want = {k for k in old.keys() | new.keys() if old.get(k, b"") != new.get(k, b"")}
    got = dict(zip(keys, zip(befores, values, strict=True), strict=True))
    if set(got) != want or any(got[k] != (old.get(k, b""), new.get(k, b"")) for k in want):
        raise CorruptState(
            f"the changesets replayed up to offset {point} do not add up to the state "
            "there; nothing was written (a bug: please report it with the log)")


def describe(report: CompactionReport) -> dict[str, Any]:
    """The report as plain data (for the command line)."""
    return {"points": report.points, "index": report.index,
            "checkpoint_cells": report.checkpoint_cells, "stripe_cells": report.stripe_cells,
            "events_replaced": report.events_replaced,
            "records_replaced": report.records_replaced, "bytes_written": report.bytes_written}
