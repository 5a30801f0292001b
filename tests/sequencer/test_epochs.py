"""The epoch sequencer as a state machine, driven by Hypothesis through random histories."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sequencer import BatchTicket, EpochRecord, EpochSequencer, SequencerError, id_lt

NS = 1_000_000_000
INTERVAL = 50 * NS


class Counter:
    """A deterministic id source (strictly increasing) for the machine."""

    def __init__(self) -> None:
        self.value = 7 << 32

    def __call__(self) -> int:
        self.value += 128
        return self.value


class SequencerMachine(RuleBasedStateMachine):
    """Random open/close interleavings; checks every emitted record against a model."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0
        self.ids = Counter()
        self.seq = EpochSequencer(42, self.ids, now_ns=self.now,
                                  max_quiescence_interval_ns=INTERVAL)
        self.open: dict[int, tuple[BatchTicket, int, str]] = {}  # id -> ticket, count, table
        self.closed: list[tuple[int, int, str]] = []  # (batch id, events, table)
        self.records: list[EpochRecord] = []
        self.peak_open = 0

    def emit(self, records: list[EpochRecord]) -> None:
        self.records.extend(records)
        if records:
            # A quiescence marker appears exactly when the sequencer drains.
            assert records[-1].quiescent == self.seq.quiescent
            assert all(not r.quiescent for r in records[:-1])
        else:
            assert not self.seq.quiescent or not self.open

    @rule(events=st.integers(0, 5), table=st.sampled_from(["a", "b", "c"]))
    def open_batch(self, events: int, table: str) -> None:
        ticket = self.seq.open_batch(self.now)
        if ticket is None:
            assert self.seq.holding_back(self.now)
            return
        for other, _, _ in self.open.values():
            # Batches open at the same time are in the same or adjacent epochs.
            assert abs(other.epoch_seq - ticket.epoch_seq) <= 1
        self.open[ticket.batch_id] = (ticket, events, table)
        self.peak_open = max(self.peak_open, len(self.open))

    @precondition(lambda self: bool(self.open))
    @rule(pick=st.integers(0, 10**6))
    def close_batch(self, pick: int) -> None:
        batch_id = sorted(self.open)[pick % len(self.open)]
        ticket, events, table = self.open.pop(batch_id)
        self.closed.append((batch_id, events, table))
        self.emit(self.seq.close_batch(ticket, self.now, events, {table: events} if events else {}))

    @rule(seconds=st.integers(0, 30))
    def advance_time(self, seconds: int) -> None:
        self.now += seconds * NS

    @invariant()
    def records_tile_the_id_space_in_order_with_exact_counts(self) -> None:
        previous_end = 0
        for expected_seq, record in enumerate(self.records, start=1):
            assert record.epoch_seq == expected_seq
            assert record.begin_id == previous_end
            assert previous_end == 0 or id_lt(record.begin_id, record.end_id)
            previous_end = record.end_id
            inside = [(b, n, t) for b, n, t in self.closed if record.covers(b)]
            assert record.event_count == sum(n for _, n, _ in inside)
            per_table: dict[str, int] = {}
            for _, n, t in inside:
                if n:
                    per_table[t] = per_table.get(t, 0) + n
            assert dict(record.table_counts) == per_table
        for batch_id in self.open:
            # Open batches are never inside a published epoch.
            assert not any(r.covers(batch_id) for r in self.records)

    @invariant()
    def state_is_bounded(self) -> None:
        assert self.seq.open_batches() == len(self.open)
        # Constant space: two epochs at most, each with one counter per table.
        epochs = [e for e in (self.seq._older, self.seq._newer) if e is not None]
        assert len(epochs) in (0, 2)
        assert all(len(e.table_counts) <= 3 for e in epochs)

    def teardown(self) -> None:
        # Closing everything always ends quiescent, with every batch in some epoch.
        for batch_id in sorted(self.open):
            ticket, events, table = self.open.pop(batch_id)
            self.closed.append((batch_id, events, table))
            self.emit(self.seq.close_batch(ticket, self.now, events, {table: events}))
        assert self.seq.quiescent
        for batch_id, _, _ in self.closed:
            assert sum(r.covers(batch_id) for r in self.records) == 1


TestSequencerMachine = SequencerMachine.TestCase
TestSequencerMachine.settings = settings(max_examples=150, stateful_step_count=60,
                                         deadline=None)


def test_forced_quiescence_refuses_new_batches_until_drained() -> None:
    """Past the interval, opening is refused; once the open batches close, it works again."""
    ids = Counter()
    seq = EpochSequencer(1, ids, now_ns=0, max_quiescence_interval_ns=10 * NS)
    first = seq.open_batch(0)
    assert first is not None
    second = seq.open_batch(1 * NS)
    assert second is not None
    assert seq.open_batch(11 * NS) is None  # interval exceeded, batches still open
    seq.close_batch(first, 11 * NS)
    assert seq.open_batch(11 * NS) is None
    records = seq.close_batch(second, 12 * NS)
    assert records[-1].quiescent and seq.quiescent
    assert seq.open_batch(12 * NS) is not None


def test_empty_epoch_is_published_as_quiescence_marker() -> None:
    """One batch alone: its epoch, then an empty quiescent epoch right after it."""
    seq = EpochSequencer(1, Counter(), now_ns=0)
    ticket = seq.open_batch(0)
    assert ticket is not None
    first, marker = seq.close_batch(ticket, 0, 3, {"t": 3})
    assert (first.event_count, first.quiescent) == (3, False)
    assert (marker.event_count, marker.quiescent) == (0, True)
    assert marker.begin_id == first.end_id and first.covers(ticket.batch_id)


def test_closing_a_batch_twice_is_refused() -> None:
    """A protocol error surfaces as SequencerError, not a silent miscount."""
    seq = EpochSequencer(1, Counter(), now_ns=0)
    ticket = seq.open_batch(0)
    assert ticket is not None
    seq.close_batch(ticket, 0)
    with pytest.raises(SequencerError):
        seq.close_batch(ticket, 0)
