"""The C sequencer and ids (``sequencer._native``) against the pure-Python reference:
random histories drive both, and every output (ids, tickets, refusals, closed epochs,
errors, every query) must be equal. Also: no leak over many batches, and the agent's
choice of implementation (``CDC_AGENT_NATIVE``)."""

from __future__ import annotations

import contextlib
import os
import textwrap
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import sequencer
from agent import _native as choice
from sequencer import EpochSequencer, MonotonicIds, SequencerError
from tests._memory import traced_growth
from tests.sequencer._impls import native, sha3_lane_counts, sha3_lanes

NS = 1_000_000_000
U64 = (1 << 64) - 1


class Script:
    """A clock that returns a scripted sequence of readings (the same for both)."""

    def __init__(self, readings: list[int]) -> None:
        self.readings = readings
        self.at = 0

    def __call__(self) -> int:
        value = self.readings[self.at % len(self.readings)]
        self.at += 1
        return value


offsets = st.one_of(st.integers(-(1 << 62), 1 << 62), st.integers(-(1 << 80), 1 << 80),
                    st.sampled_from([0, (1 << 32) * NS - 3, 1_700_000_000 * NS]))
readings = st.lists(st.one_of(st.integers(0, 1 << 62), st.integers(-(1 << 70), 1 << 70),
                              st.integers(10 * NS, 10 * NS + 300)), min_size=1, max_size=80)


@settings(max_examples=300, deadline=None)
@given(offsets, readings, st.integers(1, 120))
@example(offset=-40, clock=[10], calls=2)  # -30 ns: floor and truncation differ by one id tick
def test_native_ids_equal_the_reference(offset: int, clock: list[int], calls: int) -> None:
    """Any clock path (frozen, backwards, beyond 64 bits, across the wrap), any offset:
    the very same ids, the same ``last()`` after each, the same offset."""
    python = MonotonicIds(Script(clock), Script([clock[0] + offset]))
    c = native().MonotonicIds(Script(clock), Script([clock[0] + offset]))
    assert c.offset_ns == python.offset_ns == offset
    assert c.last() == python.last() == 0
    for i in range(calls):
        expected = python.next() if i % 2 else python()
        assert (c.next() if i % 2 else c()) == expected
        assert c.last() == python.last()


def test_native_ids_propagate_clock_errors() -> None:
    def broken() -> int:
        raise OSError("no clock")

    with pytest.raises(OSError, match="no clock"):
        native().MonotonicIds(broken, lambda: 0)
    ids = native().MonotonicIds(Script([1, 1, "x"]), lambda: 0)  # type: ignore[list-item]
    ids.next()
    with pytest.raises(TypeError):
        ids.next()


steps = st.lists(st.tuples(st.sampled_from(["open", "close", "close", "wait", "bogus"]),
                           st.integers(0, 1000), st.integers(0, 9)), max_size=150)


def call(fn: Any, *args: Any) -> Any:
    """The result, or the error's type and message: both must match too."""
    try:
        result = fn(*args)
    except SequencerError as exc:
        return ("raised", type(exc), str(exc))
    if isinstance(result, list):
        return [tuple(r) for r in result]
    return None if result is None else tuple(result)


def queries(seq: Any, now: int) -> tuple[Any, ...]:
    return (seq.state, seq.quiescent, seq.last_quiescence_ns, seq.holding_back(now),
            seq.open_batches(), seq.open_epochs(), seq.domain_id)


@settings(max_examples=300, deadline=None)
@given(steps, st.sampled_from([None, 0, 5 * NS, 40 * NS]),
       st.sampled_from([1, 7 << 32, U64 - 600, (1 << 63) - 300]), st.integers(0, 1 << 62))
def test_native_sequencer_equals_the_reference(
        history: list[tuple[str, int, int]], interval: int | None, first_id: int,
        start_ns: int) -> None:
    """Random open/close/time histories, with ids that may wrap past 2**64 and protocol
    errors (a batch closed twice, a ticket of no open epoch, a close while quiescent):
    the same tickets, refusals, closed epochs and errors, the same state after each."""
    python = EpochSequencer(77, now_ns=start_ns, max_quiescence_interval_ns=interval)
    c = native().EpochSequencer(77, now_ns=start_ns, max_quiescence_interval_ns=interval)
    assert type(c).__module__ == "sequencer._native"
    now, next_id = start_ns, first_id
    tickets: list[Any] = []
    closed: list[Any] = []

    def fresh() -> int:
        nonlocal next_id
        next_id = (next_id + 128) & U64 or 1
        return next_id

    for op, pick, events in history:
        if op == "wait":
            now += pick * NS // 50
        elif op == "open" or not tickets:
            batch_id = fresh()
            ticket = call(python.open_batch, batch_id, now)
            assert call(c.open_batch, batch_id, now) == ticket
            if ticket is not None:
                tickets.append(ticket)
        elif op == "bogus":  # a ticket closed twice, or of an epoch long gone
            bogus = closed[pick % len(closed)] if closed and pick % 2 else (5, 10**6 + pick)
            fresh_id = fresh()
            assert call(c.close_batch, _ticket(bogus), now, fresh_id, events) == call(
                python.close_batch, _ticket(bogus), now, fresh_id, events)
        else:
            ticket = tickets.pop(pick % len(tickets))
            closed.append(ticket)
            fresh_id = fresh()
            expected = call(python.close_batch, _ticket(ticket), now, fresh_id, events)
            assert call(c.close_batch, _ticket(ticket), now, fresh_id, events) == expected
        assert queries(c, now) == queries(python, now)


def _ticket(fields: tuple[int, int]) -> Any:
    from sequencer import BatchTicket

    return BatchTicket(*fields)


def test_native_records_are_the_python_types() -> None:
    """Tickets and closed epochs are the reference's NamedTuples (methods included)."""
    from sequencer import BatchTicket, EpochClosed

    seq = native().EpochSequencer(3, now_ns=0)
    ticket = seq.open_batch(1000, 0)
    assert type(ticket) is BatchTicket and ticket.batch_id == 1000
    first, marker = seq.close_batch(ticket, 5, 2000, 4)
    assert type(first) is EpochClosed and first.covers(1000) and marker.quiescent
    assert first.record(3).event_count == 4
    with pytest.raises(TypeError):
        native().EpochSequencer(3)  # now_ns is required, as in the reference


def test_many_batches_leak_nothing() -> None:
    """40,000 batches through the C ids and sequencer: traced memory stays flat (a
    reference leaked per call would grow it by megabytes)."""
    import time

    c = native()
    ids = c.MonotonicIds(time.monotonic_ns, time.time_ns)
    seq = c.EpochSequencer(5, now_ns=0, max_quiescence_interval_ns=10 * NS)
    nxt = ids.next

    def run(n: int) -> None:
        for i in range(n):
            first = seq.open_batch(nxt(), i)
            second = seq.open_batch(nxt(), i)
            seq.close_batch(first, i, nxt(), 1)
            seq.close_batch(second, i, nxt(), 2)
            with contextlib.suppress(SequencerError):
                seq.close_batch(second, i, nxt(), 2)

    grown = traced_growth(run, warm_up=1000, measured=40_000)
    assert grown < 64 * 1024, f"{grown} bytes more after 40,000 batches"


def test_agents_run_native_unless_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent import Agent, MemoryStore, system_ids
    from sinks import MemorySink

    native()
    monkeypatch.delenv(choice.ENV_VAR, raising=False)
    agent = Agent(MemoryStore(), MemorySink())
    assert type(agent._sequencer).__module__ == "sequencer._native"
    assert type(agent._ids).__module__ == "sequencer._native"
    agent.close()
    monkeypatch.setenv(choice.ENV_VAR, "0")
    agent = Agent(MemoryStore(), MemorySink())
    assert type(agent._sequencer) is EpochSequencer
    assert type(system_ids()) is MonotonicIds
    agent.set("t", 1, "c", 1)
    agent.close()


def test_a_missing_extension_warns_once_and_falls_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from structlog.testing import capture_logs

    monkeypatch.delenv(choice.ENV_VAR, raising=False)
    monkeypatch.setattr(sequencer, "NATIVE", None)
    monkeypatch.setattr(sequencer, "NATIVE_ERROR", "ImportError: not built")
    monkeypatch.setattr(choice, "_warned", False)
    with capture_logs() as logs:
        assert type(choice.new_sequencer(1, now_ns=0)) is EpochSequencer
        assert type(choice.new_ids(lambda: 0, lambda: 0)) is MonotonicIds
    warnings = [e for e in logs if e["event"] == "cdc.native_unavailable"]
    assert len(warnings) == 1 and warnings[0]["error"] == "ImportError: not built"


@pytest.mark.parametrize("lanes", sha3_lane_counts())
@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=400) | st.binary(min_size=1000, max_size=3000),
                max_size=40))
@example([b"", b"x" * 135, b"y" * 136, b"z" * 137, b"w" * 272])  # the block edges
@example([b"a" * 1500, b"", b"b", b"c" * 136, b"d" * 700])  # lanes ending at different times
def test_native_sha3_slices_equal_hashlib(lanes: int, items: list[bytes]) -> None:
    """Every slice's digest is hashlib's SHA3-256, across the 136-byte block edges, one
    message at a time and four at once (messages of different lengths share a step)."""
    import hashlib

    import numpy as np

    skip = len(items) % 3  # slices need not start at the body's first byte
    bounds = np.cumsum([skip] + [len(i) for i in items]).astype(np.int64)
    with sha3_lanes(lanes):
        digests = native().sha3_slices(b"-" * skip + b"".join(items), bounds)
    assert digests == b"".join(hashlib.sha3_256(i).digest() for i in items)


def test_native_sha3_lanes_refuse_what_the_machine_lacks() -> None:
    with pytest.raises(ValueError, match="2 lanes are not available"):
        native().sha3_lanes(2)
    assert native().sha3_lanes() in (1, 4)
    if 4 in sha3_lane_counts() and os.environ.get("CDC_AGENT_SHA3_X4") != "0":
        assert native().sha3_lanes() == 4  # AVX2 here: used unless switched off


def test_native_sha3_slices_refuse_bounds_outside_the_body() -> None:
    import numpy as np

    with pytest.raises(ValueError, match="not inside"):
        native().sha3_slices(b"abc", np.array([0, 4], np.int64))
    with pytest.raises(TypeError, match="int64"):
        native().sha3_slices(b"abc", np.array([0, 3], np.int32))


rows_of = st.integers(0, 6).flatmap(lambda width: st.tuples(
    st.just(width), st.lists(st.tuples(*[st.integers() | st.text(max_size=3)] * width),
                             max_size=30)))


@settings(max_examples=200, deadline=None)
@given(rows_of)
def test_native_transpose_equals_the_python_one(case: tuple[int, list[tuple[Any, ...]]]) -> None:
    width, rows = case
    assert native().transpose(rows, width) == choice.transpose(rows, width)
    if rows and width:
        assert list(zip(*native().transpose(rows, width), strict=True)) == rows
    bad = [*rows, (1,) * (width + 1)]
    for impl in (native().transpose, choice.transpose):
        with pytest.raises(ValueError, match=f"row {len(rows)} is not a tuple"):
            impl(bad, width)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.tuples(st.sampled_from(["t", "users", "é"]),
                                   st.integers(-5, 5) | st.text(max_size=4),
                                   st.sampled_from(["a", "b"]),
                                   st.integers(-9, 9) | st.text(max_size=8) | st.none(),
                                   st.integers(-(1 << 63), (1 << 63) - 1) | st.binary(max_size=9)),
                         min_size=1, max_size=3), min_size=40, max_size=120))
def test_the_shippers_native_helpers_give_the_same_arrow_and_digests(
        segments: list[list[tuple[Any, ...]]]) -> None:
    """Many small segments (automatic batches, the gathered-items branch): the shipper's
    Arrow batch and every segment digest are the same with the C helpers as without."""
    from agent._shipper import _to_arrow
    from sinks.codec import segment_digest_array

    items: list[Any] = [(1000 + 128 * k, k, 0, events, []) for k, events in enumerate(segments)]
    python_data, python_lengths, python_batches, python_epochs = _to_arrow(
        99, items, choice.transpose)
    native_data, native_lengths, native_batches, native_epochs = _to_arrow(
        99, items, native().transpose)
    assert list(native_epochs) == list(python_epochs) == [i[1] for i in items]
    assert native_data.equals(python_data)
    assert list(native_lengths) == list(python_lengths)
    assert list(native_batches) == list(python_batches) == [i[0] for i in items]
    starts, digests = segment_digest_array(python_data)
    assert len(starts) == len(segments)
    native_starts, native_digests = segment_digest_array(native_data, native().sha3_slices)
    assert list(native_starts) == list(starts) and native_digests == digests


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(
    st.integers(0, (1 << 64) - 1), st.integers(0, 3),
    st.lists(st.tuples(st.sampled_from(["t", "users", "é" * 40]),
                       st.integers(-5, 5) | st.text(max_size=60),
                       st.sampled_from(["a", "b"]),
                       st.none() | st.integers(-(1 << 63), (1 << 63) - 1)
                       | st.text(max_size=300),
                       st.booleans() | st.floats() | st.binary(max_size=200)),
             min_size=1, max_size=12)), min_size=1, max_size=30, unique_by=lambda s: s[0]),
    st.integers(0, (1 << 63) - 1), st.integers(0, 3))
def test_native_segment_digests_equal_the_codecs(
        segments: list[tuple[int, int, list[tuple[Any, ...]]]], domain_id: int,
        skip: int) -> None:
    """The shipper's C digests (each queue item's segment built and hashed in C) are
    ``sinks.codec.segment_digest_array``'s: any ids, later segments of a batch (seq
    starts at a multiple of 2**16), items across SHA3's 136-byte blocks, and a record
    batch that is a slice of a larger one (Arrow offsets not starting at 0). One queue
    item is one segment: a batch's items never share a seq start."""
    from agent._shipper import _native_digests, _to_arrow
    from sinks.codec import segment_digest_array

    items: list[Any] = [(batch, 0, part << 16, events, [])
                        for batch, part, events in segments]
    data, lengths, batches, _epochs = _to_arrow(domain_id, items, choice.transpose)
    if skip:  # the same segments, preceded by another batch's events, then sliced off
        extra: list[Any] = [(7, 0, 0, [("x", 1, "y", "z" * 50, b"w")] * skip, [])]
        whole, *_ = _to_arrow(domain_id, extra + items, choice.transpose)
        data = whole.slice(skip)
    _starts, expected = segment_digest_array(data)
    assert _native_digests(native().sha3_segments, domain_id, batches, lengths,
                           data) == expected


def test_native_segment_digests_refuse_inconsistent_buffers() -> None:
    """The shipper's call shape (cumulative bounds, one domain repeated) is checked as
    replay's: lengths that overrun the seqs, or a value outside its data, are refused."""
    import numpy as np

    from agent._shipper import _native_digests, _to_arrow

    digests = native().sha3_segments
    data, lengths, batches, _ = _to_arrow(3, [(5, 0, 0, [("t", 1, "c", "o", "n")], [])],
                                          choice.transpose)
    assert len(_native_digests(digests, 3, batches, lengths, data)) == 32
    with pytest.raises(ValueError, match="seqs: 2 items"):
        _native_digests(digests, 3, batches, np.array([2], np.int64), data)
    ok = (np.zeros(2, np.int32), b"")
    bounds, one, seqs = np.array([0, 1], np.int64), np.array([5], np.uint64), np.zeros(1, np.uint32)
    with pytest.raises(ValueError, match="outside the values buffer"):
        digests(bounds, one, one, seqs, ((np.array([0, 3], np.int32), b""), *[ok] * 4))
    with pytest.raises(ValueError, match="bounds must increase"):
        digests(np.array([0, 0, 1], np.int64), np.array([5, 5], np.uint64),
                np.array([5, 5], np.uint64), seqs, (ok,) * 5)


def test_switched_off_at_start_a_process_uses_no_c_at_all() -> None:
    """``CDC_AGENT_NATIVE=0`` in the environment of a new process: every helper the
    agent picks at import or per agent is the Python one (a batch's event list too)."""
    import os
    import subprocess
    import sys

    native()
    code = textwrap.dedent("""
        import agent._agent as module
        from agent import Agent, MemoryStore
        from agent import _native as choice
        from sinks import MemorySink
        agent = Agent(MemoryStore(), MemorySink())
        with agent.batch():
            agent.set("t", 1, "c", 1)
        agent.close()
        print(module._new_events is list, choice.shipper_helpers()[1] is None,
              choice.event_encoder() is None, choice.table_runs_helper() is None,
              type(agent._sequencer).__module__)
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env={**os.environ, choice.ENV_VAR: "0"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True"] * 4 + ["sequencer._epochs"], done.stdout
