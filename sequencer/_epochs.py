"""The double-buffered epoch sequencer (seed 000), as a pure state machine.

Nothing here reads a clock, sleeps or locks: the caller feeds ``now_ns`` and events
and gets back the records to emit. The caller serialises calls (the agent holds one
lock around them).

The sequencer is QUIESCENT (no batch in flight) or holds TWO epochs: the older one
is closed to new batches and drains, the newer one accepts every new batch. Every
transition is a row of this table, and ``open_batch``/``close_batch`` below follow it
row by row:

====================  ============================  =======================================
state                 event                         action, next state
====================  ============================  =======================================
QUIESCENT             open                          new id; older := [last_end, id+1) with
                                                    this batch; newer := [id+1, ?); TWO
TWO                   open, interval not exceeded   new id, counted in newer; TWO
TWO                   open, interval exceeded       refused (``None``): the caller waits
                                                    for quiescence (forced quiescence)
TWO                   close, older still busy       uncount; TWO
TWO                   close, older drained,         emit older; newer.end := new id;
                      newer busy                    older := newer; newer := [end, ?); TWO
TWO                   close, older drained,         emit older; newer.end := new id;
                      newer drained                 emit newer as quiescent; QUIESCENT
====================  ============================  =======================================

Two batches overlap only if their epochs are the same or adjacent; epochs tile the id
space (each begins where the previous ended, the first at the sentinel 0); an epoch
with no batch at all is still published: it is the quiescence marker. Space is
constant: two epochs, each with its counters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from sequencer._records import EpochRecord

__all__ = ["BatchTicket", "EpochSequencer", "SequencerError"]

_UNSET: Final = -1


class SequencerError(RuntimeError):
    """The sequencer was driven in a way its protocol forbids (a bug in the caller)."""


@dataclass(frozen=True, slots=True)
class BatchTicket:
    """What ``open_batch`` hands out: the batch id and the epoch that counts it."""

    batch_id: int
    epoch_seq: int


@dataclass(slots=True)
class _Epoch:
    seq: int
    begin_id: int
    end_id: int = _UNSET
    open_batches: int = 0
    event_count: int = 0
    table_counts: dict[str, int] = field(default_factory=dict)

    def count(self, event_count: int, table_counts: Mapping[str, int]) -> None:
        self.event_count += event_count
        counts = self.table_counts
        for table, n in table_counts.items():
            counts[table] = counts.get(table, 0) + n

    def record(self, domain_id: int, *, quiescent: bool) -> EpochRecord:
        return EpochRecord(
            domain_id=domain_id,
            epoch_seq=self.seq,
            begin_id=self.begin_id,
            end_id=self.end_id,
            event_count=self.event_count,
            quiescent=quiescent,
            table_counts=tuple(sorted(self.table_counts.items())),
        )


class EpochSequencer:
    """Maps batch ids to epochs and emits an ``EpochRecord`` when an epoch closes.

    ``ids`` returns fresh monotonic ids (``MonotonicIds.next``). With
    ``max_quiescence_interval_ns`` set, ``open_batch`` refuses new batches once that
    long has passed since the last quiescence, until the sequencer quiesces again.
    """

    def __init__(
        self,
        domain_id: int,
        ids: Callable[[], int],
        *,
        now_ns: int,
        max_quiescence_interval_ns: int | None = None,
    ) -> None:
        self.domain_id = domain_id
        self._ids = ids
        self._max_interval = max_quiescence_interval_ns
        self._older: _Epoch | None = None  # None <=> QUIESCENT
        self._newer: _Epoch | None = None
        self._next_seq = 1
        self._last_end = 0  # the sentinel: the first epoch begins at 0
        self._last_quiescence_ns = now_ns

    # -- queries ---------------------------------------------------------------

    @property
    def quiescent(self) -> bool:
        """No batch in flight, no epoch open."""
        return self._older is None

    @property
    def last_quiescence_ns(self) -> int:
        return self._last_quiescence_ns

    def holding_back(self, now_ns: int) -> bool:
        """True if forced quiescence is in force: new batches must wait for quiescence."""
        return (
            self._older is not None
            and self._max_interval is not None
            and now_ns - self._last_quiescence_ns >= self._max_interval
        )

    def open_batches(self) -> int:
        """How many batches are in flight (for diagnostics and tests)."""
        if self._older is None or self._newer is None:
            return 0
        return self._older.open_batches + self._newer.open_batches

    # -- transitions -------------------------------------------------------------

    def open_batch(self, now_ns: int) -> BatchTicket | None:
        """Open a write batch, or return ``None`` while forced quiescence holds it back."""
        older, newer = self._older, self._newer
        if older is None:
            # QUIESCENT, open: the new epoch ends right after the new id.
            batch_id = self._ids()
            older = _Epoch(self._take_seq(), self._last_end, end_id=_after(batch_id))
            older.open_batches = 1
            self._older = older
            self._newer = _Epoch(self._take_seq(), older.end_id)
            return BatchTicket(batch_id, older.seq)
        assert newer is not None
        if self.holding_back(now_ns):
            # TWO, open, interval exceeded: refused until the sequencer drains.
            return None
        # TWO, open: counted in the newer epoch.
        batch_id = self._ids()
        newer.open_batches += 1
        return BatchTicket(batch_id, newer.seq)

    def close_batch(
        self,
        ticket: BatchTicket,
        now_ns: int,
        event_count: int = 0,
        table_counts: Mapping[str, int] | None = None,
    ) -> list[EpochRecord]:
        """Close a batch that produced ``event_count`` events; return the records to emit."""
        older, newer = self._older, self._newer
        if older is None or newer is None:
            raise SequencerError(f"batch {ticket.batch_id} closed while the sequencer is quiescent")
        if ticket.epoch_seq == older.seq:
            epoch = older
        elif ticket.epoch_seq == newer.seq:
            epoch = newer
        else:
            raise SequencerError(
                f"batch {ticket.batch_id} of epoch {ticket.epoch_seq} closed, but the open "
                f"epochs are {older.seq} and {newer.seq} (closed twice?)"
            )
        if epoch.open_batches <= 0:
            raise SequencerError(f"epoch {epoch.seq} has no open batch to close")
        epoch.open_batches -= 1
        epoch.count(event_count, table_counts or {})
        if older.open_batches:
            # TWO, close, older still busy.
            return []
        # TWO, close, older drained: emit it and close the newer at a fresh id.
        emitted = [older.record(self.domain_id, quiescent=False)]
        newer.end_id = self._ids()
        if newer.open_batches:
            # ... newer busy: it becomes the draining epoch, a fresh one accepts.
            self._older = newer
            self._newer = _Epoch(self._take_seq(), newer.end_id)
            return emitted
        # ... newer drained too: it closes at once, as the quiescence marker.
        emitted.append(newer.record(self.domain_id, quiescent=True))
        self._older = self._newer = None
        self._last_end = newer.end_id
        self._last_quiescence_ns = now_ns
        return emitted

    def _take_seq(self) -> int:
        seq = self._next_seq
        self._next_seq += 1
        return seq


def _after(batch_id: int) -> int:
    """The id right after ``batch_id`` on the ring, skipping the sentinel 0."""
    nxt = (batch_id + 1) & ((1 << 64) - 1)
    return nxt or 1

