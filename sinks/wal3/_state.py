"""State beside the log: checkpoints and compacted stripes, published through the manifest.

A *retained point* is a log offset a reader may stand at (a cursor's position). A
**checkpoint** is the replay state as of the oldest retained point: every cell, the
frontier (one position per domain) and the records read before that offset whose
interval was not complete yet (*carried* records, as codec messages). A **stripe**
takes a reader from one retained point to the next: the net change of every cell that
changed (value before, value after), the frontier after, and the records carried there.
Everything between two retained points is indistinguishable to a reader (seed 004), so
a stripe replaces all of it.

Objects (immutable, content-addressed by the SHA-256 of their bytes, If-None-Match):

    state/CHECKPOINT.<sha256 hex>    state/STRIPE.<sha256 hex>    state/INDEX.<sha256 hex>

``CHECKPOINT``/``STRIPE`` layout, versions 1 and 2::

    b"CDCSTATE" | version u8 (1 or 2) | kind u8 (1 checkpoint, 2 stripe) |
    header_len u32 (BE) | header (compact JSON, sorted keys) |
    cells: Arrow IPC stream of STATE_CELL_SCHEMA, version 2: STATE_CELL_SCHEMA_V2
           (header "cells_bytes" long) |
    carried: Arrow IPC stream of CARRIED_SCHEMA (the rest)

Version 2 (written only when one of its additions is needed, so an object version 1
can express is written, byte for byte, as before; this reader reads both):

- each cell row names the ``domain`` whose changesets changed it: a stripe's rows are
  per domain, in the order the domains' changesets go out (header ``order``: ``[[domain,
  events], ...]``); a cell several domains changed one after the other has one row per
  domain (the values it took in between), so replaying the rows in order chains;
- rows of ``role`` 1 are the *carry*: baseline chunk changes applied to the state but
  not yet handed out in a changeset at ``hi`` (value: the state's; before: what the
  changesets last showed). A stripe's role-0 rows then move the *changeset view* (the
  state with carried cells at their ``before``), which the state follows;
- header ``baseline``: the bookkeeping of a baseline a fresh consumer is still
  applying at ``hi`` (``replay._resume`` writes and reads it);
- header ``domain_order``: the order a reader of the log met its domains (the order
  it hands out their changesets in), when that is not ascending.

The header holds ``lo`` and ``hi`` (the retained points it goes from and to; a
checkpoint's ``lo`` is the log's first offset), ``before`` and ``after`` (frontier
tokens), ``trusted`` (the replay held the whole store), ``cells`` (row count),
``cells_setsum`` (setsum of the cell items), ``state_setsum`` (setsum of the whole
state at ``hi``) and ``replaced`` (``records``, ``events``, ``setsum``: the wal3 records
of offsets ``[lo, hi)`` it stands for, each item ``be64(offset) || be64(timestamp_us) ||
body`` as in fragments). A cell item is
``b"CDCCELL1" | table_len u16 | table | row_len u32 | tagged row | column_len u16 |
column | value_len u32 | tagged value`` (ABSENT cells have no item).

The ``INDEX`` (compact JSON) lists the checkpoint then the stripes in order, each with
its path, SHA-256, size and header summary, plus ``points`` (the retained offsets),
``limit`` (the last point: raw records are read from there) and ``replaced_setsum``
(the checkpoint's and every stripe's ``replaced`` summed). The manifest points at the
index in a field Chroma's readers ignore: ``"cdc_state":{"index":"state/INDEX.<hex>"}``,
installed by compare-and-swap: readers see the old state or the new, never a mix.

Accounting (checked before garbage collection frees fragments, and by scrub): the
index's ``replaced_setsum`` equals the manifest's ``collected`` plus the setsum of the
retained records below ``limit``.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

import pyarrow as pa

from sinks._setsum import Setsum
from sinks.codec import decode_key
from sinks.wal3._errors import CorruptLog, GarbageCollected, Wal3Error
from sinks.wal3._fragment import record_setsum
from sinks.wal3._manifest import Manifest
from sinks.wal3._ops import require_manifest
from sinks.wal3._paths import MANIFEST_PATH
from sinks.wal3._store import LogStore, NotFound, PreconditionFailed

__all__ = [
    "CARRIED_SCHEMA",
    "STATE_CELL_SCHEMA",
    "CorruptState",
    "NotARetainedPoint",
    "StateDelta",
    "StateEntry",
    "StateContention",
    "StateIndex",
    "cell_item",
    "check_accounting",
    "decode_state",
    "encode_state",
    "load_state_index",
    "load_state",
    "publish_state_index",
    "state_setsum",
]

STATE_VERSION: Final = 2  # objects; the index stays version 1
INDEX_VERSION: Final = 1
_MAGIC: Final = b"CDCSTATE"
_KINDS: Final = {"checkpoint": 1, "stripe": 2}
_HEAD: Final = struct.Struct(">BBI")
STATE_PREFIX: Final = "state/"
MANIFEST_FIELD: Final = "cdc_state"

STATE_CELL_SCHEMA: Final = pa.schema([
    pa.field("table", pa.utf8(), nullable=False),
    pa.field("row", pa.binary(), nullable=False),
    pa.field("column", pa.utf8(), nullable=False),
    pa.field("value", pa.binary(), nullable=False),   # tagged value, b"": ABSENT
    pa.field("before", pa.binary(), nullable=False),  # stripes: the value replaced
])
STATE_CELL_SCHEMA_V2: Final = pa.schema([
    *STATE_CELL_SCHEMA,
    pa.field("domain", pa.uint64(), nullable=False),  # the domain whose changesets moved it
    pa.field("role", pa.uint8(), nullable=False),  # 0: a cell row, 1: carry
])
CARRIED_SCHEMA: Final = pa.schema([pa.field("message", pa.binary(), nullable=False)])


class CorruptState(CorruptLog):
    """A checkpoint, stripe or state index fails to decode or to verify."""


class NotARetainedPoint(GarbageCollected):
    """A reader asked to start where compaction or collection left no retained point."""


# -- cells ----------------------------------------------------------------------------

def split_key(key: bytes) -> tuple[str, bytes, str]:
    """An encoded cell (``table NUL column NUL tagged row``) as (table, row, column)."""
    table, column, row = key.split(b"\x00", 2)
    return table.decode(), row, column.decode()


def join_key(table: str, row: bytes, column: str) -> bytes:
    return table.encode() + b"\x00" + column.encode() + b"\x00" + row


_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


def cell_item(key: bytes, value: bytes) -> bytes:
    """The setsum item of one present cell (``key`` encoded as the assembler does)."""
    table, column, row = key.split(b"\x00", 2)
    return b"".join((b"CDCCELL1", _U16.pack(len(table)), table, _U32.pack(len(row)), row,
                     _U16.pack(len(column)), column, _U32.pack(len(value)), value))


def state_setsum(state: dict[bytes, bytes]) -> Setsum:
    """The setsum of a whole state (encoded cell -> tagged value)."""
    return Setsum.of(cell_item(k, v) for k, v in state.items() if v)


def moved_setsum(start: Setsum, keys: Sequence[bytes], befores: Sequence[bytes],
                 values: Sequence[bytes]) -> Setsum:
    """``start`` with each cell's ``before`` item taken out and its ``value`` put in."""
    gone = Setsum.of(cell_item(k, b) for k, b in zip(keys, befores, strict=True) if b)
    new = Setsum.of(cell_item(k, v) for k, v in zip(keys, values, strict=True) if v)
    return start - gone + new


# -- one checkpoint or stripe -----------------------------------------------------------

@dataclass(frozen=True)
class StateDelta:
    """A checkpoint (``kind == "checkpoint"``: every cell, ``befores`` all ABSENT) or a
    stripe (the cells that changed between two retained points). It is also what
    ``read_log`` yields for the compacted part of a log; ``replay`` applies it."""

    kind: str
    lo: int
    hi: int
    before: str  # frontier token at lo ("" for a checkpoint)
    after: str  # frontier token at hi
    trusted: bool
    keys: tuple[bytes, ...]
    values: tuple[bytes, ...]
    befores: tuple[bytes, ...]
    carried: tuple[bytes, ...]
    state_setsum: str
    replaced_records: int
    replaced_events: int
    replaced_setsum: str
    cells_setsum: str = ""
    # Version 2 (see the module docstring); empty: version 1.
    domains: tuple[int, ...] = ()  # per row: the domain whose changesets moved the cell
    order: tuple[tuple[int, int], ...] = ()  # (domain, events) in changeset order
    carry: tuple[tuple[bytes, bytes, bytes], ...] = ()  # (cell, state value, before)
    baseline: str = ""  # compact JSON (replay._resume)
    domain_order: tuple[int, ...] = ()  # the order a reader met the domains, if not sorted

    def __post_init__(self) -> None:
        if not self.cells_setsum:
            object.__setattr__(self, "cells_setsum", self.compute_cells_setsum().hexdigest())

    @property
    def version(self) -> int:
        return 2 if (self.domains or self.order or self.carry or self.baseline
                     or self.domain_order) else 1

    def compute_cells_setsum(self) -> Setsum:
        if self.version == 1:
            return Setsum.of(cell_item(k, v) + b"\x00" + b for k, v, b in
                             zip(self.keys, self.values, self.befores, strict=True))
        domains = self.domains or (0,) * len(self.keys)
        rows = Setsum.of(cell_item(k, v) + b"\x00" + b + b"\x00" + _U64.pack(d) for k, v, b, d
                         in zip(self.keys, self.values, self.befores, domains, strict=True))
        return rows + Setsum.of(b"CARRY" + cell_item(k, v) + b"\x00" + b
                                for k, v, b in self.carry)

    def header(self) -> dict[str, Any]:
        head: dict[str, Any] = {
            "kind": self.kind, "lo": self.lo, "hi": self.hi, "before": self.before,
            "after": self.after, "trusted": self.trusted, "cells": len(self.keys),
            "cells_setsum": self.cells_setsum, "state_setsum": self.state_setsum,
            "carried": len(self.carried),
            "replaced": {"records": self.replaced_records, "events": self.replaced_events,
                         "setsum": self.replaced_setsum},
        }
        if self.version == 2:
            head["order"] = [[d, n] for d, n in self.order]
            head["carry_cells"] = len(self.carry)
            head["baseline"] = self.baseline
            head["domain_order"] = list(self.domain_order)
        return head

    def rows_of(self, domain_id: int | None) -> list[int]:
        """The indexes of the rows on ``domain_id``'s changeset (version 1: every row
        goes with the last domain, ``None``)."""
        if not self.domains:
            return list(range(len(self.keys))) if domain_id is None else []
        return [i for i, d in enumerate(self.domains) if d == domain_id]


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def encode_state(delta: StateDelta) -> bytes:
    """The object bytes of a checkpoint or stripe (deterministic: same delta, same bytes)."""
    version = delta.version
    keys, values, befores = list(delta.keys), list(delta.values), list(delta.befores)
    if version == 2:
        keys += [k for k, _v, _b in delta.carry]
        values += [v for _k, v, _b in delta.carry]
        befores += [b for _k, _v, b in delta.carry]
    parts = [split_key(k) for k in keys]
    columns = [
        pa.array([p[0] for p in parts], pa.utf8()), pa.array([p[1] for p in parts], pa.binary()),
        pa.array([p[2] for p in parts], pa.utf8()), pa.array(values, pa.binary()),
        pa.array(befores, pa.binary())]
    if version == 2:
        domains = list(delta.domains or (0,) * len(delta.keys)) + [0] * len(delta.carry)
        roles = [0] * len(delta.keys) + [1] * len(delta.carry)
        columns += [pa.array(domains, pa.uint64()), pa.array(roles, pa.uint8())]
    schema = STATE_CELL_SCHEMA_V2 if version == 2 else STATE_CELL_SCHEMA
    cells_bytes = _ipc(pa.table(columns, schema=schema))
    carried = _ipc(pa.table([pa.array(delta.carried, pa.binary())], schema=CARRIED_SCHEMA))
    header = dict(delta.header(), cells_bytes=len(cells_bytes))
    head = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    return b"".join((_MAGIC, _HEAD.pack(version, _KINDS[delta.kind], len(head)), head,
                     cells_bytes, carried))


def decode_state(data: bytes, what: str = "state object") -> StateDelta:
    """Decode and verify (cell count, cell setsum) a checkpoint or stripe.
    Raises ``CorruptState`` naming ``what``."""
    try:
        if data[:8] != _MAGIC:
            raise ValueError(f"does not start with {_MAGIC!r}")
        version, kind_code, head_len = _HEAD.unpack_from(data, 8)
        if version not in (1, STATE_VERSION):
            raise ValueError(f"format version {version}; this reader knows 1 to "
                             f"{STATE_VERSION}")
        kind = {v: k for k, v in _KINDS.items()}.get(kind_code)
        if kind is None:
            raise ValueError(f"unknown kind {kind_code}")
        pos = 8 + _HEAD.size
        header: Any = json.loads(data[pos:pos + head_len])
        pos += head_len
        split = pos + _int(header["cells_bytes"])
        cells = pa.ipc.open_stream(pa.py_buffer(data[pos:split])).read_all()
        carried = pa.ipc.open_stream(pa.py_buffer(data[split:])).read_all()
        schema = STATE_CELL_SCHEMA_V2 if version == 2 else STATE_CELL_SCHEMA
        if not cells.schema.equals(schema) or not carried.schema.equals(CARRIED_SCHEMA):
            raise ValueError("unexpected Arrow schema")
        cells.validate(full=True)
        for i in range(cells.num_columns):
            if cells.column(i).null_count:
                raise ValueError("a cell column holds nulls")
        if carried.column(0).null_count:
            raise ValueError("a carried message is null")
        tables, rows, columns, values, befores = (cells.column(i).to_pylist() for i in range(5))
        for row in rows:
            decode_key(row)
        keys = tuple(join_key(t, r, c) for t, r, c in zip(tables, rows, columns, strict=True))
        replaced = header["replaced"]
        extra: dict[str, Any] = {}
        n = len(keys)
        if version == 2:
            domains, roles = cells.column(5).to_pylist(), cells.column(6).to_pylist()
            n = roles.index(1) if 1 in roles else len(roles)
            if any(r != 0 for r in roles[:n]) or any(r != 1 for r in roles[n:]):
                raise ValueError("cell rows must come before carry rows")
            order = tuple((_int(d), _int(e)) for d, e in header["order"])
            listed = {d for d, _e in order}
            if len(listed) != len(order) or any(d not in listed for d in domains[:n]
                                                if kind == "stripe"):
                raise ValueError("a row's domain is not in the header's order")
            extra = {"domains": tuple(domains[:n]) if kind == "stripe" else (),
                     "order": order, "baseline": _text(header["baseline"]),
                     "domain_order": tuple(_int(d) for d in header["domain_order"]),
                     "carry": tuple(zip(keys[n:], values[n:], befores[n:], strict=True))}
            if _int(header["carry_cells"]) != len(keys) - n:
                raise ValueError("carry_cells does not match the carry rows")
        delta = StateDelta(
            kind=kind, lo=_int(header["lo"]), hi=_int(header["hi"]),
            before=_text(header["before"]), after=_text(header["after"]),
            trusted=bool(header["trusted"]), keys=keys[:n], values=tuple(values[:n]),
            befores=tuple(befores[:n]), carried=tuple(carried.column(0).to_pylist()),
            state_setsum=_hexsum(header["state_setsum"]),
            replaced_records=_int(replaced["records"]), replaced_events=_int(replaced["events"]),
            replaced_setsum=_hexsum(replaced["setsum"]), cells_setsum=_text(header["cells_setsum"]),
            **extra)
        if delta.version != version:
            raise ValueError(f"a version-{version} object holding nothing of version "
                             f"{delta.version}")
    except CorruptState:
        raise
    except (ValueError, KeyError, TypeError, IndexError, struct.error, RecursionError,
            pa.ArrowException, OSError) as exc:
        raise CorruptState(f"{what} does not decode: {type(exc).__name__}: {exc}"[:300]) from None
    if _int(header["cells"]) != len(delta.keys):
        raise CorruptState(f"{what} holds {len(delta.keys)} cells, its header says "
                           f"{header['cells']}")
    actual = delta.compute_cells_setsum().hexdigest()
    if actual != delta.cells_setsum:
        raise CorruptState(f"{what}: its cells sum to {actual}, its header says "
                           f"{delta.cells_setsum} (a cell was altered, lost or foreign)")
    return delta


def _int(value: Any) -> int:
    if type(value) is not int or value < 0:
        raise ValueError(f"expected a non-negative integer, got {value!r:.40}")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {type(value).__name__}")
    return value


def _hexsum(value: Any) -> str:
    """A setsum's hexdigest, checked when read (not first when summed or written back)."""
    text = _text(value)
    Setsum.from_hexdigest(text)  # raises ValueError naming what is wrong
    return text


# -- the index --------------------------------------------------------------------------

@dataclass(frozen=True)
class StateEntry:
    """One checkpoint or stripe as the index lists it."""

    kind: str
    path: str
    sha256: str
    num_bytes: int
    lo: int
    hi: int
    cells: int
    state_setsum: str
    replaced_records: int
    replaced_events: int
    replaced_setsum: str

    def to_obj(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": self.path, "sha256": self.sha256,
                "num_bytes": self.num_bytes, "lo": self.lo, "hi": self.hi, "cells": self.cells,
                "state_setsum": self.state_setsum,
                "replaced": {"records": self.replaced_records, "events": self.replaced_events,
                             "setsum": self.replaced_setsum}}

    @classmethod
    def from_obj(cls, obj: Any) -> StateEntry:
        replaced = obj["replaced"]
        return cls(_text(obj["kind"]), _text(obj["path"]), _text(obj["sha256"]),
                   _int(obj["num_bytes"]), _int(obj["lo"]), _int(obj["hi"]), _int(obj["cells"]),
                   _hexsum(obj["state_setsum"]), _int(replaced["records"]),
                   _int(replaced["events"]), _hexsum(replaced["setsum"]))


@dataclass(frozen=True)
class StateIndex:
    """The published checkpoint and stripes: ``entries[0]`` is the checkpoint."""

    entries: tuple[StateEntry, ...]
    path: str = ""
    superseded: tuple[str, ...] = field(default=())

    @property
    def points(self) -> list[int]:
        """The retained points: where a reader may stand below ``limit``."""
        return [e.hi for e in self.entries]

    @property
    def limit(self) -> int:
        return self.entries[-1].hi

    @property
    def replaced_setsum(self) -> Setsum:
        total = Setsum()
        for entry in self.entries:
            total = total + Setsum.from_hexdigest(entry.replaced_setsum)
        return total

    def to_bytes(self) -> bytes:
        obj = {"version": INDEX_VERSION, "entries": [e.to_obj() for e in self.entries],
               "points": self.points, "limit": self.limit,
               "replaced_setsum": self.replaced_setsum.hexdigest(),
               "superseded": list(self.superseded)}
        return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes, path: str) -> StateIndex:
        try:
            obj: Any = json.loads(data)
            if obj["version"] != INDEX_VERSION:
                raise ValueError(f"index version {obj['version']!r}; this reader knows "
                                 f"{INDEX_VERSION}")
            index = cls(tuple(StateEntry.from_obj(e) for e in obj["entries"]), path,
                        tuple(_text(p) for p in obj["superseded"]))
            if not index.entries:
                raise ValueError("no checkpoint")
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise CorruptState(f"state index {path} does not decode: {exc!r:.200}") from None
        problems = index.problems()
        if problems:
            raise CorruptState(f"state index {path}: " + "; ".join(problems))
        return index

    def problems(self) -> list[str]:
        out = []
        if self.entries[0].kind != "checkpoint":
            out.append("the first entry is not a checkpoint")
        for prev, entry in zip(self.entries, self.entries[1:], strict=False):
            if entry.kind != "stripe" or entry.lo != prev.hi or not entry.lo < entry.hi:
                out.append(f"stripe [{entry.lo}, {entry.hi}) does not follow [{prev.lo}, "
                           f"{prev.hi})")
        return out

    def nearest(self, offset: int) -> str:
        """The retained points around ``offset``, for error messages."""
        below = [p for p in self.points if p < offset]
        above = [p for p in self.points if p > offset]
        parts = []
        if below:
            parts.append(f"the nearest retained point before it is offset {below[-1]}")
        if above:
            parts.append(f"the nearest after it is offset {above[0]}")
        return "; ".join(parts) + f" (retained points: {self.points})"


def state_object_path(kind: str, data: bytes) -> str:
    return f"{STATE_PREFIX}{kind.upper()}.{hashlib.sha256(data).hexdigest()}"


def manifest_index_path(manifest: Manifest) -> str | None:
    """The state index the manifest points at, or None."""
    for name, text in manifest.extra:
        if name == MANIFEST_FIELD:
            try:
                obj: Any = json.loads(text)
                return _text(obj["index"])
            except (ValueError, KeyError, TypeError) as exc:
                raise CorruptState(f"manifest field {MANIFEST_FIELD} is invalid: {exc!r:.100}"
                                   ) from None
    return None


def with_index(manifest: Manifest, path: str) -> Manifest:
    text = json.dumps({"index": path}, separators=(",", ":"))
    extra = tuple((n, t) for n, t in manifest.extra if n != MANIFEST_FIELD)
    return replace(manifest, extra=(*extra, (MANIFEST_FIELD, text)))


def _get_verified(log: LogStore, path: str, sha: str | None) -> bytes:
    try:
        data, _ = log.get(path)
    except NotFound:
        raise CorruptState(f"{log.key(path)} is referenced but missing") from None
    expected = sha if sha is not None else path.rsplit(".", 1)[-1]
    if hashlib.sha256(data).hexdigest() != expected:
        raise CorruptState(f"{log.key(path)} does not hash to its name (altered)")
    return data


def load_state_index(log: LogStore, manifest: Manifest) -> StateIndex | None:
    """The index the manifest points at (verified), or None."""
    path = manifest_index_path(manifest)
    if path is None:
        return None
    return StateIndex.from_bytes(_get_verified(log, path, None), path)


def load_state(log: LogStore, entry: StateEntry) -> StateDelta:
    """A checkpoint or stripe, checked against its index entry."""
    delta = decode_state(_get_verified(log, entry.path, entry.sha256), log.key(entry.path))
    if (delta.kind, delta.lo, delta.hi, delta.state_setsum, delta.replaced_setsum,
            delta.replaced_records, delta.replaced_events, len(delta.keys)) != (
            entry.kind, entry.lo, entry.hi, entry.state_setsum, entry.replaced_setsum,
            entry.replaced_records, entry.replaced_events, entry.cells):
        raise CorruptState(f"{log.key(entry.path)} does not match its index entry")
    return delta


def state_moves(delta: StateDelta, carry_before: dict[bytes, tuple[bytes, bytes]]
                ) -> tuple[list[bytes], list[bytes], list[bytes]]:
    """How ``delta`` moves the *state* (not the changeset view): the cells it changes,
    their values before and after, given the carry (cell -> (state value, before)) at
    its ``lo``. Raises ``ValueError`` if its rows do not start from that view."""
    if delta.kind == "checkpoint" or not (delta.carry or carry_before or delta.domains):
        return list(delta.keys), list(delta.befores), list(delta.values)
    first: dict[bytes, bytes] = {}
    last: dict[bytes, bytes] = {}
    for key, value, before in zip(delta.keys, delta.values, delta.befores, strict=True):
        first.setdefault(key, before)
        last[key] = value
    carry_after = {k: (v, b) for k, v, b in delta.carry}
    keys, befores, values = [], [], []
    for key in sorted(first.keys() | carry_before.keys() | carry_after.keys()):
        if key in carry_before:
            state, view = carry_before[key]
            if key in first and first[key] != view:
                raise ValueError("a row does not start from the value the changesets showed")
        elif key in first:
            state = view = first[key]
        else:
            state = view = carry_after[key][1]
        view = last.get(key, view)
        after = carry_after[key][0] if key in carry_after else view
        if after != state:
            keys.append(key)
            befores.append(state)
            values.append(after)
    return keys, befores, values


def iter_state_deltas(log: LogStore, index: StateIndex) -> Iterator[StateDelta]:
    """The index's checkpoint and stripes, each checked, with the state setsum carried
    along the chain (a stripe must move the previous state's setsum to its own)."""
    yield from check_chain((load_state(log, e) for e in index.entries),
                           [log.key(e.path) for e in index.entries])


def check_chain(deltas: Iterable[StateDelta], names: Sequence[str]) -> Iterator[StateDelta]:
    """Each delta once its state setsum follows from the previous one's (``CorruptState``
    naming it otherwise)."""
    current = Setsum()
    carry: dict[bytes, tuple[bytes, bytes]] = {}
    for delta, name in zip(deltas, names, strict=False):
        start = Setsum() if delta.kind == "checkpoint" else current
        try:
            keys, befores, values = state_moves(delta, carry)
        except ValueError as exc:
            raise CorruptState(f"{name}: {exc}") from None
        moved = moved_setsum(start, keys, befores, values)
        if moved.hexdigest() != delta.state_setsum:
            raise CorruptState(f"{name}: the state it leads to sums to "
                               f"{moved.hexdigest()}, it says {delta.state_setsum}")
        current = moved
        carry = {k: (v, b) for k, v, b in delta.carry}
        yield delta


# -- publishing ---------------------------------------------------------------------------

def write_state_objects(log: LogStore, deltas: Iterable[StateDelta]) -> StateIndex:
    """Write each checkpoint/stripe (If-None-Match; an equal object already there is
    success: the name is the content's hash) and the index; return the index."""
    entries = []
    for delta in deltas:
        data = encode_state(delta)
        path = state_object_path(delta.kind, data)
        _put_once(log, path, data)
        entries.append(StateEntry(delta.kind, path, hashlib.sha256(data).hexdigest(),
                                  len(data), delta.lo, delta.hi, len(delta.keys),
                                  delta.state_setsum, delta.replaced_records,
                                  delta.replaced_events, delta.replaced_setsum))
    index = StateIndex(tuple(entries))
    return index


def _put_once(log: LogStore, path: str, data: bytes) -> None:
    """Write a content-addressed object once. One already there holds the same bytes,
    unless it was damaged: then it is written again (the name says what it must hold)."""
    try:
        log.put_if_absent(path, data)
    except PreconditionFailed:
        found = log.get_or_none(path)
        if found is None or found[0] != data:
            log.put(path, data)


def publish_state_index(log: LogStore, index: StateIndex, based_on: str | None) -> StateIndex:
    """Install ``index`` by compare-and-swap of the manifest read with ``etag`` (whose
    state index was ``based_on``), then delete what it superseded.

    Durability order: the objects are already written; step 1 writes the index
    (If-None-Match, content-addressed); step 2 swaps the manifest. On a lost race the
    manifest is re-read: if its state index is still ``based_on`` (appends or a
    collection moved it, nobody published), the pointer is rebased on it and the swap
    retried; otherwise ``StateContention`` is raised and nothing was published. Step 3
    deletes the state objects no longer referenced (idempotent; the new index names
    them in ``superseded``, so a run that crashed before it is finished by the next).
    """
    old_paths = set(list_state_objects(log))
    referenced = {e.path for e in index.entries}
    superseded = tuple(sorted(old_paths - referenced - {_index_name(index)}))
    index = replace(index, superseded=superseded)
    data = index.to_bytes()
    path = state_object_path("index", data)
    index = replace(index, path=path)
    _put_once(log, path, data)  # Step 1.
    while True:  # Step 2.
        manifest, etag = require_manifest(log)
        if manifest_index_path(manifest) != based_on:
            raise StateContention(
                "another checkpoint or compaction published first; nothing was "
                "published: run it again")
        try:
            log.put_if_match(MANIFEST_PATH, with_index(manifest, path).to_bytes(), etag)
            break
        except PreconditionFailed:
            continue  # appends or a collection moved the manifest: rebase on it
    finish_superseded(log, index)  # Step 3.
    return index


def _index_name(index: StateIndex) -> str:
    return index.path


def finish_superseded(log: LogStore, index: StateIndex) -> int:
    """Delete the objects ``index`` superseded (never one it references)."""
    keep = {e.path for e in index.entries} | {index.path}
    deleted = 0
    for path in index.superseded:
        if path not in keep and path.startswith(STATE_PREFIX):
            log.delete(path)
            deleted += 1
    return deleted


def list_state_objects(log: LogStore) -> list[str]:
    return [p for p in log.list(STATE_PREFIX) if p.startswith(STATE_PREFIX)]


class StateContention(Wal3Error):
    """Another checkpoint or compaction published its state first; run again."""


# -- accounting -----------------------------------------------------------------------------

def retained_setsum_below(reader: Any, manifest: Manifest, limit: int) -> Setsum:
    """The setsum of the records still in the log at offsets below ``limit``: whole
    fragments by their pointers' setsums, the one ``limit`` falls in by reading it."""
    total = Setsum()
    if limit <= manifest.oldest_offset:
        return total
    for frag in reader.scan(manifest.oldest_offset, manifest=manifest):
        if frag.start >= limit:
            break
        if frag.limit <= limit:
            total = total + frag.setsum
            continue
        records = [r for r in reader.fetch(frag) if r.offset < limit]
        for record in records:
            total = total + record_setsum(record.offset, record.timestamp_us, [record.body])
    return total


def check_accounting(reader: Any, manifest: Manifest, index: StateIndex) -> None:
    """Raise ``CorruptState`` unless what the checkpoint and stripes replaced sums to
    what the log collected plus the retained records below the index's limit."""
    have = manifest.collected + retained_setsum_below(reader, manifest, index.limit)
    want = index.replaced_setsum
    if have != want:
        raise CorruptState(
            f"the checkpoint and stripes of {index.path} replaced records summing to "
            f"{want.hexdigest()}, but the log's collected setsum plus its records below "
            f"offset {index.limit} sum to {have.hexdigest()}: nothing may be collected")
