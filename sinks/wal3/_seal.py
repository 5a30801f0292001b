"""Sealing: a sealed log takes no more appends; a new log continues from its end offset.

The seal is a field of the manifest (``"sealed": true``), installed by compare-and-swap,
so a writer learns of it on its next manifest update at the latest and fails its
unacknowledged records with ``LogSealed``. Records acknowledged before the seal are all
below the sealed manifest's ``next_offset``; a continuation log starts exactly there.
"""

from __future__ import annotations

from sinks.objstore import ObjectStore
from sinks.wal3._errors import Wal3Error
from sinks.wal3._manifest import Manifest
from sinks.wal3._ops import initialize_manifest, require_manifest, seal_manifest
from sinks.wal3._store import LogStore, as_store

__all__ = ["continue_log", "seal_log"]


def seal_log(store: ObjectStore | str, prefix: str = "", *,
             writer: str = "cdc-agent sealer") -> Manifest:
    """Seal a log (idempotent); return the sealed manifest."""
    logstore = LogStore(as_store(store), prefix)
    manifest, etag = require_manifest(logstore)
    return seal_manifest(logstore, manifest, etag, writer)


def continue_log(sealed_store: ObjectStore | str, new_store: ObjectStore | str, *,
                 sealed_prefix: str = "", new_prefix: str = "",
                 writer: str = "cdc-agent sealer") -> Manifest:
    """Initialize a new log whose first offset is the sealed log's next offset."""
    old, _ = require_manifest(LogStore(as_store(sealed_store), sealed_prefix))
    if not old.sealed:
        raise Wal3Error(
            "the old log is not sealed: seal it first (seal_log), so no append can land "
            "after the offset the new log starts at"
        )
    manifest = Manifest.new_empty(writer, initial_offset=old.next_offset, initial_seq_no=1)
    initialize_manifest(LogStore(as_store(new_store), new_prefix), manifest)
    return manifest
