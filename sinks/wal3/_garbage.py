"""Garbage collection in three phases, driven by the garbage file ``gc/GARBAGE``.

The garbage file (Chroma's fields, in order): ``snapshots_to_drop`` [pointer],
``snapshots_to_make`` [snapshot], ``snapshot_for_root`` pointer|null,
``fragments_to_drop_start``, ``fragments_to_drop_limit`` (sequence numbers, half open),
``setsum_to_discard``, ``first_to_keep`` {offset}. When no collection is in progress it
holds the empty garbage (S3 has no If-Match on delete, so the file is reset, not
removed).

Phase 1 computes what lies wholly below the cutoff (the lowest cursor, or an explicit
bound), writes any replacement snapshots, then installs the garbage file. Phase 2
applies it to the *current* manifest by compare-and-swap: pointers leave, their setsum
moves into ``collected``, so the manifest's setsum is unchanged and scrub still
balances; if the manifest moved on in a way the garbage no longer fits, the collection
is abandoned with nothing deleted. Phase 3 re-reads the manifest, walks every pointer
it reaches, and deletes only if none of the garbage is referenced; then resets the file.
A crash anywhere leaves either nothing done or a garbage file the next run resumes.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import structlog

from sinks._setsum import Setsum
from sinks.objstore import ObjectStore
from sinks.wal3._cursors import CursorStore
from sinks.wal3._errors import (
    CorruptCursor,
    CorruptGarbage,
    CorruptManifest,
    GarbageCollectionInProgress,
)
from sinks.wal3._manifest import Fragment, Manifest, Snapshot, SnapshotPointer, _u64
from sinks.wal3._ops import install_snapshot, load_snapshot, require_manifest
from sinks.wal3._paths import GARBAGE_PATH, MANIFEST_PATH, fragment_path
from sinks.wal3._store import LogStore, PreconditionFailed, as_store

__all__ = ["Garbage", "GarbageCollector", "GcReport", "compute_garbage"]

log = structlog.get_logger()


@dataclass(frozen=True, slots=True)
class Garbage:
    """What one collection removes, and the setsum it moves into ``collected``."""

    snapshots_to_drop: tuple[SnapshotPointer, ...] = ()
    snapshots_to_make: tuple[Snapshot, ...] = ()
    snapshot_for_root: SnapshotPointer | None = None
    fragments_to_drop_start: int = 0
    fragments_to_drop_limit: int = 0
    setsum_to_discard: Setsum = field(default_factory=Setsum)
    first_to_keep: int = 1

    def is_empty(self) -> bool:
        return self == Garbage()

    def to_json(self) -> str:
        root = "null" if self.snapshot_for_root is None else self.snapshot_for_root.to_json()
        return "".join([
            '{"snapshots_to_drop":[', ",".join(s.to_json() for s in self.snapshots_to_drop),
            '],"snapshots_to_make":[', ",".join(s.to_json() for s in self.snapshots_to_make),
            '],"snapshot_for_root":', root,
            ',"fragments_to_drop_start":', str(self.fragments_to_drop_start),
            ',"fragments_to_drop_limit":', str(self.fragments_to_drop_limit),
            ',"setsum_to_discard":"', self.setsum_to_discard.hexdigest(),
            '","first_to_keep":{"offset":', str(self.first_to_keep), "}}",
        ])

    @classmethod
    def from_json(cls, data: bytes | str) -> Garbage:
        if not data or not data.strip():
            return cls()
        try:
            obj: Any = json.loads(data)
            root = obj["snapshot_for_root"]
            garbage = cls(
                snapshots_to_drop=tuple(SnapshotPointer.from_obj(s)
                                        for s in obj["snapshots_to_drop"]),
                snapshots_to_make=tuple(Snapshot.from_obj(s) for s in obj["snapshots_to_make"]),
                snapshot_for_root=None if root is None else SnapshotPointer.from_obj(root),
                fragments_to_drop_start=_u64(obj["fragments_to_drop_start"],
                                             "fragments_to_drop_start"),
                fragments_to_drop_limit=_u64(obj["fragments_to_drop_limit"],
                                             "fragments_to_drop_limit"),
                setsum_to_discard=Setsum.from_hexdigest(obj["setsum_to_discard"]),
                first_to_keep=_u64(obj["first_to_keep"]["offset"], "first_to_keep.offset"),
            )
        except (ValueError, KeyError, TypeError, RecursionError, CorruptManifest) as exc:
            reason = ("nested too deeply" if isinstance(exc, RecursionError)
                      else f"no field {exc}" if isinstance(exc, KeyError) else repr(exc))
            raise CorruptGarbage(
                f"the garbage file is not valid garbage JSON: {reason:.200}") from None
        return garbage

    def paths_to_delete(self) -> list[str]:
        return [s.path_to_snapshot for s in self.snapshots_to_drop] + [
            fragment_path(seq)
            for seq in range(self.fragments_to_drop_start, self.fragments_to_drop_limit)
        ]


class _Builder:
    """Accumulates a Garbage while walking the tree in log order."""

    def __init__(self, cutoff: int, load: Callable[[SnapshotPointer], Snapshot]) -> None:
        self.cutoff = cutoff
        self.load = load
        self.drop: list[SnapshotPointer] = []
        self.make: list[Snapshot] = []
        self.start = self.limit = 0
        self.discard = Setsum()
        self.first_to_keep: int | None = None

    def drop_fragment(self, frag: Fragment) -> Setsum:
        if self.first_to_keep is None:
            self.start = frag.seq_no
        elif self.limit != frag.seq_no:
            raise CorruptGarbage(
                f"fragments collected out of order: {frag.seq_no} after {self.limit - 1}"
            )
        self.limit = frag.seq_no + 1
        self.discard = self.discard + frag.setsum
        self.first_to_keep = frag.limit
        return frag.setsum

    def drop_snapshot(self, ptr: SnapshotPointer) -> Setsum:
        snap = self.load(ptr)
        acc = Setsum()
        for child in snap.snapshots:
            acc = acc + self.drop_snapshot(child)
        for frag in snap.fragments:
            acc = acc + self.drop_fragment(frag)
        if acc != snap.setsum:
            raise CorruptGarbage(
                f"snapshot {ptr.path_to_snapshot} sums to {snap.setsum.hexdigest()} but its "
                f"dropped children sum to {acc.hexdigest()}"
            )
        self.drop.append(ptr)
        return snap.setsum

    def replace_snapshot(self, ptr: SnapshotPointer) -> tuple[Setsum, SnapshotPointer]:
        """Split a snapshot the cutoff falls inside: drop its old part, keep the rest in
        a new snapshot that replaces it."""
        snap = self.load(ptr)
        cut = self.cutoff
        acc = Setsum()
        keep_snaps: list[SnapshotPointer] = []
        split: SnapshotPointer | None = None
        for child in snap.snapshots:
            if child.limit <= cut:
                acc = acc + self.drop_snapshot(child)
            elif child.start <= cut < child.limit and split is None:
                split = child
            else:
                keep_snaps.append(child)
        if split is not None:
            delta, new_child = self.replace_snapshot(split)
            acc = acc + delta
            keep_snaps.insert(0, new_child)
        drop_frags = [f for f in snap.fragments if f.limit <= cut]
        keep_frags = [f for f in snap.fragments if f.limit > cut]
        for frag in drop_frags:
            acc = acc + self.drop_fragment(frag)
        if acc == Setsum():
            # Nothing below the cutoff in here: keep the snapshot as it is (rebuilding an
            # equal one could differ in depth yet share its content-addressed path).
            return acc, ptr
        if len(keep_snaps) == 1 and not keep_frags:
            # A snapshot of one snapshot would have its child's setsum, hence its path:
            # point at the child instead.
            self.drop.append(ptr)
            return acc, keep_snaps[0]
        depth = max((s.depth for s in keep_snaps), default=0) + 1
        new = Snapshot.build(depth, "garbage collection", keep_snaps, keep_frags)
        if new.to_pointer() == ptr:
            return acc, ptr
        self.drop.append(ptr)
        self.make.append(new)
        return acc, new.to_pointer()


def compute_garbage(manifest: Manifest, cutoff: int,
                    load: Callable[[SnapshotPointer], Snapshot]) -> Garbage | None:
    """The garbage below ``cutoff`` (records at offsets < cutoff whose whole fragment lies
    below it), or None if there is none. The setsums must balance or it raises."""
    cutoff = min(cutoff, manifest.next_offset)
    builder = _Builder(cutoff, load)
    acc = Setsum()
    root: SnapshotPointer | None = None
    for ptr in manifest.snapshots:
        if ptr.limit <= cutoff:
            acc = acc + builder.drop_snapshot(ptr)
        elif ptr.start <= cutoff < ptr.limit and root is None:
            delta, new_root = builder.replace_snapshot(ptr)
            acc = acc + delta
            if new_root != ptr:
                root = new_root
    for frag in manifest.fragments:
        if frag.limit <= cutoff:
            acc = acc + builder.drop_fragment(frag)
    if builder.first_to_keep is None:
        return None
    if acc != builder.discard:
        raise CorruptGarbage(
            f"garbage setsums do not balance: dropped pointers sum to {acc.hexdigest()}, "
            f"dropped fragments to {builder.discard.hexdigest()}"
        )
    return Garbage(tuple(builder.drop), tuple(builder.make), root, builder.start,
                   builder.limit, builder.discard, builder.first_to_keep)


@dataclass(frozen=True, slots=True)
class GcReport:
    """What a collection did."""

    cutoff: int | None
    garbage: Garbage | None
    applied: bool
    deleted: int


class GarbageCollector:
    """Runs the three phases against one log. Only one collection at a time."""

    def __init__(self, store: ObjectStore | str, prefix: str = "", *,
                 writer: str = "garbage collection") -> None:
        self._log = store if isinstance(store, LogStore) else LogStore(as_store(store), prefix)
        self._writer = writer
        self._cursors = CursorStore(self._log)
        self._cache: dict[SnapshotPointer, Snapshot] = {}

    def _load(self, ptr: SnapshotPointer) -> Snapshot:
        snap = self._cache.get(ptr)
        if snap is None:
            snap = self._cache[ptr] = load_snapshot(self._log, ptr)
        return snap

    def load_garbage(self) -> tuple[Garbage, str | None]:
        found = self._log.get_or_none(GARBAGE_PATH)
        if found is None:
            return Garbage(), None
        data, etag = found
        try:
            return Garbage.from_json(data), etag
        except CorruptGarbage as exc:
            raise CorruptGarbage(f"{self._log.key(GARBAGE_PATH)}: {exc}") from None

    def positions(self, keep_at_least: int | None = None,
                  served: Collection[int] = ()) -> dict[str, int]:
        """What bounds a collection: each cursor's position, and ``keep_at_least``.

        Cursors at a position in ``served`` (retained points a published checkpoint or
        stripe serves, see ``_state.py``) do not bound it; ``keep_at_least`` then must.
        """
        positions = {f"cursor {name!r}": w.cursor.position for name in self._cursors.list()
                     if (w := self._cursors.load(name)) is not None
                     and w.cursor.position not in served}
        if keep_at_least is not None:
            if keep_at_least < 0:
                raise ValueError(f"keep_at_least {keep_at_least} is negative; offsets start at 1")
            positions["keep_at_least"] = keep_at_least
        return positions

    def cutoff(self, keep_at_least: int | None = None,
               served: Collection[int] = ()) -> int | None:
        """The lowest cursor position, lowered to ``keep_at_least``; None if neither."""
        positions = self.positions(keep_at_least, served)
        return min(positions.values()) if positions else None

    def _check_positions(self, positions: dict[str, int], manifest: Manifest) -> None:
        """Refuse a bound past the log's end: collecting up to it would delete records no
        reader has seen. ``manifest`` must be read *after* the cursors, so an honest
        reader's cursor (never past the manifest it read) is never past its end."""
        end = manifest.next_offset
        for what, position in positions.items():
            if position > end:
                error = CorruptCursor if what.startswith("cursor") else ValueError
                raise error(
                    f"{what} points at offset {position}, past the end of "
                    f"{self._log.describe()} (next offset {end}); nothing was collected: "
                    + ("fix or delete that cursor" if error is CorruptCursor
                       else "lower --keep-at-least")
                )

    def phase1_compute(self, keep_at_least: int | None = None,
                       served: Collection[int] = ()) -> Garbage | None:
        """Write the garbage file for everything below the cutoff.

        Step 1. Read the cursors, then the manifest; refuse a cursor past the log's end;
                compute the garbage.
        Step 2. Write any replacement snapshots (If-None-Match).
        Step 3. Install the garbage file: If-Match on the empty file (If-None-Match if
                absent). Losing that race means another collection is in progress.
        """
        # Step 1.
        existing, etag = self.load_garbage()
        if not existing.is_empty():
            raise GarbageCollectionInProgress(
                f"{self._log.key(GARBAGE_PATH)} already holds garbage; run phases 2 and 3"
            )
        positions = self.positions(keep_at_least, served)
        if not positions:
            return None
        manifest, _ = require_manifest(self._log)  # after the cursors: see _check_positions
        self._check_positions(positions, manifest)
        cutoff = min(positions.values())
        garbage = compute_garbage(manifest, cutoff, self._load)
        if garbage is None:
            return None
        # Step 2.
        for snap in garbage.snapshots_to_make:
            install_snapshot(self._log, snap)
        # Step 3.
        payload = garbage.to_json().encode()
        try:
            if etag is None:
                self._log.put_if_absent(GARBAGE_PATH, payload)
            else:
                self._log.put_if_match(GARBAGE_PATH, payload, etag)
        except PreconditionFailed:
            raise GarbageCollectionInProgress(
                "another collection installed its garbage file first"
            ) from None
        log.info("wal3.gc_phase1", log=self._log.describe(), cutoff=cutoff,
                 fragments=garbage.fragments_to_drop_limit - garbage.fragments_to_drop_start,
                 snapshots=len(garbage.snapshots_to_drop))
        return garbage

    @staticmethod
    def _applied(manifest: Manifest, garbage: Garbage) -> bool:
        """Only garbage collection raises ``initial_offset``: at or past ``first_to_keep``
        means this garbage is already out of the manifest."""
        return (manifest.initial_offset is not None
                and manifest.initial_offset >= garbage.first_to_keep)

    def phase2_apply(self, verify: Callable[[Manifest], None] | None = None) -> bool:
        """Compare-and-swap the manifest without the garbage; False if there was none or
        it no longer fits the manifest (then the collection is abandoned, nothing deleted).
        ``verify(manifest)`` may refuse the collection by raising: the garbage file is
        reset first, so nothing is collected and no later run resumes it.

        Step 1. Read the garbage file and the current manifest.
        Step 2. Apply (pointers out, their setsum into ``collected``) and scrub.
        Step 3. Compare-and-swap the manifest; on a lost race, go back to step 1.
        """
        while True:
            # Step 1.
            garbage, etag = self.load_garbage()
            if garbage.is_empty():
                return False
            manifest, manifest_etag = require_manifest(self._log)
            if self._applied(manifest, garbage):
                return True
            if verify is not None:
                try:
                    verify(manifest)
                except Exception:
                    self._reset(etag)
                    raise
            # Step 2.
            try:
                new = manifest.apply_garbage(garbage).with_writer(self._writer)
            except CorruptManifest as exc:
                log.warning("wal3.gc_abandoned", log=self._log.describe(), reason=str(exc))
                self._reset(etag)
                return False
            # Step 3.
            try:
                self._log.put_if_match(MANIFEST_PATH, new.to_bytes(), manifest_etag)
                return True
            except PreconditionFailed:
                continue

    def phase3_delete(self) -> int:
        """Delete the garbage, after checking the current manifest reaches none of it.

        Step 1. Read the garbage file and the current manifest; walk every pointer the
                manifest reaches. If any garbage is still referenced, stop: delete nothing.
        Step 2. Delete the garbage (idempotent; a crash here is finished by the next run).
        Step 3. Reset the garbage file to empty (If-Match).
        """
        # Step 1.
        garbage, etag = self.load_garbage()
        if garbage.is_empty():
            return 0
        manifest, _ = require_manifest(self._log)
        to_delete = garbage.paths_to_delete()
        referenced = set(manifest.references(self._load))
        still = [p for p in to_delete if p in referenced]
        if still:
            raise GarbageCollectionInProgress(
                f"the manifest still references {len(still)} garbage path(s), e.g. {still[0]}; "
                "nothing was deleted: run phase 2 first"
            )
        # Step 2.
        for path in to_delete:
            self._log.delete(path)
        # Step 3.
        self._reset(etag)
        log.info("wal3.gc_phase3", log=self._log.describe(), deleted=len(to_delete))
        return len(to_delete)

    def _reset(self, etag: str | None) -> None:
        if etag is None:
            return
        # Losing this race means someone else reset it (or began the next collection).
        with contextlib.suppress(PreconditionFailed):
            self._log.put_if_match(GARBAGE_PATH, Garbage().to_json().encode(), etag)

    def collect(self, keep_at_least: int | None = None, *, served: Collection[int] = (),
                verify: Callable[[Manifest], None] | None = None) -> GcReport:
        """Run (or resume) a whole collection (``served``, ``verify``: see
        ``positions`` and ``phase2_apply``)."""
        garbage, _ = self.load_garbage()
        cutoff = None
        if garbage.is_empty():
            cutoff = self.cutoff(keep_at_least, served)
            found = self.phase1_compute(keep_at_least, served)
            if found is None:
                return GcReport(cutoff, None, False, 0)
            garbage = found
        if not self.phase2_apply(verify):
            return GcReport(cutoff, garbage, False, 0)
        return GcReport(cutoff, garbage, True, self.phase3_delete())
