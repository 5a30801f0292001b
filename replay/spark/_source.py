"""Which records to read: exactly those the log's manifest names, never a folder listing.

Runs on the driver. A wal3 log's ``log/`` folder may hold orphaned fragments (a writer
that crashed before its manifest swap) or fragments being garbage collected; only the
manifest says which ones are the log. Each fragment travels to the executors as its
manifest JSON, so an executor fetches it through ``sinks.wal3.LogReader.fetch``, which
checks its setsum and offsets against the manifest.

A log collected below a checkpoint (``cdc-agent log gc`` or ``log compact``;
``docs/state.md``) is read as ``read_log`` reads it from the start: the checkpoint and
stripes first (``replay.spark._checkpoint``), then only the records from the newest
retained point on. The records a checkpoint carries (intervals still open there) travel
to the executors as one more "fragment" of their own, so both passes decode them as
they decode the log's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sinks.wal3 import Fragment, LogReader, StateDelta, iter_state_deltas, load_state_index

__all__ = ["LogSource", "fragment_records", "list_fragments"]


@dataclass(frozen=True, slots=True)
class LogSource:
    """A wal3 log as the executors need it: where it is and the fragments to read."""

    uri: str
    prefix: str
    endpoint_url: str | None
    fragments: tuple[str, ...]  # each fragment's manifest JSON, in log order
    next_offset: int
    # A collected log: its checkpoint and stripes (checked), records read from `begin`.
    deltas: tuple[StateDelta, ...] = ()
    begin: int = 0

    def reader(self) -> LogReader:
        return LogReader(self.uri, self.prefix, endpoint_url=self.endpoint_url)


def list_fragments(uri: str, prefix: str = "", endpoint_url: str | None = None, *,
                   begin: int | None = None) -> LogSource:
    """Read the manifest of the log at ``uri`` (``file:///dir``, ``s3://bucket/prefix``)
    and name every fragment it lists, walking its snapshots; on a log collected below
    its checkpoint, load the checkpoint and stripes (each checked against its SHA-256
    name and index entry, the state setsum carried along the chain) and name the
    fragments from the newest retained point on. ``begin``: only the records from that
    offset on (a stream resuming where its previous micro-batch saved, ``_stream``)."""
    reader = LogReader(uri, prefix, endpoint_url=endpoint_url)
    manifest = reader.manifest()
    if begin is not None:
        return LogSource(uri, prefix, endpoint_url, tuple(
            _from(f, begin) for f in reader.scan(begin, manifest=manifest)),
            manifest.next_offset, (), begin)
    index = load_state_index(reader.store, manifest)
    if index is None or manifest.oldest_offset <= index.entries[0].lo:
        # Nothing collected below the checkpoint: the raw records are all there (as
        # read_log reads it from the start).
        fragments: list[Fragment] = reader.scan(manifest=manifest)
        return LogSource(uri, prefix, endpoint_url, tuple(f.to_json() for f in fragments),
                         manifest.next_offset)
    deltas = tuple(iter_state_deltas(reader.store, index))
    begin = index.limit
    texts = []
    carried = deltas[-1].carried
    if carried:  # offsets just below `begin`, in order: the records stand there
        texts.append(json.dumps({"carried": [
            [begin - len(carried) + i, body.hex()] for i, body in enumerate(carried)]}))
    texts += [_from(f, begin) for f in reader.scan(begin, manifest=manifest)]
    return LogSource(uri, prefix, endpoint_url, tuple(texts), manifest.next_offset,
                     deltas, begin)


def _from(fragment: Fragment, begin: int) -> str:
    """A fragment as the executors get it: whole, or its records from ``begin`` on."""
    if fragment.start >= begin:
        return fragment.to_json()
    return json.dumps({"from": begin, "fragment": json.loads(fragment.to_json())})


def fragment_records(text: str, reader: LogReader) -> list[tuple[int, bytes]]:
    """Executor side: the (offset, body) records of one entry ``list_fragments`` named
    (a fragment, fetched and checked; the part of one from an offset; carried records)."""
    obj: Any = json.loads(text)
    if "carried" in obj:
        return [(int(o), bytes.fromhex(b)) for o, b in obj["carried"]]
    begin = 0
    if "from" in obj:
        begin, obj = int(obj["from"]), obj["fragment"]
    fragment = Fragment.from_obj(obj)
    return [(r.offset, r.body) for r in reader.fetch(fragment) if r.offset >= begin]
