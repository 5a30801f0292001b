"""The epoch sequencer as a state machine, driven by Hypothesis through random histories;
and its data-driven transition table against a reference written as plain code."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sequencer import BatchTicket, EpochClosed, EpochSequencer, SequencerError, id_lt
from sequencer._epochs import TRANSITIONS
from tests.sequencer._impls import SEQUENCERS, native_sequencer

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

    make: Any = EpochSequencer

    def __init__(self) -> None:
        super().__init__()
        self.now = 0
        self.ids = Counter()
        self.seq = self.make(42, now_ns=self.now, max_quiescence_interval_ns=INTERVAL)
        self.open: dict[int, tuple[BatchTicket, int]] = {}  # id -> ticket, count
        self.closed: list[tuple[int, int]] = []  # (batch id, events)
        self.records: list[EpochClosed] = []
        self.peak_open = 0

    def emit(self, records: list[EpochClosed]) -> None:
        self.records.extend(records)
        if records:
            # A quiescence marker appears exactly when the sequencer drains.
            assert records[-1].quiescent == self.seq.quiescent
            assert all(not r.quiescent for r in records[:-1])
        else:
            assert not self.seq.quiescent or not self.open

    @rule(events=st.integers(0, 5))
    def open_batch(self, events: int) -> None:
        ticket = self.seq.open_batch(self.ids(), self.now)
        if ticket is None:
            assert self.seq.holding_back(self.now)
            return
        for other, _ in self.open.values():
            # Batches open at the same time are in the same or adjacent epochs.
            assert abs(other.epoch_seq - ticket.epoch_seq) <= 1
        self.open[ticket.batch_id] = (ticket, events)
        self.peak_open = max(self.peak_open, len(self.open))

    @precondition(lambda self: bool(self.open))
    @rule(pick=st.integers(0, 10**6))
    def close_batch(self, pick: int) -> None:
        batch_id = sorted(self.open)[pick % len(self.open)]
        ticket, events = self.open.pop(batch_id)
        self.closed.append((batch_id, events))
        self.emit(self.seq.close_batch(ticket, self.now, self.ids(), events))

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
            inside = [(b, n) for b, n in self.closed if record.covers(b)]
            assert record.event_count == sum(n for _, n in inside)
        for batch_id in self.open:
            # Open batches are never inside a published epoch.
            assert not any(r.covers(batch_id) for r in self.records)

    @invariant()
    def state_is_bounded(self) -> None:
        assert self.seq.open_batches() == len(self.open)
        # Constant space: no epoch or two, in consecutive order.
        epochs = self.seq.open_epochs()
        assert len(epochs) in (0, 2)
        assert not epochs or epochs[1] == epochs[0] + 1

    def teardown(self) -> None:
        # Closing everything always ends quiescent, with every batch in some epoch.
        for batch_id in sorted(self.open):
            ticket, events = self.open.pop(batch_id)
            self.closed.append((batch_id, events))
            self.emit(self.seq.close_batch(ticket, self.now, self.ids(), events))
        assert self.seq.quiescent
        for batch_id, _ in self.closed:
            assert sum(r.covers(batch_id) for r in self.records) == 1


TestSequencerMachine = SequencerMachine.TestCase
TestSequencerMachine.settings = settings(max_examples=150, stateful_step_count=60,
                                         deadline=None)


class NativeSequencerMachine(SequencerMachine):
    """The same machine on the C sequencer."""

    make = staticmethod(native_sequencer)


TestNativeSequencerMachine = NativeSequencerMachine.TestCase
TestNativeSequencerMachine.settings = settings(max_examples=100, stateful_step_count=60,
                                               deadline=None)


@SEQUENCERS
def test_forced_quiescence_refuses_new_batches_until_drained(make_sequencer: Any) -> None:
    """Past the interval, opening is refused; once the open batches close, it works again."""
    ids = Counter()
    seq = make_sequencer(1, now_ns=0, max_quiescence_interval_ns=10 * NS)
    first = seq.open_batch(ids(), 0)
    assert first is not None
    second = seq.open_batch(ids(), 1 * NS)
    assert second is not None
    assert seq.open_batch(ids(), 11 * NS) is None  # interval exceeded, batches still open
    seq.close_batch(first, 11 * NS, ids())
    assert seq.open_batch(ids(), 11 * NS) is None
    records = seq.close_batch(second, 12 * NS, ids())
    assert records[-1].quiescent and seq.quiescent
    assert seq.open_batch(ids(), 12 * NS) is not None


@SEQUENCERS
def test_empty_epoch_is_published_as_quiescence_marker(make_sequencer: Any) -> None:
    """One batch alone: its epoch, then an empty quiescent epoch right after it."""
    ids = Counter()
    seq = make_sequencer(1, now_ns=0)
    ticket = seq.open_batch(ids(), 0)
    assert ticket is not None
    first, marker = seq.close_batch(ticket, 0, ids(), 3)
    assert (first.event_count, first.quiescent) == (3, False)
    assert (marker.event_count, marker.quiescent) == (0, True)
    assert marker.begin_id == first.end_id and first.covers(ticket.batch_id)


@SEQUENCERS
def test_closing_a_batch_twice_is_refused(make_sequencer: Any) -> None:
    """A protocol error surfaces as SequencerError, not a silent miscount."""
    ids = Counter()
    seq = make_sequencer(1, now_ns=0)
    ticket = seq.open_batch(ids(), 0)
    assert ticket is not None
    seq.close_batch(ticket, 0, ids())
    with pytest.raises(SequencerError):
        seq.close_batch(ticket, 0, ids())


class ReferenceSequencer:
    """The sequencer as plain code, one branch per row of the docstring's table (how it
    was written before the table became data): the oracle for ``TRANSITIONS``."""

    def __init__(self, interval: int | None) -> None:
        self.interval = interval
        self.older: list[int] | None = None  # [seq, begin, end, open, events]
        self.newer: list[int] | None = None
        self.next_seq, self.last_end, self.last_quiet = 1, 0, 0

    def open(self, batch_id: int, now: int) -> tuple[int, int] | None:
        if self.older is None:
            end = (batch_id + 1) & ((1 << 64) - 1) or 1
            self.older = [self.next_seq, self.last_end, end, 1, 0]
            self.newer = [self.next_seq + 1, end, -1, 0, 0]
            self.next_seq += 2
            return (batch_id, self.older[0])
        assert self.newer is not None
        if self.interval is not None and now - self.last_quiet >= self.interval:
            return None
        self.newer[3] += 1
        return (batch_id, self.newer[0])

    def close(self, epoch_seq: int, now: int, fresh: int,
              events: int) -> list[tuple[int, int, int, int, bool]]:
        older, newer = self.older, self.newer
        assert older is not None and newer is not None
        epoch = older if epoch_seq == older[0] else newer
        epoch[3] -= 1
        epoch[4] += events
        if older[3]:
            return []
        emitted = [(older[0], older[1], older[2], older[4], False)]
        newer[2] = fresh
        if newer[3]:
            self.older, self.newer = newer, [self.next_seq, fresh, -1, 0, 0]
            self.next_seq += 1
            return emitted
        emitted.append((newer[0], newer[1], newer[2], newer[4], True))
        self.older = self.newer = None
        self.last_end, self.last_quiet = fresh, now
        return emitted


operations = st.lists(st.tuples(st.sampled_from(["open", "close", "wait"]),
                                st.integers(0, 1000), st.integers(0, 6)),
                      max_size=120)


@SEQUENCERS
@settings(max_examples=200, deadline=None)
@given(operations, st.sampled_from([None, 5 * NS, 40 * NS]))
def test_the_transition_table_behaves_as_the_reference(
        make_sequencer: Any, ops: list[tuple[str, int, int]], interval: int | None) -> None:
    """Random open/close/time histories drive the data-driven sequencer and the plain
    reference with the same ids: the same tickets and refusals, the very same epochs
    closed (so they tile the id space alike), the same state after every step."""
    ids = Counter()
    seq = make_sequencer(9, now_ns=0, max_quiescence_interval_ns=interval)
    ref = ReferenceSequencer(interval)
    now = 0
    tickets: list[BatchTicket] = []
    emitted: list[EpochClosed] = []
    for op, pick, events in ops:
        if op == "wait":
            now += pick * NS // 100
        elif op == "open" or not tickets:
            batch_id = ids()
            ticket = seq.open_batch(batch_id, now)
            expected = ref.open(batch_id, now)
            assert (None if ticket is None else tuple(ticket)) == expected
            if ticket is not None:
                tickets.append(ticket)
        else:
            ticket = tickets.pop(pick % len(tickets))
            fresh = ids()
            closed = seq.close_batch(ticket, now, fresh, events)
            assert [tuple(c) for c in closed] == ref.close(ticket.epoch_seq, now, fresh, events)
            emitted += closed
        assert seq.quiescent == (ref.older is None)
        assert seq.open_batches() == len(tickets)
    end = 0
    for expected_seq, epoch in enumerate(emitted, start=1):  # the epochs tile
        assert (epoch.epoch_seq, epoch.begin_id) == (expected_seq, end)
        end = epoch.end_id


def test_every_row_of_the_table_has_an_action_and_the_docstring_lists_it() -> None:
    """The table is the documentation: each row's action exists, and each condition
    appears in the module docstring's table."""
    import sequencer._epochs as epochs

    seq = EpochSequencer(1, now_ns=0)
    doc = epochs.__doc__ or ""
    for (state, event, condition), (action, nxt) in TRANSITIONS.items():
        assert callable(getattr(seq, "_" + action))
        assert state in doc and nxt in doc and event in ("open", "close")
        assert condition == "any" or condition.split(",")[-1].strip() in doc
