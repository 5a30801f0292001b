"""Cursors: named positions that readers keep and that pin the log against collection.

``cursor/<name>.json`` holds ``{"position": {"offset"}, "epoch_us", "writer"}`` (Chroma's
fields). Updates are compare-and-swap: ``save`` takes the ``Witness`` (the etag and
cursor that were read) and fails with ``CursorContention`` if the cursor moved since.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sinks.objstore import ObjectStore
from sinks.wal3._errors import CorruptCursor, CursorContention, NoSuchCursor
from sinks.wal3._paths import CURSOR_PREFIX, cursor_path, valid_cursor_name
from sinks.wal3._store import LogStore, PreconditionFailed, as_store

__all__ = ["CorruptCursor", "Cursor", "CursorStore", "Witness"]

_MAX_U64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class Cursor:
    """A position (the next offset the reader wants), when it was saved and by whom."""

    position: int
    epoch_us: int
    writer: str

    def to_json(self) -> str:
        return json.dumps({"position": {"offset": self.position}, "epoch_us": self.epoch_us,
                           "writer": self.writer}, separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_json(cls, data: bytes | str, name: str = "cursor") -> Cursor:
        try:
            obj: Any = json.loads(data)
            position = obj["position"]["offset"]
            epoch_us, writer = obj["epoch_us"], obj["writer"]
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            reason = ("nested too deeply" if isinstance(exc, RecursionError)
                      else f"no field {exc}" if isinstance(exc, KeyError) else repr(exc))
            raise CorruptCursor(
                f"cursor {name} is not valid cursor JSON: {reason:.200}") from None
        if type(position) is not int or type(epoch_us) is not int or not isinstance(writer, str):
            raise CorruptCursor(f"cursor {name} has fields of the wrong type")
        if not 0 <= position <= _MAX_U64:  # an offset is a u64 (Chroma's LogPosition)
            raise CorruptCursor(
                f"cursor {name} holds offset {str(position)[:40]}, not an unsigned 64-bit integer")
        return cls(position, epoch_us, writer)


@dataclass(frozen=True, slots=True)
class Witness:
    """A cursor as read, with the etag a compare-and-swap must match."""

    etag: str
    cursor: Cursor


class CursorStore:
    """Load, create, move and list a log's cursors."""

    def __init__(self, store: ObjectStore | str, prefix: str = "", *,
                 writer: str = "cdc-agent", clock: Callable[[], float] = time.time) -> None:
        self._log = store if isinstance(store, LogStore) else LogStore(as_store(store), prefix)
        self._writer = writer
        self._clock = clock

    def load(self, name: str) -> Witness | None:
        found = self._log.get_or_none(cursor_path(name))
        if found is None:
            return None
        data, etag = found
        return Witness(etag, Cursor.from_json(data, name))

    def require(self, name: str) -> Witness:
        witness = self.load(name)
        if witness is None:
            raise NoSuchCursor(f"no cursor named {name!r} in {self._log.describe()}")
        return witness

    def _cursor(self, position: int) -> Cursor:
        return Cursor(position, int(self._clock() * 1_000_000), self._writer)

    def init(self, name: str, position: int) -> Witness:
        """Create a cursor (If-None-Match); ``CursorContention`` if it exists."""
        cursor = self._cursor(position)
        try:
            etag = self._log.put_if_absent(cursor_path(name), cursor.to_json().encode())
        except PreconditionFailed:
            raise CursorContention(f"cursor {name!r} already exists; load it instead") from None
        return Witness(etag, cursor)

    def save(self, name: str, position: int, witness: Witness) -> Witness:
        """Move a cursor (If-Match on the witness's etag)."""
        cursor = self._cursor(position)
        try:
            etag = self._log.put_if_match(cursor_path(name), cursor.to_json().encode(),
                                          witness.etag)
        except PreconditionFailed:
            raise CursorContention(
                f"cursor {name!r} changed since it was read (or was deleted); reload it"
            ) from None
        return Witness(etag, cursor)

    def upsert(self, name: str, position: int) -> Witness:
        """Create or move a cursor, whatever it held (last writer wins, still by CAS)."""
        while True:
            witness = self.load(name)
            try:
                if witness is None:
                    return self.init(name, position)
                return self.save(name, position, witness)
            except CursorContention:
                continue

    def delete(self, name: str) -> None:
        self._log.delete(cursor_path(name))

    def list(self) -> list[str]:
        names = []
        for path in self._log.list(CURSOR_PREFIX):
            name = path[len(CURSOR_PREFIX):].removesuffix(".json")
            if path.endswith(".json") and valid_cursor_name(name):
                names.append(name)
        return names
