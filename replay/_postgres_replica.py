"""A PostgreSQL replica: consistent changesets applied exactly once, with the position.

``PostgresReplica(dsn, tables)`` writes each ``Changeset`` into tables of a target
database in ONE transaction together with the consumer's position token (table
``cdc_agent_position(consumer, token)``). So the replica only ever holds a state the
source really had, and after a crash it knows exactly where it stands: read
``replica.position``, resume the consumer (``Assembler(position=...)``) from it, and
feed the changesets again; any at or before the stored position is a no-op.

The tables are laid out as on the source (see ``docs/postgres.md``): each table has a
key column with a unique index, nullable value columns, and optionally a ``text[]``
presence column; ``tables`` maps names to anything with ``key_column``, ``columns``
and ``presence_column`` attributes (``agent.TableSpec`` fits). The changed rows travel
as binary array parameters of one statement per target table, which checks what they
replace, UPDATEs the rows that exist and INSERTs the others: one statement per table
and apply, whatever its size.

psycopg 3 is imported lazily (extra ``cdc-agent[postgres]``); its errors become
``ReplicaError`` here.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

import structlog

from replay._assembler import Changeset
from replay._position import Frontier, InvalidPosition
from sequencer import ABSENT, Absent, RowKey, Value
from sinks import PostgresError

if TYPE_CHECKING:
    import psycopg

__all__ = ["PostgresReplica", "ReplicaError", "TableLayout"]

log = structlog.get_logger()

Cell = tuple[str, RowKey, str]
_Record = tuple[bytearray, list[Any]]

POSITION_TABLE: Final = "cdc_agent_position"
_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_TYPES: Final[dict[str, type]] = {
    "int2": int, "int4": int, "int8": int, "float8": float, "text": str, "varchar": str,
    "bytea": bytes, "bool": bool,
}
_CATALOG_SQL: Final = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod), t.typname,
       EXISTS (SELECT 1 FROM pg_index i
                WHERE i.indrelid = a.attrelid AND i.indisunique AND i.indnkeyatts = 1
                  AND i.indkey[0] = a.attnum AND i.indpred IS NULL AND i.indexprs IS NULL),
       a.atttypid::int8
  FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
 WHERE a.attrelid = to_regclass(quote_ident(%s)) AND a.attnum > 0 AND NOT a.attisdropped
"""

# Array parameters go in PostgreSQL's binary array format, packed here (psycopg's list
# dumping cost about three times as much): ndim 1, has-nulls flag, element type oid,
# length, lower bound 1; then per element its length (-1: NULL) and its binary value.
_ARRAY_HEADER: Final = struct.Struct(">iiIii")
_LENGTH: Final = struct.Struct(">i").pack
_NULL: Final = _LENGTH(-1)
_FIXED_WIDTH: Final = {"int2": "h", "int4": "i", "int8": "q", "float8": "d", "bool": "?"}
_BYTEA_OID: Final = 17


class _Packed:
    """An array parameter already in binary format. It is sent with type oid 0 (unknown):
    the server takes the type from the statement's cast (``$1::bigint[]``)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


def _packed_dumper() -> type:
    from psycopg.adapt import Dumper
    from psycopg.pq import Format

    class PackedDumper(Dumper):
        format = Format.BINARY

        def dump(self, obj: _Packed) -> bytes:
            return obj.data

    return PackedDumper


Packer = Callable[[list[Any]], Any]


def _packer(typname: str, oid: int, encoding: str) -> Packer:
    """How to pass a list of values (each of the Python type ``_TYPES[typname]``, or
    None) as an array of ``typname``: packed here (strings in the connection's encoding,
    as psycopg does); or, for an integer out of the type's range, the list itself, which
    psycopg dumps and the server refuses, as it always did."""
    code = _FIXED_WIDTH.get(typname)
    if code is not None:
        size, pack_item = struct.calcsize(code), struct.Struct(">i" + code).pack

        def pack_fixed(values: list[Any]) -> Any:
            try:
                data = b"".join([_NULL if v is None else pack_item(size, v) for v in values])
            except struct.error:
                return values
            return _Packed(_ARRAY_HEADER.pack(1, None in values, oid, len(values), 1) + data)

        return pack_fixed
    assert typname in ("text", "varchar", "bytea"), typname

    def pack_varying(values: list[Any]) -> Any:
        parts = [b""]
        nulls = 0
        for value in values:
            if value is None:
                parts.append(_NULL)
                nulls = 1
            else:
                data = value.encode(encoding) if type(value) is str else value
                parts += (_LENGTH(len(data)), data)
        parts[0] = _ARRAY_HEADER.pack(1, nulls, oid, len(values), 1)
        return _Packed(b"".join(parts))

    return pack_varying


_pack_flags: Final = _packer("bytea", _BYTEA_OID, "ascii")


class TableLayout(Protocol):
    """How a table holds cells (``agent.TableSpec`` is one)."""

    @property
    def key_column(self) -> str: ...

    @property
    def columns(self) -> Sequence[str]: ...

    @property
    def presence_column(self) -> str | None: ...


class ReplicaError(PostgresError):
    """The replica could not apply a changeset; the message says what the replica holds."""


@dataclass(frozen=True, slots=True)
class _Plan:
    """What one apply writes: how many changesets are new, the cells they change, the
    token before and after, and the array parameters per table."""

    fresh: int
    cells: int
    stored: str
    token: str
    arrays: list[tuple[_Table, list[Any]]]


class _TokenMoved(Exception):
    """Another applier moved the stored token since this replica last knew it."""


@contextmanager
def replica_errors(operation: str, advice: str | Callable[[Exception], str] = ""
                   ) -> Iterator[None]:
    """The replica's one error boundary: a psycopg error raised inside becomes
    ``ReplicaError("PostgreSQL replica: <operation> failed (<error>); <advice>")``,
    chained (``raise ... from``). ``advice`` says what the replica holds and what to do;
    a callable gets the psycopg error (whether a commit was lost depends on it)."""
    psycopg = _require_psycopg()
    try:
        yield
    except psycopg.Error as exc:
        tail = advice(exc) if callable(advice) else advice
        raise ReplicaError(f"PostgreSQL replica: {operation} failed ({exc})"
                           + (f"; {tail}" if tail else "")) from exc


def _apply_outcome(exc: Exception) -> str:
    """What a failed apply left: known only if the server answered."""
    if getattr(exc, "sqlstate", None) is None:
        return "the commit may or may not have happened: read .position to know"
    return "the transaction was rolled back: the replica holds its previous state"


def _require_psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the PostgreSQL replica needs psycopg 3; install the extra: "
            "pip install 'cdc-agent[postgres]'"
        ) from exc
    return psycopg


@dataclass(frozen=True, slots=True)
class _Table:
    """One target table, checked, with its merge statement and how to pack its arrays
    (keys go to psycopg as a list unless they all are ``key_kind``; ``pack_key`` is None
    for key column types the replica does not pack)."""

    name: str
    key_column: str
    key_type: str
    columns: tuple[str, ...]
    types: tuple[str, ...]
    kinds: tuple[type, ...]
    presence_column: str | None
    merge: bytes
    scan: bytes
    index: dict[str, int]
    key_kind: type | None
    pack_key: Packer | None
    pack_values: tuple[Packer, ...]


def _build_table(name: str, layout: TableLayout, rows: list[tuple[Any, ...]], *,
                 verify_before: bool, encoding: str) -> _Table:
    from psycopg import sql

    if not rows:
        raise ReplicaError(f"replica table {name!r} does not exist in the target database; "
                           "create it (same layout as the source) first")
    by_name = {r[0]: r for r in rows}
    columns = tuple(layout.columns)
    presence = layout.presence_column
    wanted = [layout.key_column, *columns, *([presence] if presence else [])]
    odd = [c for c in wanted if not _IDENTIFIER.fullmatch(c)]
    if odd:
        raise ReplicaError(f"replica table {name!r}: column name(s) {odd} are not plain "
                           "identifiers (letters, digits and '_')")
    missing = [c for c in wanted if c not in by_name]
    if missing:
        raise ReplicaError(f"replica table {name!r} has no column(s) {missing}")
    if not by_name[layout.key_column][3]:
        raise ReplicaError(f"replica key column {name}.{layout.key_column} needs a primary "
                           "key or unique index of its own")
    for column in columns:
        if by_name[column][2] not in _TYPES:
            raise ReplicaError(f"replica column {name}.{column} has type "
                               f"{by_name[column][1]}, which cannot hold cell values bit for bit")
    if presence is not None and by_name[presence][1] != "text[]":
        raise ReplicaError(f"replica presence column {name}.{presence} must be text[]")
    types = tuple(by_name[c][1] for c in columns)
    kinds = tuple(_TYPES[by_name[c][2]] for c in columns)
    key_type = by_name[layout.key_column][1]

    ident = sql.Identifier
    table, tk = ident(name), ident("t", layout.key_column)
    # The changed rows, one per key: the key; a flags byte per column (bit 1: changed,
    # 2: present after, 4: present before); the new values (v0..); the values the
    # changesets expect to replace (b0..). One binary array parameter per field.
    value_names = [ident(f"v{i}") for i in range(len(columns))]
    before_names = [ident(f"b{i}") for i in range(len(columns))]
    names = [ident("k"), ident("f"), *value_names, *before_names]
    arrays = sql.SQL(", ").join(sql.SQL("%b::{}[]").format(sql.SQL(t))
                                for t in (key_type, "bytea", *types, *types))

    def flag(i: int, bit: int) -> sql.Composable:
        return sql.SQL("(get_byte(s.f, {}) & {}) <> 0").format(
            sql.Literal(i), sql.Literal(bit))

    sets = [
        sql.SQL("{c} = CASE WHEN {changed} THEN s.{v} ELSE {tc} END").format(
            c=ident(c), changed=flag(i, 1), v=v, tc=ident("t", c))
        for i, (c, v) in enumerate(zip(columns, value_names, strict=True))
    ]
    insert_names = [ident(layout.key_column), *map(ident, columns)]
    insert_values = [sql.SQL("s.k"), *(sql.SQL("s.{}").format(v) for v in value_names)]
    if presence is not None:
        # Present after: the changed columns present, and the others the row had (for
        # an update: any other name its presence array holds is kept too).
        names_array = sql.SQL("{}::text[]").format(sql.Literal(list(columns)))
        present_after = sql.SQL(
            "ARRAY(SELECT c FROM unnest({cols}) WITH ORDINALITY AS o(c, i) "
            "WHERE (get_byte(s.f, i::int - 1) & 2) <> 0)").format(cols=names_array)
        sets.append(sql.SQL(
            "{p} = ARRAY(SELECT x FROM unnest(coalesce({tp}, '{{}}'::text[])) AS x "
            "WHERE coalesce(get_byte(s.f, array_position({cols}, x) - 1) & 1, 0) = 0) "
            "|| {after}").format(p=ident(presence), tp=ident("t", presence), cols=names_array,
                                 after=present_after))
        insert_names.append(ident(presence))
        insert_values.append(present_after)
    if presence is None:
        present_exprs = [sql.SQL("({} IS NOT NULL)").format(ident("t", c)) for c in columns]
    else:
        present_exprs = [sql.SQL("({} = ANY(coalesce({}, '{{}}'::text[])))").format(
            sql.Literal(c), ident("t", presence)) for c in columns]
    mismatches = []
    for i, (c, b, kind, present) in enumerate(
            zip(columns, before_names, kinds, present_exprs, strict=True)):
        if kind is float:  # bit for bit: float8 '=' says NaN = NaN and -0.0 = 0.0
            equal = sql.SQL("float8send({}) IS NOT DISTINCT FROM float8send(s.{})").format(
                ident("t", c), b)
        elif kind is str:
            equal = sql.SQL('({} COLLATE "C") IS NOT DISTINCT FROM (s.{} COLLATE "C")').format(
                ident("t", c), b)
        else:
            equal = sql.SQL("{} IS NOT DISTINCT FROM s.{}").format(ident("t", c), b)
        mismatches.append(sql.SQL(
            "({changed} AND ({present} IS DISTINCT FROM ({was}) OR (({was}) AND NOT ({equal}))))"
        ).format(changed=flag(i, 1), present=present, was=flag(i, 4), equal=equal))
    # One statement per table and apply. The rows are joined to the table once (j: is
    # the row there, and does it hold what the changesets replace); every sub-statement
    # sees the table as it was before the statement, which is right here: the UPDATE
    # touches only keys that exist and the INSERT only keys that do not. The statement
    # returns the key of a row that does not hold what the changesets replace, if any:
    # the caller then rolls the transaction back (so the writes need no guard).
    bad = sql.SQL(" OR ").join(mismatches) if verify_before else sql.SQL("false")
    merge = sql.SQL(
        "WITH j AS (SELECT s.*, {tk} IS NOT NULL AS found, {bad} AS bad "
        "FROM unnest({arrays}) AS s({names}) LEFT JOIN {t} AS t ON {tk} = s.k), "
        "updated AS (UPDATE {t} AS t SET {sets} FROM j AS s WHERE {tk} = s.k), "
        "inserted AS (INSERT INTO {t} ({insert_names}) SELECT {values} FROM j AS s "
        "WHERE NOT s.found) "
        "SELECT k FROM j WHERE bad LIMIT 1"
    ).format(tk=tk, bad=bad, arrays=arrays, names=sql.SQL(", ").join(names), t=table,
             sets=sql.SQL(", ").join(sets), insert_names=sql.SQL(", ").join(insert_names),
             values=sql.SQL(", ").join(insert_values))
    scan = sql.SQL("SELECT {k}, {values}, {present} FROM {t} AS t").format(
        k=tk, values=sql.SQL(", ").join(ident("t", c) for c in columns),
        present=sql.SQL(", ").join(present_exprs), t=table)
    key = by_name[layout.key_column]
    return _Table(name, layout.key_column, key_type, columns, types, kinds, presence,
                  merge.as_bytes(None), scan.as_bytes(None),
                  {c: i for i, c in enumerate(columns)},
                  _TYPES.get(key[2]),
                  _packer(key[2], key[4], encoding) if key[2] in _TYPES else None,
                  tuple(_packer(by_name[c][2], by_name[c][4], encoding) for c in columns) * 2)


class PostgresReplica:
    """Applies consistent changesets to a PostgreSQL database, exactly once.

    ``consumer`` names this replica's row in ``cdc_agent_position`` (several replicas
    may share a database). With ``verify_before`` (the default) every apply first checks
    that the rows hold the values the changesets replace, so a replica fed from the
    wrong position, or written by someone else, refuses instead of diverging. ``fault``
    is for tests: it is called with the name of each step of ``apply`` and may raise to
    simulate a crash there.
    """

    def __init__(self, dsn: str, tables: Mapping[str, TableLayout], *,
                 consumer: str = "default", connect_timeout: float = 10.0,
                 verify_before: bool = True,
                 fault: Callable[[str], None] | None = None) -> None:
        self._psycopg = _require_psycopg()
        if not tables:
            raise ReplicaError("a replica needs at least one table")
        self.consumer = consumer
        self._verify_before = verify_before
        self._fault = fault
        with replica_errors("connecting to the replica database",
                            "check the DSN and that the server runs"):
            self._conn: psycopg.Connection[Any] = self._psycopg.connect(
                dsn, autocommit=True, connect_timeout=max(1, int(connect_timeout)))
        try:
            # psycopg's own choice for str (SQL_ASCII databases take UTF-8)
            encoding = self._conn.info.encoding
            encoding = "utf-8" if encoding == "ascii" else encoding
            self._conn.adapters.register_dumper(_Packed, _packed_dumper())
            with replica_errors("preparing the replica database (reading the tables' "
                                "layout, creating the position table)",
                                "nothing was applied"):
                self._tables = {
                    name: _build_table(name, layout,
                                       self._conn.execute(_CATALOG_SQL, (name,)).fetchall(),
                                       verify_before=verify_before, encoding=encoding)
                    for name, layout in tables.items()
                }
                self._setup()
        except Exception:
            self._conn.close()
            raise

    def _setup(self) -> None:
        from psycopg import sql

        positions = sql.Identifier(POSITION_TABLE)
        self._lock_position = sql.SQL(
            "SELECT token FROM {} WHERE consumer = %s FOR UPDATE").format(positions).as_bytes(None)
        self._set_position = sql.SQL(
            "UPDATE {} SET token = %s WHERE consumer = %s").format(positions).as_bytes(None)
        # The fast path's lock and check in one: moves the token only from the one the
        # changesets were sorted against (another applier moved it: nothing matches).
        self._move_position = sql.SQL(
            "UPDATE {} SET token = %s WHERE consumer = %s AND token = %s RETURNING 1"
        ).format(positions).as_bytes(None)
        conn = self._conn
        conn.execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (consumer text PRIMARY KEY, token text NOT NULL)"
        ).format(sql.Identifier(POSITION_TABLE)))
        conn.execute(sql.SQL(
            "INSERT INTO {} (consumer, token) VALUES (%s, '') ON CONFLICT DO NOTHING"
        ).format(sql.Identifier(POSITION_TABLE)), (self.consumer,))
        row = conn.execute(sql.SQL("SELECT token FROM {} WHERE consumer = %s").format(
            positions), (self.consumer,)).fetchone()
        self._token = row[0] if row is not None else None

    # -- reading -------------------------------------------------------------------------

    @property
    def position(self) -> Frontier | None:
        """The stored position (None: nothing applied yet). Resume the consumer from it."""
        from psycopg import sql

        with replica_errors("reading the replica's position"):
            row = self._conn.execute(sql.SQL(
                "SELECT token FROM {} WHERE consumer = %s").format(
                    sql.Identifier(POSITION_TABLE)), (self.consumer,)).fetchone()
        return self._parse(row[0] if row else "")

    def _parse(self, token: str) -> Frontier | None:
        if not token:
            return None
        try:
            return Frontier.parse(token)
        except InvalidPosition as exc:
            raise ReplicaError(
                f"the position stored for consumer {self.consumer!r} in {POSITION_TABLE} "
                f"does not parse ({exc}); the replica's tables are untouched") from exc

    def snapshot(self) -> dict[Cell, Value]:
        """Every present cell of the replica's tables, read in one transaction."""
        cells: dict[Cell, Value] = {}
        conn = self._conn
        with replica_errors("reading the replica's tables"), conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            for table in self._tables.values():
                width = len(table.columns)
                for record in conn.cursor(binary=True).execute(table.scan):
                    row = record[0]
                    for i, column in enumerate(table.columns):
                        if record[1 + width + i]:
                            cells[(table.name, row, column)] = record[1 + i]
        return cells

    # -- applying ------------------------------------------------------------------------

    def apply(self, changeset: Changeset) -> bool:
        """Apply one changeset; False if the stored position already covers it."""
        return self.apply_many([changeset]) > 0

    def apply_many(self, changesets: Iterable[Changeset]) -> int:
        """Apply consecutive changesets in ONE transaction; return how many were new.

        The tables move from one quiescent state straight to the last one (cells changed
        by several changesets are written once, with their final value).

        Step 1. Know the stored token: the one this replica last read or wrote (fast
                path), else begin, lock this consumer's position row and read it.
        Step 2. Drop the changesets the position already covers (each a no-op); merge
                the rest into one set of cell changes and the position after the last.
        Step 3. Per table, one statement, the changed rows its binary array parameters:
                check that the rows hold what the changesets replace (their ``before``
                values; unless ``verify_before=False``); only if they all do, UPDATE the
                rows that exist and INSERT the ones that do not.
        Step 4. Write the new position token. On the fast path this comes first, as
                ``UPDATE ... WHERE token = <the token of step 1>``: it locks the row, and
                if another applier moved the token meanwhile nothing matches, the
                transaction rolls back and the changesets go the locked way.
        Step 5. If a check of step 3 found a row not holding what it should: roll back
                and raise ``ReplicaError`` (nothing applied, the position unchanged).
        Step 6. Commit: the changes and the position become visible together, or not at
                all (a crash before this step leaves the previous state and position).

        The fast path sends BEGIN and steps 3 to 5 in one round trip (pipeline mode),
        then COMMIT.
        """
        changesets = list(changesets)
        try:
            with replica_errors(f"applying {len(changesets)} changeset(s)", _apply_outcome):
                if self._token is not None:
                    fresh = self._apply(changesets, self._token)
                    if fresh is not None:
                        return fresh
                fresh = self._apply(changesets, None)
                assert fresh is not None
                return fresh
        except BaseException:
            self._token = None  # not known any more: the next apply reads it under lock
            raise

    def _apply(self, changesets: list[Changeset], token: str | None) -> int | None:
        """Apply with the stored ``token`` known (None: read it under lock). None: the
        token was not ``token`` any more (nothing applied)."""
        conn = self._conn
        if token is not None:
            # Step 1: known. Step 2 before anything is sent (nothing new: no round trip).
            plan = self._plan(changesets, token)
            if plan is None:
                return 0
            try:
                with conn.pipeline(), conn.transaction():
                    self._write(plan, token)
            except _TokenMoved:
                return None
        else:
            with conn.pipeline(), conn.transaction():
                # Step 1.
                row = conn.execute(self._lock_position, (self.consumer,)).fetchone()
                if row is None:
                    raise ReplicaError(
                        f"the position row of consumer {self.consumer!r} vanished from "
                        f"{POSITION_TABLE}; nothing was applied")
                plan = self._plan(changesets, row[0])
                if plan is None:
                    self._token = row[0]
                    return 0
                self._write(plan, None)
        # Step 6 happened when the transaction block closed.
        self._token = plan.token
        self._step("committed")
        log.debug("cdc.replica_applied", consumer=self.consumer, changesets=plan.fresh,
                  cells=plan.cells, position=plan.token)
        return plan.fresh

    def _plan(self, changesets: list[Changeset], stored: str) -> _Plan | None:
        """Step 2 (and the checks of step 3's values): None if nothing is new."""
        frontier = self._parse(stored) or Frontier({})
        fresh = []
        for changeset in changesets:
            held = frontier.get(changeset.domain_id)
            if held is not None and held.epoch_seq >= changeset.epoch_seq:
                continue
            fresh.append(changeset)
            frontier = frontier.advanced(changeset.position)
        if not fresh:
            return None
        if len(fresh) == 1:
            merged = fresh[0].changes
            before = fresh[0].before if self._verify_before else {}
        else:
            merged, before = {}, {}
            for changeset in fresh:
                merged.update(changeset.changes)
            if self._verify_before:
                for changeset in reversed(fresh):
                    before.update(changeset.before)  # the earliest one counts
        return _Plan(len(fresh), len(merged), stored, str(frontier),
                     self._arrays(merged, before))

    def _write(self, plan: _Plan, token: str | None) -> None:
        """Steps 3 to 5 inside the open transaction (pipeline mode: one round trip)."""
        conn = self._conn
        self._step("read")
        moved = None
        if token is not None:  # Step 4 first: lock the row, check the token
            moved = conn.execute(self._move_position, (plan.token, self.consumer, token))
        # Step 3.
        checks = [(table, conn.execute(table.merge, arrays)) for table, arrays in plan.arrays]
        self._step("merged")
        if moved is None:  # Step 4 (the locked way).
            conn.execute(self._set_position, (plan.token, self.consumer))
        elif moved.fetchone() is None:
            raise _TokenMoved
        self._step("position")
        # Step 5.
        for table, check in checks:
            found = check.fetchone()
            if found is not None:
                raise ReplicaError(
                    f"row {found[0]!r} of replica table {table.name!r} does not hold "
                    "what the changesets replace: the replica is not at the state "
                    "they start from (the consumer resumed from another position, or "
                    "something else wrote to the replica); nothing was applied, the "
                    f"replica stays at {self._parse(plan.stored)}")

    def _step(self, name: str) -> None:
        if self._fault is not None:
            self._fault(name)

    def _arrays(self, merged: Mapping[Cell, Value | Absent],
                before: Mapping[Cell, Value | Absent]
                ) -> list[tuple[_Table, list[Any]]]:
        """Per table written, the array parameters (key, flags, new values, before
        values), every value checked against its column first."""
        # Per table, per row: a flags byte per column (1: changed, 2: present after,
        # 4: present before); the new values then the before values, by column index.
        by_table: dict[str, tuple[_Table, dict[RowKey, _Record]]] = {}
        name: str | None = None
        table: _Table | None = None
        rows: dict[RowKey, _Record] = {}
        index: Mapping[str, int] = {}
        kinds: tuple[type, ...] = ()
        width = 0
        for cell, value in merged.items():
            if cell[0] != name:
                name = cell[0]
                if name not in by_table:
                    table = self._tables.get(name)
                    if table is None:
                        raise ReplicaError(
                            f"a changeset writes table {name!r}, which this replica does "
                            f"not hold ({sorted(self._tables)}); nothing applied")
                    by_table[name] = (table, {})
                table, rows = by_table[name]
                index, kinds, width = table.index, table.kinds, len(table.columns)
            _, row, column = cell
            i = index.get(column)
            if i is None:
                raise ReplicaError(f"a changeset writes column {name}.{column}, which this "
                                   "replica does not hold; nothing applied")
            record = rows.get(row)
            if record is None:
                record = rows[row] = (bytearray(width), [None] * (2 * width))
            flags = 1
            if value is not ABSENT:
                if type(value) is not kinds[i]:
                    assert table is not None
                    _check(table, i, value)  # type: ignore[arg-type]
                record[1][i] = value
                flags |= 2
            old = before.get(cell, ABSENT)
            if old is not ABSENT:
                if type(old) is not kinds[i]:
                    assert table is not None
                    _check(table, i, old)  # type: ignore[arg-type]
                record[1][width + i] = old
                flags |= 4
            record[0][i] = flags
        per_table = []
        for table, rows in by_table.values():
            keys = list(rows)
            records = rows.values()
            kind, pack_key = table.key_kind, table.pack_key
            arrays = [
                keys if pack_key is None or any(type(k) is not kind for k in keys)
                else pack_key(keys),
                _pack_flags([bytes(r[0]) for r in records]),
                *(pack(list(values)) for pack, values in zip(
                    table.pack_values, zip(*(r[1] for r in records), strict=True), strict=True)),
            ]
            per_table.append((table, arrays))
        return per_table

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> PostgresReplica:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check(table: _Table, i: int, value: Value) -> None:
    """Refuse a value the replica column cannot hold as the source had it."""
    column = table.columns[i]
    if value is None:
        if table.presence_column is None:
            raise ReplicaError(
                f"a changeset stores None in {table.name}.{column}, which has no presence "
                "column (NULL means ABSENT there); nothing applied")
        return
    if type(value) is not table.kinds[i]:
        raise ReplicaError(
            f"a changeset stores {value!r:.60} ({type(value).__name__}) in "
            f"{table.name}.{column} ({table.types[i]}); nothing applied")
