"""The sidecar's baseline snapshot: two requests per chunk, and the client's loop.

The sidecar never reads the store, so the client reads each chunk itself while the
sidecar holds new batches back:

| request | fields | reply fields |
|---|---|---|
| `snapshot_hold` | `journal` (optional) | `point`: [epoch_seq, end_id], once no batch is open |
| `snapshot_chunk` | see below | `baseline`: the id to send with the next chunks |

`snapshot_chunk` fields: `baseline` (null for the first chunk), `index` (0, 1, ...),
`lo` and `hi` (bounds: null or [table, row or null]), `cells` ([[table, row, column,
value], ...]), optional `cancel`: true (the chunk could not be read: let writers go).

`snapshot_hold` holds new batches back (other connections' `open` waits) and answers
once every open batch has closed; the client then lists the rows from `lo` (its store's
``list_cells``) and sends them with `snapshot_chunk`, which records the chunk at that
point and lets the writers go. A connection that ends while holding lets them go too.
The last chunk (``hi`` null) is followed by a quiescence point the sidecar makes.

A journaled baseline (``SidecarClient.snapshot(journal=URI)``) sends `journal` (an
object store URI) with its first `snapshot_hold`. The sidecar owns the agent whose clean
close makes the log whole, so it keeps the journal (``agent._baseline_journal``, the
same steps as ``Agent.snapshot``): a `closed` journal is adopted and the hold answered
with `recorded` (the ``BaselineReport`` as a JSON object: no hold, no chunk); otherwise
the journal says `running` before chunk 0 is recorded and `done` once the last is
durable (that reply says `journal`: "done"), and the sidecar's clean shutdown marks it
`closed`. A connection that ends with batches open (a client that died between its
store write and its report) may have left writes in the store and not in the log: the
sidecar then no longer closes the journal, so the next start takes a new baseline. An
older sidecar ignores the field (no `journal` in the last reply): the client raises.

Chunks must come in order: `index` 0 with `baseline` null, then 1, 2, ... with the id
the first reply gave; anything else is refused (`bad_request`) and records nothing. The
sidecar numbers the chunks it ships itself, so a chunk larger than its sink's
``snapshot_max_bytes`` (Kafka's message limit) ships as several chunks of whole rows
at the same point, as an agent's does (the client's count is of the chunks it sent).
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Final

from agent._baseline import (
    CellChunk,
    ChunkNumbering,
    PendingSnapshot,
    SnapshotProgress,
    _await_quiescent,
    baseline_report,
    journal_finished,
    journal_recorded,
)
from agent._baseline_journal import BaselineJournal
from agent.sidecar import _protocol as p
from sequencer import ABSENT
from sinks.codec import Bound
from sinks.objstore import ObjectStoreError

if TYPE_CHECKING:
    from agent._agent import _Capture

__all__ = ["SNAPSHOT_OPS", "SnapshotChunkRequest", "SnapshotHold", "client_snapshot",
           "handle_snapshot", "parse_snapshot_request", "release_hold"]

SNAPSHOT_OPS: Final = ("snapshot_hold", "snapshot_chunk")


@dataclass(frozen=True, slots=True)
class SnapshotHold:
    id: p.RequestId
    journal: str | None = None  # a journaled baseline's first hold: the journal's URI


@dataclass(frozen=True, slots=True)
class SnapshotChunkRequest:
    id: p.RequestId
    baseline: int | None
    index: int
    lo: Bound | None
    hi: Bound | None
    cells: list[tuple[str, Any, str, Any]]
    cancel: bool = False  # the client could not read its chunk: let writers go, record nothing


@dataclass
class _Running:
    """A baseline the sidecar is recording: the client's next chunk, and the numbering
    of the chunks shipped (a client chunk may ship as several)."""

    next_index: int = 0
    numbering: ChunkNumbering = field(default_factory=ChunkNumbering)
    journal: BaselineJournal | None = None  # with it, what the journal's report needs:
    pending: list[PendingSnapshot] = field(default_factory=list)
    cells: int = 0
    longest_hold: float = 0.0
    started: float = field(default_factory=time.perf_counter)


@dataclass
class _Journals:
    """Per sidecar: the journal a connection's first hold named (until its chunk 0),
    and when each connection's hold was granted."""

    first: dict[int, BaselineJournal] = field(default_factory=dict)
    held_since: dict[int, float] = field(default_factory=dict)


_JOURNALS: weakref.WeakKeyDictionary[object, _Journals] = weakref.WeakKeyDictionary()


# Per sidecar: the baselines under way, by id (gone once their last chunk came).
_RUNNING: weakref.WeakKeyDictionary[object, dict[int, _Running]] = weakref.WeakKeyDictionary()


def _running(capture: object, request: SnapshotChunkRequest) -> tuple[int | None, _Running]:
    """The baseline ``request`` continues (or starts), checked to be the chunk due."""
    baselines = _RUNNING.setdefault(capture, {})
    if request.baseline is None:
        if request.index != 0:
            raise p.ProtocolError(p.BAD_REQUEST, f"snapshot_chunk {request.index} names no "
                                  "baseline: a baseline starts with index 0 and baseline "
                                  "null, then sends the id the first reply gave")
        return None, _Running()  # a new baseline: its id is taken by the caller
    running = baselines.get(request.baseline)
    if running is None:
        raise p.ProtocolError(p.BAD_REQUEST, f"baseline {request.baseline:016x} is not under "
                              "way on this sidecar (it finished, or the sidecar restarted): "
                              "start a new one from chunk 0 with baseline null")
    if request.index != running.next_index:
        raise p.ProtocolError(p.BAD_REQUEST, f"snapshot_chunk {request.index} of baseline "
                              f"{request.baseline:016x}: chunk {running.next_index} is due")
    return request.baseline, running


def _bound(message: dict[str, Any], name: str) -> Bound | None:
    raw = message.get(name)
    if raw is None:
        return None
    if type(raw) is not list or len(raw) != 2 or type(raw[0]) is not str:
        raise p.ProtocolError(p.BAD_REQUEST, f"snapshot_chunk \"{name}\" must be null or "
                              "[table, row or null]")
    return (raw[0], None if raw[1] is None else p.decode_row(raw[1]))


def parse_snapshot_request(op: str, message: dict[str, Any], request_id: p.RequestId
                           ) -> SnapshotHold | SnapshotChunkRequest:
    """Check one snapshot request (``op`` is one of ``SNAPSHOT_OPS``)."""
    if op == "snapshot_hold":
        journal = message.get("journal")
        if journal is not None and (type(journal) is not str or not journal):
            raise p.ProtocolError(p.BAD_REQUEST, "snapshot_hold \"journal\" must be an "
                                  "object store URI (file:///dir, s3://..., memory://...)")
        return SnapshotHold(request_id, journal)
    baseline, index, cells = message.get("baseline"), message.get("index"), message.get("cells")
    if baseline is not None and type(baseline) is not str:
        raise p.ProtocolError(p.BAD_REQUEST, "snapshot_chunk \"baseline\" is null for the "
                              "first chunk, then the string the first reply gave")
    if type(index) is not int or index < 0 or type(cells) is not list:
        raise p.ProtocolError(p.BAD_REQUEST, "snapshot_chunk needs \"index\" (0, 1, ...) and "
                              "\"cells\": a list of [table, row, column, value]")
    decoded = []
    for i, raw in enumerate(cells):
        if type(raw) is not list or len(raw) != 4:
            raise p.ProtocolError(p.BAD_REQUEST, f"cell {i}: a cell is [table, row, column, "
                                  "value]")
        table, row, column, value = raw
        event = p._decode_event(i, [table, row, column, None, value])
        if event[4] is ABSENT:
            raise p.ProtocolError(p.BAD_VALUE, f"cell {i}: a snapshot lists present cells only")
        decoded.append((event[0], event[1], event[2], event[4]))
    try:
        baseline_id = None if baseline is None else int(baseline, 16)
    except ValueError:
        raise p.ProtocolError(p.BAD_REQUEST, f"baseline {baseline!r} is not the id the "
                              "sidecar gave") from None
    return SnapshotChunkRequest(request_id, baseline_id, index, _bound(message, "lo"),
                                _bound(message, "hi"), decoded, message.get("cancel") is True)


async def handle_snapshot(capture: _Capture, holds: set[int], connection: object,
                          request: SnapshotHold | SnapshotChunkRequest) -> bytes:
    """Answer a snapshot request on the sidecar (``holds``: connections holding)."""
    key = id(connection)
    journals = _JOURNALS.setdefault(capture, _Journals())
    if type(request) is SnapshotHold:
        if key in holds:
            raise p.ProtocolError(p.BAD_REQUEST, "this connection already holds writers: "
                                  "send its snapshot_chunk first")
        if request.journal is not None:  # Step 1 of a journaled baseline
            journal = await asyncio.to_thread(_open_journal, request.journal)
            recorded = await asyncio.to_thread(journal_recorded, capture, journal)
            if recorded is not None:
                return p.encode_reply(request.id, recorded=asdict(recorded))
        capture._begin_hold()
        holds.add(key)
        if request.journal is not None:
            journals.first[key] = journal
        try:
            point = await _await_quiescent(capture)
        except BaseException:
            release_hold(capture, holds, connection)
            raise
        journals.held_since[key] = time.perf_counter()
        return p.encode_reply(request.id, point=list(point))
    assert type(request) is SnapshotChunkRequest
    if key not in holds:
        raise p.ProtocolError(p.BAD_REQUEST, "send snapshot_hold first, then read the chunk "
                              "from the store, then snapshot_chunk")
    if request.cancel:
        release_hold(capture, holds, connection)
        return p.encode_reply(request.id, baseline=None)
    try:
        baseline, running = _running(capture, request)
        if baseline is None:
            baseline = capture._ids.next()
            running.journal = journals.first.pop(key, None)
            if running.journal is not None:  # Step 2: before chunk 0 is recorded
                await asyncio.to_thread(running.journal.started, capture.domain_id, baseline)
        running.next_index += 1
        baselines = _RUNNING.setdefault(capture, {})
        if request.hi is None:
            baselines.pop(baseline, None)
        else:
            baselines[baseline] = running
        pending = PendingSnapshot(
            capture.domain_id, capture._last_point, baseline, request.index, request.lo,
            request.hi, request.cells, running.numbering)
        if running.journal is not None:
            running.pending.append(pending)
            running.cells += len(request.cells)
            running.longest_hold = max(running.longest_hold, time.perf_counter()
                                       - journals.held_since.get(key, time.perf_counter()))
        capture._shipper.put(pending)  # type: ignore[arg-type]
    finally:
        release_hold(capture, holds, connection)
    if request.hi is None:  # a quiescence point after the last chunk
        batch = await capture._aopen()
        capture._close(batch)
        if running.journal is not None:  # Step 4: every chunk durable, then "done"
            await asyncio.to_thread(capture.flush)
            report = baseline_report(capture.domain_id, baseline, running.pending,
                                     running.cells, running.longest_hold, running.started)
            await asyncio.to_thread(journal_finished, capture, running.journal, report)
            return p.encode_reply(request.id, baseline=f"{baseline:016x}", journal="done")
    return p.encode_reply(request.id, baseline=f"{baseline:016x}")


def _open_journal(uri: str) -> BaselineJournal:
    try:
        return BaselineJournal.at(uri)
    except (ValueError, ObjectStoreError) as exc:
        raise p.ProtocolError(p.BAD_REQUEST, f"snapshot_hold \"journal\": {exc}") from exc


def release_hold(capture: _Capture, holds: set[int], connection: object) -> None:
    """Let writers go if ``connection`` holds them (also when it ends)."""
    journals = _JOURNALS.get(capture)
    if journals is not None:
        journals.first.pop(id(connection), None)
        journals.held_since.pop(id(connection), None)
    if id(connection) in holds:
        holds.discard(id(connection))
        capture._end_hold()


def client_snapshot(call: Callable[..., dict[str, Any]], store: object, chunk_rows: int,
                    progress: Callable[[SnapshotProgress], None] | None,
                    journal: str | None = None) -> dict[str, Any]:
    """``SidecarClient.snapshot``: hold, list a chunk from the store, send it; repeat."""
    lister = getattr(store, "list_cells", None)
    if lister is None:
        raise TypeError(f"{type(store).__name__} cannot list its cells: a baseline snapshot "
                        "needs a store with list_cells(start, limit)")
    baseline: str | None = None
    start: Bound | None = None
    index = cells = 0
    longest = 0.0
    while True:
        if journal is not None and index == 0:
            first = call("snapshot_hold", journal=journal)
            recorded = first.get("recorded")
            if isinstance(recorded, dict):  # the journal said closed: nothing to take
                return {"baseline": f"{int(recorded['baseline_id']):016x}",
                        "chunks": recorded["chunks"], "cells": recorded["cells"],
                        "longest_hold": recorded["longest_hold"], "recorded": True}
        else:
            call("snapshot_hold")
        held = time.perf_counter()
        try:
            chunk: CellChunk = lister(start, chunk_rows)
        except BaseException:
            call("snapshot_chunk", baseline=baseline, index=index, cells=[], cancel=True)
            raise
        reply = call("snapshot_chunk", baseline=baseline, index=index, lo=_json_bound(start),
                     hi=_json_bound(chunk.next),
                     cells=[[t, p.encode_row(r), c, p.encode_value(v)]
                            for t, r, c, v in chunk.cells])
        hold = time.perf_counter() - held
        longest = max(longest, hold)
        baseline = str(reply["baseline"])
        index += 1
        cells += len(chunk.cells)
        start = chunk.next
        if progress is not None:
            progress(SnapshotProgress(int(baseline, 16), index, cells, start, hold))
        if start is None:
            call("flush")
            if journal is not None and reply.get("journal") != "done":
                from agent.sidecar._client import SidecarError

                raise SidecarError("bad_request", "the baseline was taken but this sidecar "
                                   "kept no journal (a version before journals ignores the "
                                   "field): upgrade the sidecar")
            return {"baseline": baseline, "chunks": index, "cells": cells,
                    "longest_hold": longest, "recorded": False}


def _json_bound(bound: Bound | None) -> list[Any] | None:
    if bound is None:
        return None
    table, row = bound
    return [table, None if row is None else p.encode_row(row)]
