"""Key rules shared by every backend, so a key valid on one store is valid on all."""

from __future__ import annotations

__all__ = ["check_key", "check_prefix"]


def check_key(key: str) -> str:
    """Return ``key`` if it is a valid object key, else raise ``ValueError``.

    A key is one or more ``/``-separated segments. No segment is empty (so no leading,
    trailing or doubled ``/``), ``.`` or ``..``, or starts with ``.`` (the local
    backend keeps its temporary and lock files under such names). No control
    characters, no backslash.
    """
    if not isinstance(key, str):
        raise TypeError(f"object key must be str, not {type(key).__name__}")
    if not key:
        raise ValueError("object key must not be empty")
    _check_chars(key, "object key")
    for segment in key.split("/"):
        if not segment:
            raise ValueError(f"object key {key!r} has an empty segment (leading, trailing "
                             "or doubled '/')")
        if segment.startswith("."):
            raise ValueError(f"object key {key!r} has a segment starting with '.'; such "
                             "names are reserved for the local store's temporary files")
    return key


def check_prefix(prefix: str) -> str:
    """Return ``prefix`` if it can start a valid key (``""`` lists everything)."""
    if not isinstance(prefix, str):
        raise TypeError(f"list prefix must be str, not {type(prefix).__name__}")
    _check_chars(prefix, "list prefix")
    if prefix.startswith("/"):
        raise ValueError(f"list prefix {prefix!r} must not start with '/'")
    return prefix


def _check_chars(text: str, what: str) -> None:
    for char in text:
        if char == "\\" or ord(char) < 0x20 or ord(char) == 0x7F:
            raise ValueError(f"{what} {text!r} contains {char!r}; control characters and "
                             "backslashes are not allowed")
