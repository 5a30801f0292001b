"""Where wal3 keeps things, relative to the log's prefix (Chroma's layout, byte for byte).

    manifest/MANIFEST                                         the root (mutable, If-Match)
    snapshot/SNAPSHOT.<setsum hex>                            interior nodes (immutable)
    log/Bucket=<16 hex>/FragmentSeqNo=<16 hex>.parquet         fragments, buckets of 4096
    cursor/<name>.json                                        cursors (If-Match)
    gc/GARBAGE                                                the garbage file (If-Match)

Zero-padded hex keeps a listing in log order.
"""

from __future__ import annotations

import re
from typing import Final

from sinks._setsum import Setsum

__all__ = [
    "BUCKET_SIZE",
    "GARBAGE_PATH",
    "MANIFEST_PATH",
    "cursor_path",
    "fragment_path",
    "join",
    "parse_fragment_path",
    "parse_snapshot_path",
    "snapshot_path",
    "valid_cursor_name",
]

BUCKET_SIZE: Final = 4096
MANIFEST_PATH: Final = "manifest/MANIFEST"
GARBAGE_PATH: Final = "gc/GARBAGE"
FRAGMENT_PREFIX: Final = "log/"
SNAPSHOT_PREFIX: Final = "snapshot/SNAPSHOT."
CURSOR_PREFIX: Final = "cursor/"
_FRAGMENT_RE: Final = re.compile(
    r"log/Bucket=([0-9a-f]{16})/FragmentSeqNo=([0-9a-f]{16})\.parquet\Z"
)
_SNAPSHOT_RE: Final = re.compile(r"snapshot/SNAPSHOT\.([0-9a-f]{64})\Z")
_CURSOR_RE: Final = re.compile(r"[A-Za-z0-9_]+\Z")


def join(prefix: str, path: str) -> str:
    """``prefix/path``, or ``path`` when the log lives at the root of the store."""
    prefix = prefix.strip("/")
    return f"{prefix}/{path}" if prefix else path


def fragment_path(seq_no: int) -> str:
    """The canonical path of fragment ``seq_no``."""
    bucket = seq_no - seq_no % BUCKET_SIZE
    return f"log/Bucket={bucket:016x}/FragmentSeqNo={seq_no:016x}.parquet"


def parse_fragment_path(path: str) -> int | None:
    """The sequence number in a canonical fragment path, or None if ``path`` is not one."""
    match = _FRAGMENT_RE.match(path)
    if match is None:
        return None
    bucket, seq_no = int(match.group(1), 16), int(match.group(2), 16)
    if bucket != seq_no - seq_no % BUCKET_SIZE:
        return None
    return seq_no


def snapshot_path(setsum: Setsum) -> str:
    """Snapshots are content-addressed by their setsum."""
    return SNAPSHOT_PREFIX + setsum.hexdigest()


def parse_snapshot_path(path: str) -> Setsum | None:
    """The setsum named by a snapshot path, or None if ``path`` is not one."""
    match = _SNAPSHOT_RE.match(path)
    return None if match is None else Setsum.from_hexdigest(match.group(1))


def valid_cursor_name(name: str) -> bool:
    """Cursor names are non-empty ASCII letters, digits and underscores."""
    return _CURSOR_RE.match(name) is not None


def cursor_path(name: str) -> str:
    if not valid_cursor_name(name):
        raise ValueError(
            f"cursor name {name!r} is invalid: use ASCII letters, digits and underscores"
        )
    return f"{CURSOR_PREFIX}{name}.json"
