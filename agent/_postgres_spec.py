"""What a PostgreSQL table looks like to cdc-agent, and the errors the PostgreSQL adapters raise.

Pure: no driver import, so ``agent`` can re-export these without psycopg installed.
See ``docs/postgres.md`` for the mapping of cells to rows and of values to types.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sequencer import check_name
from sinks import PostgresError

__all__ = [
    "PostgresError",
    "SchemaMismatch",
    "TableSpec",
    "WriteFailed",
    "WriteOutcomeUnknown",
]


@dataclass(frozen=True, slots=True)
class TableSpec:
    """One existing table: its key column, the value columns cdc-agent manages, and presence.

    A cell ``(table, row, column)`` is the value of ``column`` in the row whose
    ``key_column`` equals ``row``. ``key_column`` must carry a primary key or a unique
    index of its own. ``columns`` must be nullable.

    Presence (``ABSENT`` versus ``None``):

    - ``presence_column=None``: a NULL cell (or a missing row) is ``ABSENT``, so a cell
      cannot hold ``None``; writing ``None`` is refused. Suits existing tables as they are.
    - ``presence_column="name"``: a ``text[]`` column listing the columns of the row
      that exist; a NULL value of a listed column is ``None``. Every value round-trips.
    """

    key_column: str
    columns: Sequence[str]
    presence_column: str | None = None

    def __post_init__(self) -> None:
        check_name("key column", self.key_column)
        columns = tuple(self.columns)
        if not columns:
            raise SchemaMismatch("a TableSpec needs at least one value column")
        for column in columns:
            check_name("column", column)
        if len(set(columns)) != len(columns):
            raise SchemaMismatch(f"TableSpec columns repeat a name: {list(columns)}")
        reserved = {self.key_column} | ({self.presence_column} if self.presence_column else set())
        if reserved & set(columns):
            raise SchemaMismatch(
                f"value columns {sorted(reserved & set(columns))} are also the key or "
                "presence column; list only the columns that hold cell values"
            )
        if self.presence_column is not None:
            check_name("presence column", self.presence_column)
            if self.presence_column == self.key_column:
                raise SchemaMismatch("the presence column cannot be the key column")
        object.__setattr__(self, "columns", columns)


class SchemaMismatch(PostgresError):
    """The tables in the database do not match the ``TableSpec``s (raised at construction)."""


class WriteFailed(PostgresError):
    """The server refused or aborted the write: it did not take effect, nothing was recorded."""


class WriteOutcomeUnknown(PostgresError):
    """The connection was lost before the server answered: the write may or may not have
    taken effect. The agent recorded no event for it; see ``docs/postgres.md``."""
