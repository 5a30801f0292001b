"""Record types: what the sequencer and the agent emit, and what readers consume.

A log is a sequence of two kinds of record:

- ``ChangeEvent``: one atomic cell write that took effect, with the value it replaced.
  Its identity is ``(domain_id, batch_id, seq)``: readers drop duplicates by it.
- ``EpochRecord``: closes an epoch, i.e. every batch whose id lies in
  ``[begin_id, end_id)``; ``event_count`` and ``table_counts`` are exact, ``setsum``
  covers the identity and content of every event of the epoch (see ``sinks.codec``).
  ``quiescent`` says that no batch was in flight once this epoch closed: applying
  every epoch up to this one gives a state the store really had.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sequencer._ids import id_lt
from sequencer._values import Absent, RowKey, Value

__all__ = ["ChangeEvent", "EpochRecord", "Record", "covers"]


def covers(begin_id: int, end_id: int, batch_id: int) -> bool:
    """True if ``batch_id`` lies in the epoch ``[begin_id, end_id)`` (modular, like every
    id comparison; ``begin_id`` 0 is the sentinel "since the start of the domain")."""
    after_begin = begin_id == 0 or not id_lt(batch_id, begin_id)
    return after_begin and id_lt(batch_id, end_id)


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    """One atomic cell write: ``old`` was replaced by ``new`` (either may be ABSENT)."""

    domain_id: int
    batch_id: int
    seq: int
    table: str
    row: RowKey
    column: str
    old: Value | Absent
    new: Value | Absent

    @property
    def identity(self) -> tuple[int, int, int]:
        """``(domain_id, batch_id, seq)``: equal for a duplicated delivery, unique otherwise."""
        return (self.domain_id, self.batch_id, self.seq)

    @property
    def cell(self) -> tuple[str, RowKey, str]:
        return (self.table, self.row, self.column)


@dataclass(frozen=True, slots=True)
class EpochRecord:
    """Metadata closing one epoch of a domain; with ``quiescent`` it is a quiescence marker.

    ``setsum`` is the lowercase hex digest (64 characters) of the epoch's events, or
    ``""`` while the sequencer has produced the record and the shipping pipeline has
    not yet filled it in. A sink that splits a domain's events over several streams
    (Kafka partitions) writes one copy per stream, with that stream's counts and setsum
    and ``stream`` set to the stream's number; ``stream`` is ``None`` for a whole log.
    """

    domain_id: int
    epoch_seq: int
    begin_id: int
    end_id: int
    event_count: int
    quiescent: bool
    table_counts: tuple[tuple[str, int], ...] = ()
    setsum: str = ""
    stream: int | None = field(default=None)

    def covers(self, batch_id: int) -> bool:
        """True if ``batch_id`` belongs to this epoch (modular, like every id comparison)."""
        return covers(self.begin_id, self.end_id, batch_id)


Record = ChangeEvent | EpochRecord
