"""The double-buffered epoch sequencer (seed 000), as a pure state machine.

Nothing here reads a clock, takes an id, sleeps or locks: the caller feeds ``now_ns``,
fresh ids and events and gets back the epochs to publish. The caller serialises calls
(the agent holds one lock around them, and takes the ids it feeds in under that lock,
so they increase in call order).

The sequencer is QUIESCENT (no batch in flight) or holds TWO epochs: the older one
is closed to new batches and drains, the newer one accepts every new batch. Every
transition is a row of ``TRANSITIONS`` (below, as data), and ``open_batch`` /
``close_batch`` look the row up and run its action:

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
constant: two epochs, each with two counters (open batches, events). Per-table counts
are not kept here: the shipping pipeline counts them once, from the events themselves.
"""

from __future__ import annotations

from typing import Final, NamedTuple

from sequencer._records import EpochRecord, covers

__all__ = ["TRANSITIONS", "BatchTicket", "EpochClosed", "EpochSequencer", "SequencerError"]

_UNSET: Final = -1

# States, events and the conditions that pick a row.
QUIESCENT: Final = "QUIESCENT"
TWO: Final = "TWO"
OPEN: Final = "open"
CLOSE: Final = "close"
ANY: Final = "any"
WITHIN_INTERVAL: Final = "interval not exceeded"
INTERVAL_EXCEEDED: Final = "interval exceeded"
OLDER_BUSY: Final = "older still busy"
NEWER_BUSY: Final = "older drained, newer busy"
BOTH_DRAINED: Final = "older drained, newer drained"

TRANSITIONS: Final[dict[tuple[str, str, str], tuple[str, str]]] = {
    # (state, event, condition): (action, next state); the docstring's table, as data.
    (QUIESCENT, OPEN, ANY): ("start", TWO),
    (TWO, OPEN, WITHIN_INTERVAL): ("join_newer", TWO),
    (TWO, OPEN, INTERVAL_EXCEEDED): ("refuse", TWO),
    (TWO, CLOSE, OLDER_BUSY): ("uncount", TWO),
    (TWO, CLOSE, NEWER_BUSY): ("advance", TWO),
    (TWO, CLOSE, BOTH_DRAINED): ("quiesce", QUIESCENT),
}


class SequencerError(RuntimeError):
    """The sequencer was driven in a way its protocol forbids (a bug in the caller)."""


class BatchTicket(NamedTuple):
    """What ``open_batch`` hands out: the batch id and the epoch that counts it."""

    batch_id: int
    epoch_seq: int


class EpochClosed(NamedTuple):
    """An epoch the sequencer closed: what it decided, before the shipping pipeline
    adds the domain, the per-table counts and the setsum (``record`` makes the
    ``EpochRecord`` without them)."""

    epoch_seq: int
    begin_id: int
    end_id: int
    event_count: int
    quiescent: bool

    def covers(self, batch_id: int) -> bool:
        """True if ``batch_id`` belongs to this epoch (as ``EpochRecord.covers``)."""
        return covers(self.begin_id, self.end_id, batch_id)

    def record(self, domain_id: int) -> EpochRecord:
        return EpochRecord(domain_id, self.epoch_seq, self.begin_id, self.end_id,
                           self.event_count, self.quiescent)


class EpochSequencer:
    """Maps batch ids to epochs and reports each epoch it closes (``EpochClosed``).

    The caller feeds every fresh id in (``MonotonicIds.next`` under its lock). With
    ``max_quiescence_interval_ns`` set, ``open_batch`` refuses new batches once that
    long has passed since the last quiescence, until the sequencer quiesces again.
    """

    __slots__ = ("_actions", "_last_end", "_last_quiescence_ns", "_max_interval",
                 "_newer_count", "_newer_open", "_newer_seq", "_next_seq", "_older_begin",
                 "_older_count", "_older_end", "_older_open", "_older_seq", "domain_id",
                 "state")

    def __init__(self, domain_id: int, *, now_ns: int,
                 max_quiescence_interval_ns: int | None = None) -> None:
        self.domain_id = domain_id
        self._max_interval = max_quiescence_interval_ns
        self.state = QUIESCENT
        # The two epochs, as flat fields (no allocation per transition). The newer
        # epoch begins where the older ends, and its end is unset until it closes.
        self._older_seq = self._older_begin = self._older_end = 0
        self._older_open = self._older_count = 0
        self._newer_seq = self._newer_open = self._newer_count = 0
        self._next_seq = 1
        self._last_end = 0  # the sentinel: the first epoch begins at 0
        self._last_quiescence_ns = now_ns
        # Each row's action, bound once: a transition is one lookup and one call.
        self._actions = {key: getattr(self, "_" + action)
                         for key, (action, _next) in TRANSITIONS.items()}

    # -- queries ---------------------------------------------------------------------

    @property
    def quiescent(self) -> bool:
        """No batch in flight, no epoch open."""
        return self.state is QUIESCENT

    @property
    def last_quiescence_ns(self) -> int:
        return self._last_quiescence_ns

    def holding_back(self, now_ns: int) -> bool:
        """True if forced quiescence is in force: new batches must wait for quiescence."""
        return (
            self.state is TWO
            and self._max_interval is not None
            and now_ns - self._last_quiescence_ns >= self._max_interval
        )

    def open_batches(self) -> int:
        """How many batches are in flight (for diagnostics and tests)."""
        return self._older_open + self._newer_open

    def open_epochs(self) -> tuple[int, ...]:
        """The sequence numbers of the epochs open now (none, or older and newer)."""
        return () if self.state is QUIESCENT else (self._older_seq, self._newer_seq)

    # -- transitions -----------------------------------------------------------------

    def open_batch(self, batch_id: int, now_ns: int) -> BatchTicket | None:
        """Open write batch ``batch_id`` (a fresh id), or return ``None`` while forced
        quiescence holds it back (the id is then simply not used)."""
        state = self.state
        if state is QUIESCENT:
            condition = ANY
        elif (self._max_interval is not None
              and now_ns - self._last_quiescence_ns >= self._max_interval):
            condition = INTERVAL_EXCEEDED  # as holding_back(now_ns), inlined: every batch
        else:
            condition = WITHIN_INTERVAL
        return self._actions[(state, OPEN, condition)](batch_id)  # type: ignore[no-any-return]

    def close_batch(self, ticket: BatchTicket, now_ns: int, fresh_id: int,
                    event_count: int = 0) -> list[EpochClosed]:
        """Close a batch that produced ``event_count`` events; return the epochs closed.

        ``fresh_id`` is a new id (greater than every id fed in so far); it ends the
        newer epoch if this close drains the older one, and is otherwise unused.
        """
        if self.state is QUIESCENT:
            raise SequencerError(f"batch {ticket.batch_id} closed while the sequencer is quiescent")
        epoch_seq = ticket.epoch_seq
        if epoch_seq == self._older_seq:
            if self._older_open <= 0:
                raise SequencerError(f"epoch {epoch_seq} has no open batch to close")
            self._older_open -= 1
            self._older_count += event_count
        elif epoch_seq == self._newer_seq:
            if self._newer_open <= 0:
                raise SequencerError(f"epoch {epoch_seq} has no open batch to close")
            self._newer_open -= 1
            self._newer_count += event_count
        else:
            raise SequencerError(
                f"batch {ticket.batch_id} of epoch {epoch_seq} closed, but the open "
                f"epochs are {self._older_seq} and {self._newer_seq} (closed twice?)"
            )
        if self._older_open:
            condition = OLDER_BUSY
        elif self._newer_open:
            condition = NEWER_BUSY
        else:
            condition = BOTH_DRAINED
        return self._actions[(TWO, CLOSE, condition)](fresh_id, now_ns)  # type: ignore[no-any-return]

    # -- the actions of TRANSITIONS (each sets the row's next state) -------------------

    def _start(self, batch_id: int) -> BatchTicket:
        # QUIESCENT, open: the new epoch ends right after the new id.
        seq = self._next_seq
        self._next_seq = seq + 2
        self._older_seq, self._older_begin = seq, self._last_end
        self._older_end = _after(batch_id)
        self._older_open, self._older_count = 1, 0
        self._newer_seq, self._newer_open, self._newer_count = seq + 1, 0, 0
        self.state = TWO
        return BatchTicket(batch_id, seq)

    def _join_newer(self, batch_id: int) -> BatchTicket:
        self._newer_open += 1
        return BatchTicket(batch_id, self._newer_seq)

    def _refuse(self, batch_id: int) -> None:
        return None

    def _uncount(self, fresh_id: int, now_ns: int) -> list[EpochClosed]:
        return []

    def _advance(self, fresh_id: int, now_ns: int) -> list[EpochClosed]:
        # Emit the older; the newer closes at the fresh id, becomes the draining epoch,
        # and a new one accepts.
        older = EpochClosed(self._older_seq, self._older_begin, self._older_end,
                            self._older_count, False)
        self._older_seq, self._older_begin, self._older_end = (
            self._newer_seq, self._older_end, fresh_id)
        self._older_open, self._older_count = self._newer_open, self._newer_count
        seq = self._next_seq
        self._next_seq = seq + 1
        self._newer_seq, self._newer_open, self._newer_count = seq, 0, 0
        return [older]

    def _quiesce(self, fresh_id: int, now_ns: int) -> list[EpochClosed]:
        # Emit the older; the newer, drained too, closes at once as the quiescence marker.
        newer_begin = self._older_end
        closed = [EpochClosed(self._older_seq, self._older_begin, newer_begin,
                              self._older_count, False),
                  EpochClosed(self._newer_seq, newer_begin, fresh_id, self._newer_count,
                              True)]
        self._older_open = self._newer_open = 0
        self._last_end = fresh_id
        self._last_quiescence_ns = now_ns
        self.state = QUIESCENT
        return closed


def _after(batch_id: int) -> int:
    """The id right after ``batch_id`` on the ring, skipping the sentinel 0."""
    nxt = (batch_id + 1) & ((1 << 64) - 1)
    return nxt or 1
