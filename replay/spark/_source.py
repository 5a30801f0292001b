"""Which fragments to read: exactly those the log's manifest names, never a folder listing.

Runs on the driver. A wal3 log's ``log/`` folder may hold orphaned fragments (a writer
that crashed before its manifest swap) or fragments being garbage collected; only the
manifest says which ones are the log. Each fragment travels to the executors as its
manifest JSON, so an executor fetches it through ``sinks.wal3.LogReader.fetch``, which
checks its setsum and offsets against the manifest.
"""

from __future__ import annotations

from dataclasses import dataclass

from sinks.wal3 import Fragment, LogReader

__all__ = ["LogSource", "list_fragments"]


@dataclass(frozen=True, slots=True)
class LogSource:
    """A wal3 log as the executors need it: where it is and the fragments to read."""

    uri: str
    prefix: str
    endpoint_url: str | None
    fragments: tuple[str, ...]  # each fragment's manifest JSON, in log order
    next_offset: int

    def reader(self) -> LogReader:
        return LogReader(self.uri, self.prefix, endpoint_url=self.endpoint_url)


def list_fragments(uri: str, prefix: str = "", endpoint_url: str | None = None) -> LogSource:
    """Read the manifest of the log at ``uri`` (``file:///dir``, ``s3://bucket/prefix``)
    and name every fragment it lists, walking its snapshots."""
    reader = LogReader(uri, prefix, endpoint_url=endpoint_url)
    manifest = reader.manifest()
    fragments: list[Fragment] = reader.scan(manifest=manifest)
    return LogSource(uri, prefix, endpoint_url, tuple(f.to_json() for f in fragments),
                     manifest.next_offset)
