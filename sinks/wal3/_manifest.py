"""Manifests and snapshots: the JSON that says which fragments make up a log.

Field names and order are Chroma wal3's (serde, compact), so its tools read ours and we
read theirs:

    Manifest  {"setsum", "collected", "acc_bytes", "writer", "snapshots": [pointer],
               "fragments": [fragment], "initial_offset"?, "initial_seq_no"?}
    pointer   {"setsum", "path_to_snapshot", "depth", "start", "limit", "num_bytes"}
    Snapshot  {"path", "depth", "setsum", "writer", "snapshots": [pointer],
               "fragments": [fragment]}
    fragment  {"path", "seq_no", "start", "limit", "num_bytes", "setsum"}
    position  {"offset"}

Setsums are 64 lowercase hex digits. ``collected`` is also read under the README's
older name ``pruned``. Beyond Chroma, a sealed manifest carries ``"sealed": true``
after the other fields (serde ignores unknown fields); unknown fields we read are kept
and written back in place.

The identity every manifest keeps: ``setsum == sum(snapshot setsums) + sum(fragment
setsums) + collected``. Appending adds a fragment's setsum to both sides; rolling
fragments into a snapshot moves setsum between terms; garbage collection moves it from
the pointers into ``collected``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from sinks._setsum import Setsum
from sinks.wal3._errors import CorruptManifest
from sinks.wal3._paths import fragment_path, parse_fragment_path, parse_snapshot_path, snapshot_path

__all__ = [
    "Fragment",
    "LogPosition",
    "Manifest",
    "ScrubSuccess",
    "Snapshot",
    "SnapshotOptions",
    "SnapshotPointer",
]

_MAX_U64: Final = (1 << 64) - 1
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


# -- parsing helpers ----------------------------------------------------------------------


def _obj(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise CorruptManifest(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def _field(obj: Mapping[str, Any], name: str, what: str) -> Any:
    try:
        return obj[name]
    except KeyError:
        raise CorruptManifest(f"{what} has no field {name!r}") from None


def _u64(value: Any, what: str) -> int:
    if type(value) is not int or not 0 <= value <= _MAX_U64:
        raise CorruptManifest(f"{what} must be an unsigned 64-bit integer, got {value!r:.40}")
    return value


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise CorruptManifest(f"{what} must be a string, got {type(value).__name__}")
    return value


def _setsum(value: Any, what: str) -> Setsum:
    try:
        return Setsum.from_hexdigest(_str(value, what))
    except ValueError as exc:
        raise CorruptManifest(f"{what} is not a setsum: {exc}") from None


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise CorruptManifest(f"{what} must be a JSON array, got {type(value).__name__}")
    return value


def _position(value: Any, what: str) -> int:
    return _u64(_field(_obj(value, what), "offset", what), f"{what}.offset")


def _load_json(data: str | bytes | bytearray | memoryview, what: str) -> Any:
    try:
        return json.loads(bytes(data) if isinstance(data, memoryview) else data)
    except (ValueError, RecursionError) as exc:
        # ValueError: bad JSON or UTF-8, or an integer of more digits than Python
        # converts (sys.get_int_max_str_digits); RecursionError: nesting too deep.
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise CorruptManifest(f"{what} is not valid JSON: {reason:.200}") from None


# -- value types --------------------------------------------------------------------------


@dataclass(frozen=True, order=True, slots=True)
class LogPosition:
    """A record's place in the log: offsets count records, starting at 1, with no gaps."""

    offset: int

    def to_obj(self) -> dict[str, int]:
        return {"offset": self.offset}

    def __int__(self) -> int:
        return self.offset


@dataclass(frozen=True, slots=True)
class ScrubSuccess:
    """What a scrub computed: the setsum of the pointers it checked and their bytes."""

    calculated_setsum: Setsum
    bytes_read: int


@dataclass(frozen=True, slots=True)
class SnapshotOptions:
    """When the writer rolls the manifest's pointers into snapshots.

    ``fragment_rollover_threshold``: once the manifest holds more fragments than this,
    the oldest this-many become one depth-1 snapshot (the newest fragment always stays,
    so the next sequence number is never lost). ``snapshot_rollover_threshold``: once
    this many consecutive snapshot pointers of one depth sit in the manifest, they
    become one snapshot a level deeper. Chroma's defaults size both for ~0.5 MB.
    """

    fragment_rollover_threshold: int = (1 << 19) // 256
    snapshot_rollover_threshold: int = (1 << 18) // 142

    def __post_init__(self) -> None:
        if self.fragment_rollover_threshold < 1 or self.snapshot_rollover_threshold < 2:
            raise ValueError(
                "fragment_rollover_threshold must be >= 1 and snapshot_rollover_threshold >= 2"
            )


@dataclass(frozen=True, slots=True)
class Fragment:
    """A pointer to one immutable Parquet file holding records [start, limit)."""

    path: str
    seq_no: int
    start: int
    limit: int
    num_bytes: int
    setsum: Setsum
    _json: str = field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_json", _dumps({
            "path": self.path, "seq_no": self.seq_no, "start": {"offset": self.start},
            "limit": {"offset": self.limit}, "num_bytes": self.num_bytes,
            "setsum": self.setsum.hexdigest(),
        }))

    @classmethod
    def from_obj(cls, value: Any, what: str = "fragment") -> Fragment:
        obj = _obj(value, what)
        return cls(
            path=_str(_field(obj, "path", what), f"{what}.path"),
            seq_no=_u64(_field(obj, "seq_no", what), f"{what}.seq_no"),
            start=_position(_field(obj, "start", what), f"{what}.start"),
            limit=_position(_field(obj, "limit", what), f"{what}.limit"),
            num_bytes=_u64(_field(obj, "num_bytes", what), f"{what}.num_bytes"),
            setsum=_setsum(_field(obj, "setsum", what), f"{what}.setsum"),
        )

    def to_json(self) -> str:
        return self._json

    def contains(self, offset: int) -> bool:
        return self.start <= offset < self.limit

    def problems(self, where: str) -> list[str]:
        out = []
        if not self.start < self.limit:
            out.append(f"{where}: start {self.start} is not below limit {self.limit}")
        if parse_fragment_path(self.path) != self.seq_no:
            out.append(
                f"{where}: path {self.path!r} is not the path of seq_no {self.seq_no} "
                f"({fragment_path(self.seq_no)!r})"
            )
        return out


@dataclass(frozen=True, slots=True)
class SnapshotPointer:
    """A pointer to a snapshot holding records [start, limit), named by its setsum."""

    setsum: Setsum
    path_to_snapshot: str
    depth: int
    start: int
    limit: int
    num_bytes: int

    @classmethod
    def from_obj(cls, value: Any, what: str = "snapshot pointer") -> SnapshotPointer:
        obj = _obj(value, what)
        depth = _u64(_field(obj, "depth", what), f"{what}.depth")
        if depth > 255:
            raise CorruptManifest(f"{what}.depth {depth} does not fit in a u8")
        return cls(
            setsum=_setsum(_field(obj, "setsum", what), f"{what}.setsum"),
            path_to_snapshot=_str(_field(obj, "path_to_snapshot", what),
                                  f"{what}.path_to_snapshot"),
            depth=depth,
            start=_position(_field(obj, "start", what), f"{what}.start"),
            limit=_position(_field(obj, "limit", what), f"{what}.limit"),
            num_bytes=_u64(_field(obj, "num_bytes", what), f"{what}.num_bytes"),
        )

    def to_json(self) -> str:
        return _dumps({
            "setsum": self.setsum.hexdigest(), "path_to_snapshot": self.path_to_snapshot,
            "depth": self.depth, "start": {"offset": self.start},
            "limit": {"offset": self.limit}, "num_bytes": self.num_bytes,
        })

    def problems(self, where: str) -> list[str]:
        out = []
        if not self.start < self.limit:
            out.append(f"{where}: start {self.start} is not below limit {self.limit}")
        if self.depth < 1:
            out.append(f"{where}: depth {self.depth} is below 1")
        named = parse_snapshot_path(self.path_to_snapshot)
        if named is None:
            out.append(f"{where}: {self.path_to_snapshot!r} is not a snapshot path")
        elif named != self.setsum:
            out.append(
                f"{where}: path {self.path_to_snapshot!r} names setsum {named.hexdigest()}, "
                f"the pointer says {self.setsum.hexdigest()}"
            )
        return out


def _chain_problems(
    snapshots: Sequence[SnapshotPointer], fragments: Sequence[Fragment], where: str
) -> list[str]:
    """Contiguity of pointers and sequentiality of fragment numbers."""
    out: list[str] = []
    for i, snap in enumerate(snapshots):
        out += snap.problems(f"{where} snapshot {i}")
    for i, frag in enumerate(fragments):
        out += frag.problems(f"{where} fragment {i} (seq_no {frag.seq_no})")
    for i in range(1, len(snapshots)):
        if snapshots[i - 1].limit != snapshots[i].start:
            out.append(
                f"{where}: snapshots {i - 1} and {i} are not contiguous: "
                f"limit {snapshots[i - 1].limit} -> start {snapshots[i].start}"
            )
    for i in range(1, len(fragments)):
        lhs, rhs = fragments[i - 1], fragments[i]
        if lhs.limit != rhs.start:
            out.append(
                f"{where}: fragments {i - 1} and {i} are not contiguous: "
                f"limit {lhs.limit} -> start {rhs.start}"
            )
        if lhs.seq_no + 1 != rhs.seq_no:
            out.append(
                f"{where}: fragment seq_no {rhs.seq_no} does not follow {lhs.seq_no}"
            )
    if snapshots and fragments and snapshots[-1].limit != fragments[0].start:
        out.append(
            f"{where}: the last snapshot ends at {snapshots[-1].limit} but the first "
            f"fragment starts at {fragments[0].start}"
        )
    return out


def _sum(snapshots: Iterable[SnapshotPointer], fragments: Iterable[Fragment]) -> Setsum:
    total = Setsum()
    for snap in snapshots:
        total = total + snap.setsum
    for frag in fragments:
        total = total + frag.setsum
    return total


def _bounds(
    snapshots: Sequence[SnapshotPointer], fragments: Sequence[Fragment]
) -> tuple[int, int] | None:
    starts = [s.start for s in snapshots[:1]] + [f.start for f in fragments[:1]]
    limits = [s.limit for s in snapshots[-1:]] + [f.limit for f in fragments[-1:]]
    return (min(starts), max(limits)) if starts else None


# -- snapshots ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Snapshot:
    """An immutable interior node: either snapshot pointers or fragments, never both."""

    path: str
    depth: int
    setsum: Setsum
    writer: str
    snapshots: tuple[SnapshotPointer, ...]
    fragments: tuple[Fragment, ...]

    @classmethod
    def build(
        cls, depth: int, writer: str, snapshots: Sequence[SnapshotPointer] = (),
        fragments: Sequence[Fragment] = (),
    ) -> Snapshot:
        setsum = _sum(snapshots, fragments)
        return cls(snapshot_path(setsum), depth, setsum, writer, tuple(snapshots),
                   tuple(fragments))

    @classmethod
    def from_obj(cls, value: Any, what: str = "snapshot") -> Snapshot:
        obj = _obj(value, what)
        depth = _u64(_field(obj, "depth", what), f"{what}.depth")
        return cls(
            path=_str(_field(obj, "path", what), f"{what}.path"),
            depth=depth,
            setsum=_setsum(_field(obj, "setsum", what), f"{what}.setsum"),
            writer=_str(_field(obj, "writer", what), f"{what}.writer"),
            snapshots=tuple(
                SnapshotPointer.from_obj(s, f"{what}.snapshots[{i}]")
                for i, s in enumerate(_list(_field(obj, "snapshots", what), what))
            ),
            fragments=tuple(
                Fragment.from_obj(f, f"{what}.fragments[{i}]")
                for i, f in enumerate(_list(_field(obj, "fragments", what), what))
            ),
        )

    @classmethod
    def from_json(cls, data: str | bytes | bytearray | memoryview) -> Snapshot:
        """Parse a snapshot (ours or Chroma's). Raises ``CorruptManifest``."""
        return cls.from_obj(_load_json(data, "snapshot"))

    def to_json(self) -> str:
        return "".join([
            '{"path":', _dumps(self.path), ',"depth":', str(self.depth),
            ',"setsum":"', self.setsum.hexdigest(), '","writer":', _dumps(self.writer),
            ',"snapshots":[', ",".join(s.to_json() for s in self.snapshots),
            '],"fragments":[', ",".join(f.to_json() for f in self.fragments), "]}",
        ])

    @property
    def num_bytes(self) -> int:
        return sum(s.num_bytes for s in self.snapshots) + sum(f.num_bytes for f in self.fragments)

    @property
    def start(self) -> int:
        bounds = _bounds(self.snapshots, self.fragments)
        return 1 if bounds is None else bounds[0]

    @property
    def limit(self) -> int:
        bounds = _bounds(self.snapshots, self.fragments)
        return 1 if bounds is None else bounds[1]

    def to_pointer(self) -> SnapshotPointer:
        return SnapshotPointer(self.setsum, self.path, self.depth, self.start, self.limit,
                               self.num_bytes)

    def problems(self) -> list[str]:
        where = f"snapshot {self.path}"
        out = []
        if self.snapshots and self.fragments:
            out.append(f"{where}: holds both snapshots and fragments")
        if not self.snapshots and not self.fragments:
            out.append(f"{where}: is empty")
        child_depth = max((s.depth for s in self.snapshots), default=0)
        if child_depth >= self.depth:
            out.append(f"{where}: depth {self.depth} is not above its children's {child_depth}")
        calculated = _sum(self.snapshots, self.fragments)
        if calculated != self.setsum:
            out.append(
                f"{where}: setsum {self.setsum.hexdigest()} != sum of its children "
                f"{calculated.hexdigest()}"
            )
        named = parse_snapshot_path(self.path)
        if named != self.setsum:
            out.append(f"{where}: the path does not name its setsum {self.setsum.hexdigest()}")
        return out + _chain_problems(self.snapshots, self.fragments, where)

    def scrub(self) -> ScrubSuccess:
        """Check this snapshot on its own (no I/O); raise ``CorruptManifest`` if broken."""
        problems = self.problems()
        if problems:
            raise CorruptManifest("snapshot fails scrub: " + "; ".join(problems))
        return ScrubSuccess(self.setsum, self.num_bytes)


# -- the manifest -------------------------------------------------------------------------

_KNOWN: Final = frozenset({
    "setsum", "collected", "pruned", "acc_bytes", "writer", "snapshots", "fragments",
    "initial_offset", "initial_seq_no", "sealed",
})


@dataclass(frozen=True, slots=True)
class Manifest:
    """The root of a log. Immutable: every change returns a new manifest."""

    setsum: Setsum
    collected: Setsum
    acc_bytes: int
    writer: str
    snapshots: tuple[SnapshotPointer, ...]
    fragments: tuple[Fragment, ...]
    initial_offset: int | None = None
    initial_seq_no: int | None = None
    sealed: bool = False
    extra: tuple[tuple[str, str], ...] = ()  # unknown fields, as (name, JSON text)

    # -- construction -----------------------------------------------------------------

    @classmethod
    def new_empty(cls, writer: str, *, initial_offset: int | None = None,
                  initial_seq_no: int | None = None) -> Manifest:
        return cls(Setsum(), Setsum(), 0, writer, (), (), initial_offset, initial_seq_no)

    @classmethod
    def from_json(cls, data: str | bytes | bytearray | memoryview) -> Manifest:
        """Parse a manifest (ours or Chroma's). Raises ``CorruptManifest``."""
        obj = _obj(_load_json(data, "manifest"), "manifest")
        collected_raw = obj.get("collected", obj.get("pruned"))
        initial_offset = obj.get("initial_offset")
        initial_seq_no = obj.get("initial_seq_no")
        sealed = obj.get("sealed", False)
        if not isinstance(sealed, bool):
            raise CorruptManifest("manifest.sealed must be a boolean")
        try:
            extra = tuple((k, _dumps(v)) for k, v in obj.items() if k not in _KNOWN)
        except RecursionError:  # the parser got through; re-encoding is a frame deeper
            raise CorruptManifest("manifest: an unknown field is nested too deeply") from None
        return cls(
            setsum=_setsum(_field(obj, "setsum", "manifest"), "manifest.setsum"),
            collected=(Setsum() if collected_raw is None
                       else _setsum(collected_raw, "manifest.collected")),
            acc_bytes=_u64(_field(obj, "acc_bytes", "manifest"), "manifest.acc_bytes"),
            writer=_str(_field(obj, "writer", "manifest"), "manifest.writer"),
            snapshots=tuple(
                SnapshotPointer.from_obj(s, f"manifest.snapshots[{i}]")
                for i, s in enumerate(_list(_field(obj, "snapshots", "manifest"),
                                            "manifest.snapshots"))
            ),
            fragments=tuple(
                Fragment.from_obj(f, f"manifest.fragments[{i}]")
                for i, f in enumerate(_list(_field(obj, "fragments", "manifest"),
                                            "manifest.fragments"))
            ),
            initial_offset=(None if initial_offset is None
                            else _position(initial_offset, "manifest.initial_offset")),
            initial_seq_no=(None if initial_seq_no is None
                            else _u64(initial_seq_no, "manifest.initial_seq_no")),
            sealed=sealed,
            extra=extra,
        )

    def to_json(self) -> str:
        """Compact JSON with Chroma's field order."""
        parts = [
            '{"setsum":"', self.setsum.hexdigest(), '","collected":"',
            self.collected.hexdigest(), '","acc_bytes":', str(self.acc_bytes),
            ',"writer":', _dumps(self.writer),
            ',"snapshots":[', ",".join(s.to_json() for s in self.snapshots),
            '],"fragments":[', ",".join(f.to_json() for f in self.fragments), "]",
        ]
        if self.initial_offset is not None:
            parts += [',"initial_offset":{"offset":', str(self.initial_offset), "}"]
        if self.initial_seq_no is not None:
            parts += [',"initial_seq_no":', str(self.initial_seq_no)]
        if self.sealed:
            parts.append(',"sealed":true')
        for name, text in self.extra:
            parts += [",", _dumps(name), ":", text]
        parts.append("}")
        return "".join(parts)

    def to_bytes(self) -> bytes:
        return self.to_json().encode()

    # -- positions ----------------------------------------------------------------------

    @property
    def next_offset(self) -> int:
        """The offset the next appended record gets."""
        bounds = _bounds(self.snapshots, self.fragments)
        if bounds is None:
            return self.initial_offset if self.initial_offset is not None else 1
        return bounds[1]

    @property
    def oldest_offset(self) -> int:
        """The lowest offset still readable (everything below was garbage collected)."""
        bounds = _bounds(self.snapshots, self.fragments)
        if bounds is None:
            return self.initial_offset if self.initial_offset is not None else 1
        return bounds[0]

    @property
    def next_seq_no(self) -> int:
        if self.fragments:
            return self.fragments[-1].seq_no + 1
        return self.initial_seq_no if self.initial_seq_no is not None else 1

    def fragment(self, seq_no: int) -> Fragment | None:
        """The root fragment with this sequence number, if the manifest holds it."""
        if not self.fragments:
            return None
        index = seq_no - self.fragments[0].seq_no
        if 0 <= index < len(self.fragments) and self.fragments[index].seq_no == seq_no:
            return self.fragments[index]
        return next((f for f in self.fragments if f.seq_no == seq_no), None)

    # -- scrub --------------------------------------------------------------------------

    def problems(self) -> list[str]:
        out = []
        calculated = _sum(self.snapshots, self.fragments)
        if calculated + self.collected != self.setsum:
            out.append(
                f"manifest setsum {self.setsum.hexdigest()} != snapshots + fragments "
                f"{calculated.hexdigest()} + collected {self.collected.hexdigest()}"
            )
        out += _chain_problems(self.snapshots, self.fragments, "manifest")
        bounds = _bounds(self.snapshots, self.fragments)
        first = self.initial_offset if self.initial_offset is not None else 1
        if bounds and bounds[0] != first and (self.initial_offset is not None
                                              or not self.collected):
            # Offsets start at 1; only garbage collection (which records the new start
            # in initial_offset) moves the oldest pointer up.
            out.append(
                f"manifest: the oldest pointer starts at {bounds[0]}, but the log starts "
                f"at {first}"
            )
        if (self.initial_seq_no is not None and self.fragments
                and self.fragments[0].seq_no < self.initial_seq_no):
            out.append(
                f"manifest: fragment seq_no {self.fragments[0].seq_no} is below "
                f"initial_seq_no {self.initial_seq_no}"
            )
        return out

    def scrub(self) -> ScrubSuccess:
        """Check every invariant that needs no I/O; raise ``CorruptManifest`` naming each
        broken one (setsum identity, start < limit, contiguity, sequential seq_no, paths).
        """
        problems = self.problems()
        if problems:
            raise CorruptManifest("manifest fails scrub: " + "; ".join(problems))
        return ScrubSuccess(
            _sum(self.snapshots, self.fragments),
            sum(s.num_bytes for s in self.snapshots) + sum(f.num_bytes for f in self.fragments),
        )

    # -- changes ------------------------------------------------------------------------

    def can_apply(self, fragment: Fragment) -> bool:
        return fragment.seq_no == self.next_seq_no and fragment.start == self.next_offset \
            and fragment.start < fragment.limit

    def apply_fragments(self, fragments: Sequence[Fragment], writer: str) -> Manifest:
        """Append fragments, which must follow on in sequence number and offset."""
        setsum, acc = self.setsum, self.acc_bytes
        seq_no, offset = self.next_seq_no, self.next_offset
        for frag in fragments:
            if frag.seq_no != seq_no or frag.start != offset or frag.start >= frag.limit:
                raise CorruptManifest(
                    f"fragment seq_no {frag.seq_no} [{frag.start}, {frag.limit}) does not "
                    f"follow the manifest (next seq_no {seq_no}, next offset {offset})"
                )
            seq_no, offset = seq_no + 1, frag.limit
            setsum = setsum + frag.setsum
            acc = min(acc + frag.num_bytes, _MAX_U64)
        return replace(self, setsum=setsum, acc_bytes=acc, writer=writer,
                       fragments=self.fragments + tuple(fragments))

    def with_writer(self, writer: str) -> Manifest:
        return replace(self, writer=writer)

    def seal(self, writer: str) -> Manifest:
        return replace(self, sealed=True, writer=writer)

    def generate_snapshot(self, options: SnapshotOptions, writer: str) -> Snapshot | None:
        """A snapshot that would shrink this manifest, or None if it is small enough.

        Fragments roll up first (the oldest ``fragment_rollover_threshold``, always
        leaving the newest fragment in the manifest); otherwise the oldest run of
        ``snapshot_rollover_threshold`` consecutive pointers of one depth rolls up into
        one pointer a level deeper.
        """
        threshold = options.fragment_rollover_threshold
        if len(self.fragments) > threshold:
            return Snapshot.build(1, writer, fragments=self.fragments[:threshold])
        run = options.snapshot_rollover_threshold
        for i in range(len(self.snapshots) - run + 1):
            depth = self.snapshots[i].depth
            if depth < 255 and all(s.depth == depth for s in self.snapshots[i : i + run]):
                return Snapshot.build(depth + 1, writer, snapshots=self.snapshots[i : i + run])
        return None

    def apply_snapshot(self, snapshot: Snapshot) -> Manifest:
        """Replace the pointers ``snapshot`` holds by one pointer to it (setsum unchanged)."""
        if snapshot.fragments:
            n = len(snapshot.fragments)
            if self.fragments[:n] != snapshot.fragments or n >= len(self.fragments) + 1:
                raise CorruptManifest(
                    f"snapshot {snapshot.path} does not hold a prefix of the manifest's fragments"
                )
            new = replace(self, snapshots=(*self.snapshots, snapshot.to_pointer()),
                          fragments=self.fragments[n:])
        else:
            n = len(snapshot.snapshots)
            index = next((i for i in range(len(self.snapshots) - n + 1)
                          if self.snapshots[i : i + n] == snapshot.snapshots), None)
            if index is None or n == 0:
                raise CorruptManifest(
                    f"snapshot {snapshot.path} does not hold a run of the manifest's snapshots"
                )
            new = replace(self, snapshots=(*self.snapshots[:index], snapshot.to_pointer(),
                                     *self.snapshots[index + n :]))
        new.scrub()
        return new

    def apply_garbage(self, garbage: Any) -> Manifest:
        """The manifest without what ``garbage`` (a ``Garbage``) drops; scrubbed."""
        if garbage.fragments_to_drop_start > garbage.fragments_to_drop_limit:
            raise CorruptManifest(
                f"garbage drops fragments [{garbage.fragments_to_drop_start}, "
                f"{garbage.fragments_to_drop_limit}): start is above limit"
            )
        drop = set(garbage.snapshots_to_drop)
        snapshots = [s for s in self.snapshots if s not in drop]
        fragments = tuple(
            f for f in self.fragments
            if not garbage.fragments_to_drop_start <= f.seq_no < garbage.fragments_to_drop_limit
        )
        root = garbage.snapshot_for_root
        if root is not None and root not in snapshots:
            snapshots.insert(0, root)
        initial_seq_no = self.initial_seq_no
        if garbage.fragments_to_drop_start < garbage.fragments_to_drop_limit:
            initial_seq_no = garbage.fragments_to_drop_limit
        elif initial_seq_no is None:
            initial_seq_no = 1
        new = replace(
            self, snapshots=tuple(snapshots), fragments=fragments,
            collected=self.collected + garbage.setsum_to_discard,
            initial_offset=garbage.first_to_keep, initial_seq_no=initial_seq_no,
        )
        new.scrub()
        return new

    def references(self, load: Callable[[SnapshotPointer], Snapshot]) -> Iterable[str]:
        """Every path this manifest reaches, walking snapshots with ``load``."""
        stack = list(self.snapshots)
        yield from (f.path for f in self.fragments)
        while stack:
            ptr = stack.pop()
            yield ptr.path_to_snapshot
            snap = load(ptr)
            stack.extend(snap.snapshots)
            yield from (f.path for f in snap.fragments)
