"""The assembler's algebra on hand-made logs: chains, gaps, foreign and conflicting records."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent import ABSENT
from replay import Assembler, InconsistentLog
from sequencer import ChangeEvent, EpochRecord
from tests.helpers import Captured, bits


def small_log(writes: int = 6) -> Captured:
    c = Captured()
    for i in range(writes):
        c.agent.set("t", i % 2, "a", i)
    c.agent.close()
    return c


def test_gap_before_a_quiescence_point_is_reported() -> None:
    """An epoch record that never arrives: InconsistentLog naming it at the end."""
    c = small_log()
    epochs = [r for r in c.sink.records if isinstance(r, EpochRecord)]
    missing = epochs[2]
    records = [r for r in c.sink.records if r is not missing]
    with pytest.raises(InconsistentLog, match=f"epoch {missing.epoch_seq} never arrived"):
        list(Assembler().replay(records))


def test_conflicting_epoch_records_are_refused() -> None:
    """Two different records for one epoch: InconsistentLog."""
    c = small_log()
    epoch = next(r for r in c.sink.records if isinstance(r, EpochRecord))
    forged = dataclasses.replace(epoch, event_count=epoch.event_count + 1)
    with pytest.raises(InconsistentLog, match="two different records"):
        list(Assembler().replay([forged, *c.sink.records]))


def test_two_events_with_one_identity_but_different_content_are_refused() -> None:
    """A duplicate must be a true copy."""
    c = small_log()
    event = c.sink.events[0]
    fake = dataclasses.replace(event, new="other")
    with pytest.raises(InconsistentLog, match="share the identity"):
        list(Assembler().replay([fake, *c.sink.records]))


def test_broken_chain_names_the_cell() -> None:
    """An event whose old value does not match the state: the error names the cell."""
    c = small_log()
    records = list(c.sink.records)
    index = next(i for i, r in enumerate(records)
                 if isinstance(r, ChangeEvent) and r.old is not ABSENT)
    event = records[index]
    assert isinstance(event, ChangeEvent)
    records[index] = dataclasses.replace(event, old="not what was there")
    with pytest.raises(InconsistentLog) as info:
        list(Assembler().replay(records))
    assert info.value.cell == event.cell
    assert info.value.domain_id == event.domain_id


def test_initial_state_mismatch_is_caught() -> None:
    """Replaying onto a state that is not the one the log started from fails."""
    c = small_log()
    with pytest.raises(InconsistentLog):
        list(Assembler(initial_state={("t", 0, "a"): "unexpected"}).replay(c.sink.records))


def test_log_starting_mid_domain_needs_a_position() -> None:
    """Without a position, a log missing its first epochs is reported at the end."""
    c = small_log()
    first_quiescent = next(i for i, r in enumerate(c.sink.records)
                           if isinstance(r, EpochRecord) and r.quiescent)
    with pytest.raises(InconsistentLog, match="never arrived"):
        list(Assembler().replay(c.sink.records[first_quiescent + 1:]))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3) | st.none()), min_size=1,
                max_size=40), st.integers(0, 2**32))
def test_chains_in_any_order_cancel_to_the_final_state(
        ops: list[tuple[int, int | None]], seed: int) -> None:
    """Random sets and deletes in one batch, events shuffled: the replay is the store."""
    c = Captured()
    with c.agent.batch():
        for row, value in ops:
            if value is None:
                c.agent.delete("t", row, "a")
            else:
                c.agent.set("t", row, "a", value)
    c.agent.close()
    records = list(c.sink.records)
    events = [r for r in records if isinstance(r, ChangeEvent)]
    random.Random(seed).shuffle(events)
    epochs = [r for r in records if isinstance(r, EpochRecord)]
    shuffled = [*events, *epochs]
    assert bits(list(Assembler().replay(shuffled))[-1].state) == bits(c.store.snapshot())


def test_a_restarted_agent_continues_the_log_as_a_new_domain() -> None:
    """Two agent lifetimes on one store and one log: the replay follows both domains."""
    from agent import Agent, MemoryStore
    from sinks import MemorySink

    store, log = MemoryStore(), []
    for lifetime in range(2):
        sink = MemorySink()  # each lifetime opens the destination anew
        agent = Agent(store, sink)
        for i in range(10):
            agent.set("t", i % 3, "a", lifetime * 100 + i)
        agent.delete("t", lifetime, "a")
        agent.close()
        log += sink.records
    assert len({r.domain_id for r in log}) == 2
    assert bits(list(Assembler().replay(log))[-1].state) == bits(store.snapshot())


def test_a_crash_that_loses_unshipped_records_is_detected_by_the_next_domain() -> None:
    """Writes the log never got (a crash before shipping) make the next domain's chain
    fail: InconsistentLog naming the cell, never a silently wrong state."""
    from agent import Agent, MemoryStore
    from sinks import MemorySink

    store, before, after = MemoryStore(), MemorySink(), MemorySink()
    first = Agent(store, before)
    first.set("t", 1, "a", "shipped")
    first.close()
    store.exchange("t", 1, "a", "written, then the process died")  # never captured
    second = Agent(store, after)
    second.set("t", 1, "a", "after restart")
    second.close()
    with pytest.raises(InconsistentLog) as info:
        list(Assembler().replay(before.records + after.records))
    assert info.value.cell == ("t", 1, "a")
