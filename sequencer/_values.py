"""The value model: what a cell may hold, and the checks that refuse anything else.

A cell holds ``None``, a ``bool``, a 64-bit signed ``int``, a ``float`` (every bit
kept), a ``str`` or ``bytes``; ``ABSENT`` means the cell does not exist and is distinct
from ``None``. Names are identifiers; a row key is a ``str`` or a 64-bit ``int``.
Every check runs before the store is touched, so a refused write changes nothing.
"""

from __future__ import annotations

import re
from typing import Final, TypeAlias

__all__ = [
    "ABSENT",
    "Absent",
    "InvalidWrite",
    "RowKey",
    "Value",
    "check_name",
    "check_row",
    "check_value",
    "check_write",
]

INT64_MIN: Final = -(1 << 63)
INT64_MAX: Final = (1 << 63) - 1


class Absent:
    """The type of ``ABSENT``: the cell does not exist (unlike ``None``, a stored null)."""

    # No instance dict: ABSENT refers to nothing, so a container holding it cannot be
    # part of a cycle through it (the C writer untracks an insert's event on that).
    __slots__ = ()

    _instance: Absent | None = None

    def __new__(cls) -> Absent:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> bool:
        return False

    def __reduce__(self) -> str:
        return "ABSENT"


ABSENT: Final = Absent()

Value: TypeAlias = bool | int | float | str | bytes | None
RowKey: TypeAlias = str | int


class InvalidWrite(ValueError):
    """A write was refused before it reached the store: a bad name, row key or value."""


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}\Z")
_SCALAR_TYPES: Final = frozenset({type(None), bool, int, float, str, bytes})
# Names already checked: the check is on the write path, and programs reuse few names.
_known_names: set[str] = set()


def _check_text(what: str, text: str) -> None:
    """Raise ``InvalidWrite`` unless ``text`` encodes as UTF-8 (what the codec writes)."""
    if text.isascii():  # O(1) in CPython: most strings never reach the encoder
        return
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        raise InvalidWrite(
            f"{what} {text!r:.80} cannot be encoded as UTF-8 ({exc.reason} at index "
            f"{exc.start}: {text[exc.start:exc.end]!r}); decode such text with "
            "errors='replace' or store it as bytes"
        ) from None


def check_name(kind: str, name: object) -> str:
    """Return ``name`` if it is an identifier, else raise ``InvalidWrite`` naming ``kind``."""
    if type(name) is str and name in _known_names:  # type first: a list is unhashable
        return name
    if type(name) is not str or not _IDENTIFIER.match(name):
        raise InvalidWrite(
            f"{kind} name {name!r} is not an identifier "
            "(letters, digits and '_', not starting with a digit, at most 63 characters)"
        )
    if len(_known_names) < 100_000:
        _known_names.add(name)
    return name


def check_row(row: object) -> RowKey:
    """Return ``row`` if it is a valid row key (``str`` or 64-bit ``int``)."""
    kind = type(row)
    if kind is str:
        _check_text("row key", row)  # type: ignore[arg-type]
        return row  # type: ignore[return-value]
    if kind is int and INT64_MIN <= row <= INT64_MAX:  # type: ignore[operator]
        return row  # type: ignore[return-value]
    if kind is int:
        raise InvalidWrite(f"row key {row!r} does not fit in a signed 64-bit integer")
    raise InvalidWrite(
        f"row key {row!r} has type {kind.__name__}; row keys are str or 64-bit int"
    )


def check_value(value: object) -> Value:
    """Return ``value`` if a cell can hold it bit for bit, else raise ``InvalidWrite``."""
    kind = type(value)
    if kind not in _SCALAR_TYPES:
        if value is ABSENT:
            raise InvalidWrite("ABSENT cannot be written; use delete() to remove a cell")
        raise InvalidWrite(
            f"value {value!r:.80} has type {kind.__name__}; a cell holds None, bool, "
            "64-bit int, float, str or bytes"
        )
    if kind is int and not INT64_MIN <= value <= INT64_MAX:  # type: ignore[operator]
        raise InvalidWrite(f"int value {value} does not fit in a signed 64-bit integer")
    if kind is str:
        _check_text("str value", value)  # type: ignore[arg-type]
    return value  # type: ignore[return-value]


_UNBOUNDED_TYPES: Final = frozenset({type(None), bool, float, bytes})


def check_write(table: object, row: object, column: object, value: object) -> None:
    """All the checks of one cell write in one call (the Agent's hot path).

    Names already seen, an ASCII ``str`` or in-range ``int`` row and a value of a type
    with no range to check (or an ASCII ``str``) cost a few set and type tests; anything
    else takes the full checks, which raise ``InvalidWrite``.
    """
    known = _known_names
    try:
        if (table in known and column in known
                and ((type(row) is str and row.isascii())
                     or (type(row) is int and INT64_MIN <= row <= INT64_MAX))
                and (type(value) in _UNBOUNDED_TYPES
                     or (type(value) is str and value.isascii())
                     or (type(value) is int and INT64_MIN <= value <= INT64_MAX))):
            return
    except TypeError:  # an unhashable table or column: the full checks name it
        pass
    check_name("table", table)
    check_row(row)
    check_name("column", column)
    check_value(value)
