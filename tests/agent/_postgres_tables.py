"""The tables the PostgreSQL tests write: one of each presence mode, every supported type."""

from __future__ import annotations

import psycopg

from agent._postgres_spec import TableSpec

# "cells": a presence column, so None and ABSENT differ; one column per value type.
# "plain": no presence column (NULL means ABSENT), a text key, narrower types.
DDL = """
CREATE TABLE cells (k bigint PRIMARY KEY, i bigint, f double precision, s text, b bytea,
                    z boolean, p text[] NOT NULL DEFAULT '{}');
CREATE TABLE plain (k text PRIMARY KEY, n integer, s varchar(8), extra text DEFAULT 'x');
"""

TABLES = {
    "cells": TableSpec("k", ["i", "f", "s", "b", "z"], presence_column="p"),
    "plain": TableSpec("k", ["n", "s"]),
}

# The Python type each column holds.
KINDS = {
    ("cells", "i"): int, ("cells", "f"): float, ("cells", "s"): str, ("cells", "b"): bytes,
    ("cells", "z"): bool, ("plain", "n"): int, ("plain", "s"): str,
}


def create_tables(dsn: str) -> None:
    """Create the test tables in the (empty) database at ``dsn``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(DDL)
