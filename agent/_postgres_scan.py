"""Chunked listing of PostgreSQL tables for baseline snapshots (``list_cells``).

Rows are read table by table (tables in code-point order of their names) with keyset
pagination on the key column, in the snapshot row order of ``sinks.codec``: integer
keys numerically, text keys by code point (``COLLATE "C"`` on UTF-8 is byte order,
which is code-point order). A chunk never spans two tables: its ``next`` is the next
key of the same table, or the start of the next table.
"""

from __future__ import annotations

from itertools import compress
from typing import TYPE_CHECKING, Any

from sequencer import RowKey, Value
from sinks.codec import RowCells

if TYPE_CHECKING:
    from agent._postgres_sql import Steps, TableInfo
    from sinks.codec import Bound

__all__ = ["chunk_steps", "first_table"]


def first_table(infos: dict[str, Any], start: Bound | None) -> tuple[str, RowKey | None] | None:
    """The table and lower key a walk from ``start`` reads first (None: nothing left)."""
    names = sorted(infos)
    if start is None:
        return (names[0], None) if names else None
    table, row = start
    if table in infos:
        return table, row
    later = [n for n in names if n > table]
    return (later[0], None) if later else None


def chunk_steps(info: TableInfo, lower: RowKey | None, limit: int, next_table: str | None
                ) -> Steps:
    """Up to ``limit`` rows of ``info``'s table from key ``lower`` on: returns
    ``(cells, next bound)``."""
    from psycopg import sql

    key = sql.Identifier("s", info.spec.key_column)
    order = sql.SQL("{} COLLATE \"C\"").format(key) if info.key.kind is str else key
    names = tuple(info.columns)
    fields = [key, *(sql.Identifier("s", n) for n in names),
              *(info._present(n, "s") for n in names)]
    where = (sql.SQL(" WHERE {} >= %(lo)b::{}").format(order, info.key.cast)
             if lower is not None else sql.SQL(""))
    query = sql.SQL("SELECT {} FROM {} AS s{} ORDER BY {} LIMIT %(n)s").format(
        sql.SQL(", ").join(fields), sql.Identifier(info.name), where, order).as_bytes(None)
    params: dict[str, Any] = {"n": limit + 1}
    if lower is not None:
        params["lo"] = lower
    rows = yield query, params
    width = len(names)
    # Columns straight into RowCells (no tuple per cell): the row's values and their
    # presence flags, compressed together.
    keys: list[RowKey] = []
    widths: list[int] = []
    columns: list[str] = []
    values: list[Value] = []
    for record in rows[:limit]:
        presences = record[1 + width:]
        present = presences.count(True)  # (NULL from a presence array: absent)
        if not present:
            continue
        keys.append(record[0])
        widths.append(present)
        if present == width:
            columns += names
            values += record[1:1 + width]
        else:
            columns += compress(names, presences)
            values += compress(record[1:1 + width], presences)
    cells = RowCells([info.name] * len(keys), keys, widths, columns, values)
    if len(rows) > limit:
        return cells, (info.name, rows[limit][0])
    return cells, (None if next_table is None else (next_table, None))
