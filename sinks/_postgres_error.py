"""``PostgresError``: the base of every PostgreSQL error the project raises.

It lives in ``sinks``, the package both ``agent`` (the PostgreSQL store) and ``replay``
(the PostgreSQL replica) may import, so that one ``except PostgresError`` catches the
errors of either; ``agent.PostgresError`` and ``sinks.PostgresError`` are this class.
"""

from __future__ import annotations

__all__ = ["PostgresError"]


class PostgresError(Exception):
    """Base of the errors the PostgreSQL store and replica raise; the message says what was kept."""
