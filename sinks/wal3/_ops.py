"""Manifest and snapshot I/O shared by the writer, the reader, sealing and GC.

The one recovery rule lives here too: ``roll_forward`` adopts orphaned fragments (written,
but their manifest update never happened) so the next writer recovers with no manual
step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import structlog

from sinks.wal3._errors import (
    AlreadyInitialized,
    CorruptFragment,
    CorruptManifest,
    UninitializedLog,
)
from sinks.wal3._fragment import decode_fragment
from sinks.wal3._manifest import Fragment, Manifest, Snapshot, SnapshotPointer
from sinks.wal3._paths import MANIFEST_PATH, fragment_path
from sinks.wal3._store import LogStore, NotFound, PreconditionFailed

__all__ = [
    "initialize_manifest",
    "install_snapshot",
    "load_manifest",
    "load_snapshot",
    "require_manifest",
    "roll_forward",
    "seal_manifest",
]

log = structlog.get_logger()


def load_manifest(store: LogStore, *, check: bool = True) -> tuple[Manifest, str] | None:
    """The current manifest and its etag, or None if the log was never initialized.

    With ``check`` (the default: every reader, writer and collector) the manifest must
    also pass ``Manifest.scrub`` (setsum identity, contiguity, sequential fragments), so
    nobody reads past, builds on or collects from an inconsistent one; ``CorruptManifest``
    names the object. Only tools that report problems (``log inspect``, scrub) pass False.
    """
    found = store.get_or_none(MANIFEST_PATH)
    if found is None:
        return None
    data, etag = found
    try:
        manifest = Manifest.from_json(data)
        if check:
            manifest.scrub()
    except CorruptManifest as exc:
        raise CorruptManifest(
            f"{store.key(MANIFEST_PATH)} on {store.store.describe()}: {exc}") from None
    return manifest, etag


def require_manifest(store: LogStore, *, check: bool = True) -> tuple[Manifest, str]:
    """``load_manifest``, raising ``UninitializedLog`` if there is none."""
    found = load_manifest(store, check=check)
    if found is None:
        raise UninitializedLog(
            f"no manifest at {store.key(MANIFEST_PATH)} on {store.store.describe()}: "
            "initialize the log first"
        )
    return found


def initialize_manifest(store: LogStore, manifest: Manifest) -> str:
    """Write the first manifest (If-None-Match). Raises ``AlreadyInitialized``."""
    manifest.scrub()
    try:
        return store.put_if_absent(MANIFEST_PATH, manifest.to_bytes())
    except PreconditionFailed:
        raise AlreadyInitialized(
            f"a manifest already exists at {store.key(MANIFEST_PATH)}; open the log instead"
        ) from None


def load_snapshot(store: LogStore, pointer: SnapshotPointer, *,
                  check: bool = True) -> Snapshot:
    """Load and check the snapshot a pointer names (setsum, bounds and depth must agree;
    with ``check``, ``Snapshot.scrub`` too: its children sum to its setsum and follow on)."""
    try:
        data, _ = store.get(pointer.path_to_snapshot)
    except NotFound:
        raise CorruptManifest(
            f"snapshot {pointer.path_to_snapshot} is referenced but missing"
        ) from None
    try:
        snapshot = Snapshot.from_json(data)
        if check:
            snapshot.scrub()
    except CorruptManifest as exc:
        raise CorruptManifest(f"{store.key(pointer.path_to_snapshot)}: {exc}") from None
    if snapshot.to_pointer() != pointer:
        raise CorruptManifest(
            f"snapshot {pointer.path_to_snapshot} does not match its pointer: "
            f"{snapshot.to_pointer()} != {pointer}"
        )
    return snapshot


def install_snapshot(store: LogStore, snapshot: Snapshot) -> None:
    """Write a snapshot (If-None-Match). It is content-addressed: if one with the same
    setsum is already there, it holds the same pointers, so that is success too."""
    with contextlib.suppress(PreconditionFailed):
        store.put_if_absent(snapshot.path, snapshot.to_json().encode())


def probe_orphans(store: LogStore, manifest: Manifest) -> list[Fragment]:
    """Fragments stored at the manifest's next sequence numbers that follow on from it.

    An orphan at the next sequence number whose first offset is not the manifest's next
    offset can never be adopted by any manifest (manifests only grow), so it is deleted;
    it was never acknowledged. A fragment that does not decode stops recovery: a
    writer may still know its setsum, so only a human may remove it.
    """
    found: list[Fragment] = []
    seq_no, offset = manifest.next_seq_no, manifest.next_offset
    while True:
        path = fragment_path(seq_no)
        got = store.get_or_none(path)
        if got is None:
            return found
        data, _ = got
        try:
            decoded = decode_fragment(data, path=store.key(path), start=offset)
        except CorruptFragment as exc:
            raise CorruptFragment(
                f"orphaned fragment {store.key(path)} does not decode ({exc}); recovery "
                "stopped: inspect it, and delete it if no manifest refers to it"
            ) from exc
        if decoded.start != offset:
            log.warning("wal3.orphan_unreachable", path=store.key(path), start=decoded.start,
                        expected=offset)
            store.delete(path)
            return found
        found.append(Fragment(path, seq_no, decoded.start, decoded.limit, len(data),
                              decoded.setsum))
        seq_no, offset = seq_no + 1, decoded.limit


def roll_forward(
    store: LogStore, manifest: Manifest, etag: str, writer: str,
    on_reload: Callable[[Manifest], None] | None = None,
) -> tuple[Manifest, str, int]:
    """Adopt orphaned fragments into the manifest; return (manifest, etag, adopted count).

    Durability order:
    Step 1. Probe the next sequence numbers for fragments that follow on from the manifest.
    Step 2. Compare-and-swap a manifest that includes them. Only then are their records
            part of the log; on a lost race, re-read the manifest and start again.
    """
    adopted = 0
    while True:
        if manifest.sealed:
            return manifest, etag, adopted
        # Step 1.
        orphans = probe_orphans(store, manifest)
        if not orphans:
            return manifest, etag, adopted
        new = manifest.apply_fragments(orphans, writer)
        # Step 2.
        try:
            etag = store.put_if_match(MANIFEST_PATH, new.to_bytes(), etag)
        except PreconditionFailed:
            manifest, etag = require_manifest(store)
            if on_reload is not None:
                on_reload(manifest)
            continue
        log.info("wal3.rolled_forward", log=store.describe(), fragments=len(orphans),
                 first_seq_no=orphans[0].seq_no, limit=orphans[-1].limit)
        manifest = new
        adopted += len(orphans)


def seal_manifest(store: LogStore, manifest: Manifest, etag: str, writer: str) -> Manifest:
    """Compare-and-swap a sealed copy of the manifest, re-reading on lost races."""
    while True:
        if manifest.sealed:
            return manifest
        sealed = manifest.seal(writer)
        try:
            store.put_if_match(MANIFEST_PATH, sealed.to_bytes(), etag)
            return sealed
        except PreconditionFailed:
            manifest, etag = require_manifest(store)
