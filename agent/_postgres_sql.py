"""The PostgreSQL side of a relaxed store: schema checks, value checks, SQL, and steps.

Every store operation is written once, as a generator of steps (a statement and its
parameters) that receives each statement's rows and returns the operation's result,
in the manner of psycopg's own ``generators.py``. The sync and asyncio stores only
run the steps; neither knows any SQL. Every step is ONE autocommit statement, and at
most one step of an operation changes anything.

Atomic exchange of one cell (the heart of it)::

    UPDATE t AS t SET c = $new
      FROM (SELECT k, c AS v, <c present> AS present FROM t AS s
             WHERE k = $key FOR NO KEY UPDATE) AS old
     WHERE t.k = old.k
    RETURNING old.v, old.present

The subquery locks the row and reads the newest committed version; the outer UPDATE
of the same row then cannot interleave with another writer, so concurrent writers of
a cell each get back exactly the value they replaced. A missing row is created with
``INSERT ... ON CONFLICT (k) DO NOTHING`` (old value: ABSENT); if another writer
created it first, the exchange goes round again.

Values travel in binary (``%b`` parameters, binary cursors): that is what keeps NaN
payloads and -0.0 bit for bit (the text format does not).
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

from psycopg import sql

from agent._postgres_spec import SchemaMismatch, TableSpec, WriteFailed
from sequencer import ABSENT, Absent, InvalidWrite, RowKey, Value

__all__ = [
    "INTROSPECT_SQL",
    "ColumnInfo",
    "Step",
    "Steps",
    "TableInfo",
    "build_table_info",
    "compare_exchange_steps",
    "exchange_steps",
    "get_steps",
    "read_row_steps",
    "scan_steps",
    "table_infos_steps",
]

Step: TypeAlias = tuple[bytes, Mapping[str, Any]]
Rows: TypeAlias = list[tuple[Any, ...]]
Steps: TypeAlias = Generator[Step, Rows, Any]

# How many times an exchange on a missing row may lose the race to create it.
_MAX_ROUNDS: Final = 64

# One row per column of the table: name, declared type, NOT NULL, base type name,
# typmod, and whether the column alone carries a unique index (usable by ON CONFLICT).
INTROSPECT_SQL: Final = b"""
SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, t.typname,
       a.atttypmod,
       EXISTS (SELECT 1 FROM pg_index i
                WHERE i.indrelid = a.attrelid AND i.indisunique AND i.indnkeyatts = 1
                  AND i.indkey[0] = a.attnum AND i.indpred IS NULL AND i.indexprs IS NULL)
  FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
 WHERE a.attrelid = to_regclass(quote_ident(%(table)s)) AND a.attnum > 0
   AND NOT a.attisdropped
 ORDER BY a.attnum
"""

_INT_RANGES: Final = {
    "int2": (-(1 << 15), (1 << 15) - 1),
    "int4": (-(1 << 31), (1 << 31) - 1),
    "int8": (-(1 << 63), (1 << 63) - 1),
}
_KINDS: Final[dict[str, type]] = {
    "int2": int, "int4": int, "int8": int,
    "float8": float,
    "text": str, "varchar": str,
    "bytea": bytes,
    "bool": bool,
}
_SUPPORTED: Final = (
    "bigint, integer, smallint, double precision, text, character varying, bytea, boolean"
)


@dataclass(frozen=True, slots=True)
class ColumnInfo:
    """One column: its declared type and what Python values it holds bit for bit."""

    name: str
    pg_type: str
    kind: type
    int_range: tuple[int, int] | None = None
    max_chars: int | None = None

    @property
    def cast(self) -> sql.Composable:
        # From the catalog's format_type(), so safe to splice in.
        return sql.SQL(self.pg_type)


@dataclass(slots=True)
class TableInfo:
    """A checked table: the spec, its columns' types, and the statements for it (cached)."""

    name: str
    spec: TableSpec
    key: ColumnInfo
    columns: dict[str, ColumnInfo]
    # With verified commits, every write statement also returns its transaction id, so a
    # commit whose answer is lost can be looked up (see PostgresStore).
    with_xid: bool = False
    # Statements rendered once to bytes: composing them on every call would cost more
    # than the rest of the client-side work of a write.
    _cache: dict[tuple[object, ...], bytes] = field(default_factory=dict)

    # -- checks, before anything is sent ------------------------------------------------

    def column(self, column: str) -> ColumnInfo:
        info = self.columns.get(column)
        if info is None:
            raise InvalidWrite(
                f"column {column!r} is not one of table {self.name!r}'s managed columns "
                f"{sorted(self.columns)}; nothing was written"
            )
        return info

    def check_row(self, row: RowKey) -> None:
        _check_typed(self.name, self.key, row, what="row key")

    def check_value(self, column: ColumnInfo, value: Value) -> None:
        if value is None:
            if self.spec.presence_column is None:
                raise InvalidWrite(
                    f"{self.name}.{column.name} cannot hold None: this table has no presence "
                    "column, so NULL means ABSENT; give TableSpec a presence_column (a text[] "
                    "column) to store None, or delete the cell instead; nothing was written"
                )
            return
        _check_typed(self.name, column, value, what="value")

    # -- SQL ------------------------------------------------------------------------------

    def _present(self, column: str, alias: str) -> sql.Composable:
        """SQL true when ``column`` of the row under ``alias`` exists (is not ABSENT)."""
        if self.spec.presence_column is None:
            return sql.SQL("({} IS NOT NULL)").format(sql.Identifier(alias, column))
        return sql.SQL("({} = ANY(coalesce({}, '{{}}'::text[])))").format(
            sql.Literal(column), sql.Identifier(alias, self.spec.presence_column)
        )

    def _presence_after(self, column: str, present: bool) -> sql.Composable:
        """SQL for the presence list of the target row ``t`` once ``column`` is (not) present."""
        assert self.spec.presence_column is not None
        removed = sql.SQL("array_remove(coalesce({}, '{{}}'::text[]), {})").format(
            sql.Identifier("t", self.spec.presence_column), sql.Literal(column)
        )
        if not present:
            return removed
        return sql.SQL("array_append({}, {})").format(removed, sql.Literal(column))

    def _xid(self) -> sql.Composable:
        return sql.SQL(", pg_current_xact_id()::text" if self.with_xid else "")

    def _locked_old(self, column: str) -> sql.Composable:
        """The FROM item that locks the row and reads the cell's old value and presence."""
        return sql.SQL(
            "(SELECT {k} AS k, {c} AS v, {present} AS present FROM {t} AS s "
            "WHERE {k} = %(key)b::{kt} FOR NO KEY UPDATE) AS old"
        ).format(
            k=sql.Identifier(self.spec.key_column), c=sql.Identifier(column),
            present=self._present(column, "s"), t=sql.Identifier(self.name), kt=self.key.cast,
        )

    def _new_value(self, column: str, deleting: bool) -> sql.Composable:
        if deleting:
            return sql.SQL("NULL")
        return sql.SQL("%(new)b::{}").format(self.columns[column].cast)

    def exchange_sql(self, column: str, deleting: bool) -> bytes:
        key = ("exchange", column, deleting)
        if key not in self._cache:
            sets = [sql.SQL("{} = {}").format(
                sql.Identifier(column), self._new_value(column, deleting))]
            if self.spec.presence_column is not None:
                sets.append(sql.SQL("{} = {}").format(
                    sql.Identifier(self.spec.presence_column),
                    self._presence_after(column, not deleting)))
            self._cache[key] = sql.SQL(
                "UPDATE {t} AS t SET {sets} FROM {old} WHERE {tk} = old.k "
                "RETURNING old.v, old.present{xid}"
            ).format(xid=self._xid(),t=sql.Identifier(self.name), sets=sql.SQL(", ").join(sets),
                     old=self._locked_old(column),
                     tk=sql.Identifier("t", self.spec.key_column)).as_bytes(None)
        return self._cache[key]

    def compare_exchange_sql(self, column: str, expected: str, deleting: bool) -> bytes:
        """``expected`` is "absent", "null" or "value"; the statement always returns the row."""
        key = ("cas", column, expected, deleting)
        if key not in self._cache:
            info = self.columns[column]
            if expected == "absent":
                match: sql.Composable = sql.SQL("(NOT old.present)")
            elif expected == "null":
                match = sql.SQL("(old.present AND old.v IS NULL)")
            else:
                match = sql.SQL("(old.present AND old.v IS NOT NULL AND {})").format(
                    _bitwise_equal(info))
            sets = [sql.SQL("{c} = CASE WHEN {m} THEN {new} ELSE {tc} END").format(
                c=sql.Identifier(column), m=match, new=self._new_value(column, deleting),
                tc=sql.Identifier("t", column))]
            if self.spec.presence_column is not None:
                sets.append(sql.SQL("{p} = CASE WHEN {m} THEN {new} ELSE {tp} END").format(
                    p=sql.Identifier(self.spec.presence_column), m=match,
                    new=self._presence_after(column, not deleting),
                    tp=sql.Identifier("t", self.spec.presence_column)))
            self._cache[key] = sql.SQL(
                "UPDATE {t} AS t SET {sets} FROM {old} WHERE {tk} = old.k "
                "RETURNING old.v, old.present, {m}{xid}"
            ).format(xid=self._xid(),t=sql.Identifier(self.name), sets=sql.SQL(", ").join(sets),
                     old=self._locked_old(column), m=match,
                     tk=sql.Identifier("t", self.spec.key_column)).as_bytes(None)
        return self._cache[key]

    def insert_sql(self, column: str) -> bytes:
        """Create the row with only ``column`` present; does nothing if the row exists."""
        key = ("insert", column)
        if key not in self._cache:
            names = [self.spec.key_column, *self.columns]
            values = [sql.SQL("%(key)b::{}").format(self.key.cast)]
            for name, info in self.columns.items():
                values.append(sql.SQL("%(new)b::{}").format(info.cast) if name == column
                              else sql.SQL("NULL::{}").format(info.cast))
            if self.spec.presence_column is not None:
                names.append(self.spec.presence_column)
                values.append(sql.SQL("ARRAY[{}]::text[]").format(sql.Literal(column)))
            self._cache[key] = sql.SQL(
                "INSERT INTO {t} ({names}) VALUES ({values}) "
                "ON CONFLICT ({k}) DO NOTHING RETURNING 1{xid}"
            ).format(xid=self._xid(),t=sql.Identifier(self.name),
                     names=sql.SQL(", ").join(map(sql.Identifier, names)),
                     values=sql.SQL(", ").join(values),
                     k=sql.Identifier(self.spec.key_column)).as_bytes(None)
        return self._cache[key]

    def select_sql(self, columns: Sequence[str] | None, by_key: bool) -> bytes:
        """SELECT [key,] values..., presences... for one row (by_key) or the whole table."""
        names = tuple(self.columns) if columns is None else tuple(columns)
        key = ("select", names, by_key)
        if key not in self._cache:
            fields: list[sql.Composable] = []
            if not by_key:
                fields.append(sql.Identifier("s", self.spec.key_column))
            fields += [sql.Identifier("s", name) for name in names]
            fields += [self._present(name, "s") for name in names]
            where = (sql.SQL(" WHERE {} = %(key)b::{}").format(
                sql.Identifier("s", self.spec.key_column), self.key.cast)
                if by_key else sql.SQL(""))
            self._cache[key] = sql.SQL("SELECT {} FROM {} AS s{}").format(
                sql.SQL(", ").join(fields), sql.Identifier(self.name), where).as_bytes(None)
        return self._cache[key]


def _bitwise_equal(info: ColumnInfo) -> sql.Composable:
    """SQL true when ``old.v`` equals the ``exp`` parameter bit for bit."""
    if info.kind is float:
        # float8 '=' says NaN = NaN whatever the payload, and -0.0 = 0.0: compare the bits.
        return sql.SQL("float8send(old.v) = float8send(%(exp)b::float8)")
    if info.kind is str:
        # A nondeterministic collation could call different strings equal; "C" compares bytes.
        return sql.SQL('(old.v COLLATE "C") = (%(exp)b::{} COLLATE "C")').format(info.cast)
    return sql.SQL("old.v = %(exp)b::{}").format(info.cast)


def _check_typed(table: str, column: ColumnInfo, value: object, *, what: str) -> None:
    """Refuse, before writing, any value ``column`` cannot give back bit for bit."""
    where = f"{table}.{column.name} ({column.pg_type})"
    if type(value) is not column.kind:
        raise InvalidWrite(
            f"{what} {value!r:.60} ({type(value).__name__}) cannot be stored in {where}, "
            f"which holds {column.kind.__name__} values only; nothing was written"
        )
    if column.int_range is not None:
        low, high = column.int_range
        if not low <= value <= high:  # type: ignore[operator]
            raise InvalidWrite(
                f"{what} {value} does not fit in {where} (range {low}..{high}); "
                "nothing was written"
            )
    elif column.kind is str:
        text: str = value  # type: ignore[assignment]
        if "\x00" in text:
            raise InvalidWrite(
                f"{what} {text!r:.60} contains a NUL character, which PostgreSQL text cannot "
                f"hold ({where}); nothing was written"
            )
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidWrite(
                f"{what} {text!r:.60} is not valid Unicode for {where} ({exc.reason}, e.g. a "
                "lone surrogate); nothing was written"
            ) from exc
        if column.max_chars is not None and len(text) > column.max_chars:
            raise InvalidWrite(
                f"{what} of {len(text)} characters is longer than {where} allows; "
                "nothing was written"
            )


def _column_info(table: str, row: tuple[Any, ...], *, key: bool) -> ColumnInfo:
    name, pg_type, _not_null, typname, typmod, _unique = row
    kinds = ("int2", "int4", "int8", "text", "varchar") if key else tuple(_KINDS)
    if typname not in kinds:
        allowed = "bigint, integer, smallint, text, character varying" if key else _SUPPORTED
        raise SchemaMismatch(
            f"column {table}.{name} has type {pg_type}, which cdc-agent cannot map bit for bit; "
            f"{'key' if key else 'value'} columns may be {allowed}"
        )
    max_chars = typmod - 4 if typname == "varchar" and typmod >= 4 else None
    return ColumnInfo(name=name, pg_type=pg_type, kind=_KINDS[typname],
                      int_range=_INT_RANGES.get(typname), max_chars=max_chars)


def table_infos_steps(specs: Mapping[str, TableSpec], *, with_xid: bool) -> Steps:
    """Each table's ``TableInfo``, its spec checked against the catalog (one read each)."""
    infos: dict[str, TableInfo] = {}
    for name, spec in specs.items():
        rows = yield INTROSPECT_SQL, {"table": name}
        infos[name] = build_table_info(name, spec, rows, with_xid=with_xid)
    return infos


def build_table_info(table: str, spec: TableSpec, rows: Rows, *,
                     with_xid: bool = False) -> TableInfo:
    """Check ``spec`` against the catalog rows of INTROSPECT_SQL; raise SchemaMismatch."""
    if not rows:
        raise SchemaMismatch(
            f"table {table!r} does not exist in the database (or has no columns); "
            "cdc-agent works over existing tables: create it first"
        )
    by_name = {row[0]: row for row in rows}
    wanted = [spec.key_column, *spec.columns]
    if spec.presence_column is not None:
        wanted.append(spec.presence_column)
    missing = [name for name in wanted if name not in by_name]
    if missing:
        raise SchemaMismatch(
            f"table {table!r} has no column(s) {missing}; its columns are {list(by_name)}"
        )
    key_row = by_name[spec.key_column]
    if not key_row[5]:
        raise SchemaMismatch(
            f"key column {table}.{spec.key_column} has no primary key or unique index of its "
            "own; add one (cells are addressed by it and rows are created with ON CONFLICT)"
        )
    key = _column_info(table, key_row, key=True)
    columns: dict[str, ColumnInfo] = {}
    for name in spec.columns:
        row = by_name[name]
        if row[2]:
            raise SchemaMismatch(
                f"column {table}.{name} is NOT NULL, but an ABSENT cell is stored as NULL; "
                "drop the constraint or leave the column out of the TableSpec"
            )
        columns[name] = _column_info(table, row, key=False)
    if spec.presence_column is not None:
        presence = by_name[spec.presence_column]
        if presence[1] != "text[]":
            raise SchemaMismatch(
                f"presence column {table}.{spec.presence_column} has type {presence[1]}; "
                "it must be text[]"
            )
    return TableInfo(name=table, spec=spec, key=key, columns=columns, with_xid=with_xid)


# -- operations as steps -------------------------------------------------------------------


def _cell(rows: Rows) -> Value | Absent:
    value, present = rows[0][0], rows[0][1]
    return value if present else ABSENT


def exchange_steps(info: TableInfo, row: RowKey, column: str, value: Value | Absent) -> Steps:
    """Set (or, with ABSENT, delete) one cell; return the value it replaced."""
    params = {"key": row, "new": None if value is ABSENT else value}
    deleting = value is ABSENT
    for _ in range(_MAX_ROUNDS):
        rows = yield info.exchange_sql(column, deleting), params
        if rows:
            return _cell(rows)
        if deleting:
            return ABSENT  # No row: the cell was already ABSENT, and nothing changes.
        rows = yield info.insert_sql(column), params
        if rows:
            return ABSENT
    raise WriteFailed(
        f"gave up writing {info.name}[{row!r}].{column} after {_MAX_ROUNDS} rounds: the row "
        "kept vanishing and reappearing under concurrent writers; nothing was written"
    )


def compare_exchange_steps(info: TableInfo, row: RowKey, column: str,
                           expected: Value | Absent, value: Value | Absent) -> Steps:
    """Set the cell to ``value`` if it holds ``expected`` (bit for bit); return (swapped, old)."""
    kind = "absent" if expected is ABSENT else "null" if expected is None else "value"
    params = {"key": row, "new": None if value is ABSENT else value,
              "exp": None if expected is ABSENT else expected}
    deleting = value is ABSENT
    for _ in range(_MAX_ROUNDS):
        rows = yield info.compare_exchange_sql(column, kind, deleting), params
        if rows:
            return bool(rows[0][2]), _cell(rows)
        if kind != "absent" or deleting:
            return kind == "absent", ABSENT  # No row: only ABSENT matches, and no write needed.
        rows = yield info.insert_sql(column), params
        if rows:
            return True, ABSENT
    raise WriteFailed(
        f"gave up on a conditional write of {info.name}[{row!r}].{column} after {_MAX_ROUNDS} "
        "rounds: the row kept vanishing and reappearing; nothing was written"
    )


def get_steps(info: TableInfo, row: RowKey, column: str) -> Steps:
    rows = yield info.select_sql((column,), by_key=True), {"key": row}
    return _cell(rows) if rows else ABSENT


def read_row_steps(info: TableInfo, row: RowKey) -> Steps:
    rows = yield info.select_sql(None, by_key=True), {"key": row}
    if not rows:
        return {}
    names = tuple(info.columns)
    values, presences = rows[0][: len(names)], rows[0][len(names):]
    return {name: value for name, value, present in zip(names, values, presences, strict=True)
            if present}


def scan_steps(info: TableInfo) -> Steps:
    """Every present cell of the table: {(table, row, column): value}."""
    rows = yield info.select_sql(None, by_key=False), {}
    names = tuple(info.columns)
    width = len(names)
    cells: dict[tuple[str, RowKey, str], Value] = {}
    for record in rows:
        row, values, presences = record[0], record[1:1 + width], record[1 + width:]
        for name, value, present in zip(names, values, presences, strict=True):
            if present:
                cells[(info.name, row, name)] = value
    return cells
