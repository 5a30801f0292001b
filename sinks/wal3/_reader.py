"""Reading a wal3 log: scan the manifest tree, fetch fragments, verify setsums, scrub."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from sinks._setsum import Setsum
from sinks.objstore import ObjectStore
from sinks.wal3._errors import CorruptFragment, CorruptLog, CorruptManifest, GarbageCollected
from sinks.wal3._fragment import decode_fragment
from sinks.wal3._manifest import Fragment, Manifest, Snapshot, SnapshotPointer
from sinks.wal3._ops import load_snapshot, require_manifest
from sinks.wal3._store import LogStore, NotFound, as_store

__all__ = ["Limits", "LogReader", "Record", "ScrubReport"]


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on one scan: stop after this many records, bytes or fragments."""

    max_records: int | None = None
    max_bytes: int | None = None
    max_fragments: int | None = None


@dataclass(frozen=True, slots=True)
class Record:
    """One record as read back: its offset, the timestamp its batch got, and its body."""

    offset: int
    timestamp_us: int
    body: bytes


@dataclass(slots=True)
class ScrubReport:
    """What a full scrub read and every problem it found (empty when the log is sound)."""

    log: str
    manifest_setsum: str = ""
    snapshots: int = 0
    fragments: int = 0
    records: int = 0
    bytes: int = 0
    oldest_offset: int = 1
    next_offset: int = 1
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


class LogReader:
    """Reads a log without blocking its writers. Thread-safe."""

    def __init__(self, store: ObjectStore | str, prefix: str = "", *,
                 endpoint_url: str | None = None) -> None:
        options = {"create": False} if isinstance(store, str) and store.startswith("file:") else {}
        self._log = LogStore(as_store(store, endpoint_url=endpoint_url, **options), prefix)
        self._snapshots: dict[SnapshotPointer, Snapshot] = {}

    @property
    def store(self) -> LogStore:
        return self._log

    def manifest(self, *, check: bool = True) -> Manifest:
        """The current manifest (read fresh), which must pass ``Manifest.scrub`` unless
        ``check`` is false (then look at ``manifest.problems()`` yourself)."""
        return require_manifest(self._log, check=check)[0]

    def snapshot(self, pointer: SnapshotPointer) -> Snapshot:
        """A snapshot, checked against its pointer; cached (snapshots are immutable)."""
        found = self._snapshots.get(pointer)
        if found is None:
            found = load_snapshot(self._log, pointer)
            if len(self._snapshots) > 4096:
                self._snapshots.clear()
            self._snapshots[pointer] = found
        return found

    # -- scanning -----------------------------------------------------------------------

    def scan(self, from_offset: int | None = None, limits: Limits | None = None, *,
             manifest: Manifest | None = None) -> list[Fragment]:
        """The fragments holding records from ``from_offset`` on, in log order.

        Raises ``GarbageCollected`` if ``from_offset`` is below the retained prefix.
        """
        manifest = manifest or self.manifest()
        start = self._check_start(manifest, from_offset)
        limits = limits or Limits()
        out: list[Fragment] = []
        records = nbytes = 0
        for frag in self._leaves(manifest, start):
            if limits.max_fragments is not None and len(out) >= limits.max_fragments:
                break
            if out and limits.max_records is not None and records >= limits.max_records:
                break
            if out and limits.max_bytes is not None and nbytes >= limits.max_bytes:
                break
            out.append(frag)
            records += frag.limit - max(frag.start, start)
            nbytes += frag.num_bytes
        return out

    def _check_start(self, manifest: Manifest, from_offset: int | None) -> int:
        oldest = manifest.oldest_offset
        if from_offset is None:
            return oldest
        if from_offset < oldest:
            raise GarbageCollected(
                f"offset {from_offset} of {self._log.describe()} was garbage collected; the "
                f"log now starts at offset {oldest}"
            )
        return from_offset

    def _leaves(self, manifest: Manifest, start: int) -> Iterator[Fragment]:
        """Fragments with records at or after ``start``, walking snapshots lazily."""

        def walk(pointers: tuple[SnapshotPointer, ...],
                 fragments: tuple[Fragment, ...]) -> Iterator[Fragment]:
            for ptr in pointers:
                if ptr.limit > start:
                    snap = self.snapshot(ptr)
                    yield from walk(snap.snapshots, snap.fragments)
            for frag in fragments:
                if frag.limit > start:
                    yield frag

        yield from walk(manifest.snapshots, manifest.fragments)

    def fetch(self, fragment: Fragment) -> list[Record]:
        """A fragment's records, verified against the manifest's setsum and bounds."""
        try:
            data, _ = self._log.get(fragment.path)
        except NotFound:
            oldest = self.manifest().oldest_offset
            if fragment.limit <= oldest:
                raise GarbageCollected(
                    f"fragment {self._log.key(fragment.path)} was garbage collected while "
                    f"being read; the log now starts at offset {oldest}"
                ) from None
            raise CorruptFragment(
                f"fragment {self._log.key(fragment.path)} is referenced but missing"
            ) from None
        decoded = decode_fragment(data, path=self._log.key(fragment.path), start=fragment.start)
        if decoded.setsum != fragment.setsum:
            raise CorruptFragment(
                f"fragment {self._log.key(fragment.path)} sums to {decoded.setsum.hexdigest()}, "
                f"the manifest says {fragment.setsum.hexdigest()}"
            )
        if decoded.start != fragment.start or decoded.limit != fragment.limit:
            raise CorruptFragment(
                f"fragment {self._log.key(fragment.path)} holds [{decoded.start}, "
                f"{decoded.limit}), the manifest says [{fragment.start}, {fragment.limit})"
            )
        return [Record(o, t, b) for o, t, b in
                zip(decoded.offsets, decoded.timestamps_us, decoded.bodies, strict=True)]

    def read(self, from_offset: int | None = None, limits: Limits | None = None) -> list[Record]:
        """Records from ``from_offset`` on, within ``limits``."""
        manifest = self.manifest()
        start = self._check_start(manifest, from_offset)
        limits = limits or Limits()
        out: list[Record] = []
        for frag in self.scan(start, limits, manifest=manifest):
            out.extend(r for r in self.fetch(frag) if r.offset >= start)
        if limits.max_records is not None:
            del out[limits.max_records:]
        return out

    def records(self, from_offset: int | None = None, *,
                manifest: Manifest | None = None) -> Iterator[Record]:
        """Every record from ``from_offset`` to the end of the manifest read now."""
        manifest = manifest or self.manifest()
        start = self._check_start(manifest, from_offset)
        for frag in self._leaves(manifest, start):
            for record in self.fetch(frag):
                if record.offset >= start:
                    yield record

    # -- scrub ---------------------------------------------------------------------------

    def scrub(self, *, raise_on_problem: bool = True,
              progress: Callable[[ScrubReport], None] | None = None) -> ScrubReport:
        """Check the whole log: the manifest, every snapshot and every fragment.

        Each snapshot must match its pointer and sum to its children; each fragment must
        decode, sum to its pointer's setsum and hold exactly its offsets; the leaves must
        be contiguous with sequential numbers; and everything plus ``collected`` must sum
        to the manifest's setsum. Raises ``CorruptLog`` listing every problem (unless
        ``raise_on_problem`` is false: then read ``report.problems``).
        """
        report = ScrubReport(log=self._log.describe())
        try:
            manifest = self.manifest(check=False)  # its problems are listed below
        except CorruptManifest as exc:
            report.problems.append(str(exc))
            return self._finish(report, raise_on_problem)
        report.manifest_setsum = manifest.setsum.hexdigest()
        report.oldest_offset, report.next_offset = manifest.oldest_offset, manifest.next_offset
        report.problems += manifest.problems()
        leaves: list[Fragment] = []
        total = Setsum()

        def walk(pointers: tuple[SnapshotPointer, ...], fragments: tuple[Fragment, ...]) -> None:
            nonlocal total
            for ptr in pointers:
                try:
                    snap = load_snapshot(self._log, ptr, check=False)  # problems below
                except CorruptLog as exc:
                    report.problems.append(str(exc))
                    total = total + ptr.setsum
                    continue
                report.snapshots += 1
                report.problems.extend(snap.problems())
                walk(snap.snapshots, snap.fragments)
            leaves.extend(fragments)

        walk(manifest.snapshots, manifest.fragments)
        for i, frag in enumerate(leaves):
            if i and leaves[i - 1].limit != frag.start:
                report.problems.append(
                    f"leaf fragments {leaves[i - 1].seq_no} and {frag.seq_no} are not "
                    f"contiguous: {leaves[i - 1].limit} -> {frag.start}"
                )
            if i and leaves[i - 1].seq_no + 1 != frag.seq_no:
                report.problems.append(
                    f"leaf fragment seq_no {frag.seq_no} does not follow {leaves[i - 1].seq_no}"
                )
            total = total + frag.setsum
            try:
                records = self.fetch(frag)
            except CorruptLog as exc:
                report.problems.append(str(exc))
                continue
            report.fragments += 1
            report.records += len(records)
            report.bytes += frag.num_bytes
            if progress is not None and report.fragments % 64 == 0:
                progress(report)
        if total + manifest.collected != manifest.setsum:
            report.problems.append(
                f"the leaves sum to {total.hexdigest()}; with collected "
                f"{manifest.collected.hexdigest()} that is not the manifest's "
                f"{manifest.setsum.hexdigest()}"
            )
        return self._finish(report, raise_on_problem)

    @staticmethod
    def _finish(report: ScrubReport, raise_on_problem: bool) -> ScrubReport:
        if report.problems and raise_on_problem:
            shown = "; ".join(report.problems[:20])
            more = f" (and {len(report.problems) - 20} more)" if len(report.problems) > 20 else ""
            raise CorruptLog(f"scrub of {report.log} found {len(report.problems)} "
                             f"problem(s): {shown}{more}")
        return report
