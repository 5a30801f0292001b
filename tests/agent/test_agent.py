"""The Agent's writes, validation, quiescence callback, forced quiescence and lifecycle."""

from __future__ import annotations

import math
import struct
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent import ABSENT, Agent, AgentClosed, InvalidWrite, MemoryStore, QuiescenceTimeout
from replay import Assembler
from sinks import MemorySink
from tests.helpers import Captured, bits


def replayed(c: Captured) -> dict[object, bytes]:
    return bits(list(Assembler().replay(c.sink.records))[-1].state)


def test_set_returns_the_value_it_replaced() -> None:
    """set/delete report the old value; ABSENT for a cell that did not exist."""
    c = Captured()
    assert c.agent.set("t", 1, "a", "x") is ABSENT
    assert c.agent.set("t", 1, "a", None) == "x"
    assert c.agent.get("t", 1, "a") is None
    assert c.agent.delete("t", 1, "a") is None
    assert c.agent.get("t", 1, "a") is ABSENT
    assert c.agent.delete("t", 1, "a") is ABSENT  # nothing there: no event
    c.agent.close()
    assert len(c.sink.events) == 3


def test_clear_row_update_and_conditional_set() -> None:
    """Row clears, multi-row updates and per-row conditional stores replay exactly."""
    c = Captured()
    a = c.agent
    a.update("t", [1, 2, 3], {"a": 1, "b": b"x"})
    assert a.clear_row("t", 2) == {"a": 1, "b": b"x"}
    result = a.conditional_set("t", {
        1: {"a": (1, 10), "b": (b"x", b"y")},        # both match: succeeds
        3: {"a": (1, 30), "b": (b"nope", b"z")},     # first swaps, second fails
        4: {"a": (ABSENT, "new")},                   # creates the cell
    })
    assert result == {1: True, 3: False, 4: True}
    assert c.store.snapshot() == {
        ("t", 1, "a"): 10, ("t", 1, "b"): b"y", ("t", 3, "a"): 30, ("t", 3, "b"): b"x",
        ("t", 4, "a"): "new",
    }
    a.close()
    batch_ids = {e.batch_id for e in c.sink.events}
    assert len(batch_ids) == 3  # update, clear_row, conditional_set: one batch each
    assert replayed(c) == bits(c.store.snapshot())


@pytest.mark.parametrize(("call", "message"), [
    (lambda a: a.set("t", 1, "a", [1]), "has type list"),
    (lambda a: a.set("t", 1, "a", 1 << 63), "64-bit"),
    (lambda a: a.set("bad name", 1, "a", 1), "table name"),
    (lambda a: a.set("t", 1.5, "a", 1), "row key"),
    (lambda a: a.set("t", 1, "", 1), "column name"),
    (lambda a: a.set("t", 1, "a", ABSENT), "delete()"),
    (lambda a: a.update("t", [1, 2], {"a": 1, "b": object()}), "has type object"),
    (lambda a: a.conditional_set("t", {1: {"a": (None, 1)}, 2: {"b": (None, {})}}), "dict"),
])
def test_bad_writes_are_refused_before_the_store_is_touched(call: object, message: str) -> None:
    """A bad value, name or key raises InvalidWrite naming it; store and log unchanged."""
    c = Captured()
    c.agent.set("t", 1, "a", "kept")
    with pytest.raises(InvalidWrite, match=message):
        call(c.agent)  # type: ignore[operator]
    c.agent.close()
    assert c.store.snapshot() == {("t", 1, "a"): "kept"}
    assert len(c.sink.events) == 1


floats = st.floats(allow_nan=True, allow_infinity=True) | st.integers(0, (1 << 64) - 1).map(
    lambda b: struct.unpack("<d", struct.pack("<Q", b))[0])
values = (st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 63) - 1) | floats
          | st.text() | st.binary())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1, "r"]), st.sampled_from("ab"), values),
                min_size=1, max_size=20))
def test_every_value_survives_capture_and_replay_bit_for_bit(
        writes: list[tuple[object, str, object]]) -> None:
    """NaN payloads, -0.0, bytes vs str, None vs ABSENT, 1 vs True: all kept exactly."""
    c = Captured()
    with c.agent.batch():
        for row, column, value in writes:
            c.agent.set("t", row, column, value)  # type: ignore[arg-type]
    c.agent.close()
    assert replayed(c) == bits(c.store.snapshot())


def test_none_and_absent_and_bool_and_int_stay_distinct() -> None:
    """None is a stored null, ABSENT no cell; True is not 1; -0.0 is not 0.0."""
    c = Captured()
    c.agent.set("t", 1, "none", None)
    c.agent.set("t", 1, "true", True)
    c.agent.set("t", 1, "one", 1)
    c.agent.set("t", 1, "neg0", -0.0)
    c.agent.close()
    state = list(Assembler().replay(c.sink.records))[-1].state
    assert state[("t", 1, "none")] is None and ("t", 1, "gone") not in state
    assert state[("t", 1, "true")] is True and type(state[("t", 1, "one")]) is int
    assert math.copysign(1, state[("t", 1, "neg0")]) == -1


def test_on_quiescence_sees_the_store_while_new_batches_wait() -> None:
    """During the callback no new batch can start: the store stays at the quiescent state."""
    store, sink = MemoryStore(), MemorySink()
    in_callback = threading.Event()
    release = threading.Event()
    observed = []

    def callback(marker: object) -> None:
        if observed:
            return
        observed.append(store.snapshot())
        in_callback.set()
        release.wait(10)
        observed.append(store.snapshot())

    agent = Agent(store, sink, on_quiescence=callback)
    first = threading.Thread(target=agent.set, args=("t", 1, "a", 1))
    first.start()
    assert in_callback.wait(10)
    second = threading.Thread(target=agent.set, args=("t", 1, "a", 2))
    second.start()
    second.join(0.3)
    assert second.is_alive()  # held back while the callback runs
    release.set()
    first.join(10)
    second.join(10)
    agent.close()
    assert observed == [{("t", 1, "a"): 1}, {("t", 1, "a"): 1}]
    assert store.snapshot() == {("t", 1, "a"): 2}


class FakeClock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def test_forced_quiescence_holds_new_batches_until_the_sequencer_drains() -> None:
    """After the interval, a new batch waits for the open one to end, then proceeds."""
    clock = FakeClock()
    c = Captured(clock_ns=clock, max_quiescence_interval=5.0)
    entered, leave = threading.Event(), threading.Event()

    def long_batch() -> None:
        with c.agent.batch():
            c.agent.set("t", 1, "a", 1)
            entered.set()
            leave.wait(10)

    holder = threading.Thread(target=long_batch)
    holder.start()
    assert entered.wait(10)
    c.agent.set("t", 2, "a", 1)  # within the interval: fine, joins the newer epoch
    clock.now += 6_000_000_000
    waiter = threading.Thread(target=c.agent.set, args=("t", 3, "a", 1))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive() and c.store.get("t", 3, "a") is ABSENT
    leave.set()
    waiter.join(10)
    holder.join(10)
    assert c.store.get("t", 3, "a") == 1
    c.agent.close()


def test_forced_quiescence_times_out_with_a_clear_error() -> None:
    """A batch left open too long makes new batches fail with QuiescenceTimeout."""
    clock = FakeClock()
    c = Captured(clock_ns=clock, max_quiescence_interval=1.0, quiescence_wait_timeout=0.2)
    with c.agent.batch():
        c.agent.set("t", 1, "a", 1)
        clock.now += 2_000_000_000
        errors: list[BaseException] = []

        def other_writer() -> None:
            try:
                c.agent.set("t", 2, "a", 1)
            except QuiescenceTimeout as exc:
                errors.append(exc)

        t = threading.Thread(target=other_writer)
        t.start()
        t.join(10)
        assert errors and "held a new write batch back" in str(errors[0])
    c.agent.close()


def test_flush_and_close_are_idempotent_and_close_refuses_further_writes() -> None:
    """flush() twice, close() twice; a flush after close returns (it waited for a
    shipping thread close had stopped); a write after close raises AgentClosed."""
    c = Captured()
    c.agent.set("t", 1, "a", 1)
    c.agent.flush()
    c.agent.flush()
    c.agent.close()
    c.agent.close()
    c.agent.flush(timeout=10)
    assert c.sink.closed and len(c.sink.events) == 1
    with pytest.raises(AgentClosed):
        c.agent.set("t", 1, "a", 2)
    assert c.store.get("t", 1, "a") == 1


def test_flushes_and_close_do_not_wait_out_the_shippers_linger() -> None:
    """After a wake-up the shipper lingers to gather more writes, but not while someone
    waits on the shipment. With a 30 s linger, a flush after a write, a flush request
    (the sidecar's durable replies) and close each finish well within 10 s; each
    would wait the linger out otherwise (a flush after a write, twice)."""
    c = Captured()
    c.agent._shipper._linger = 30.0
    c.agent.set("t", 1, "a", 1)  # wakes the idle shipper, which lingers
    c.agent.flush(timeout=10)
    assert len(c.sink.events) == 1
    c.agent.set("t", 1, "a", 2)
    flushed = threading.Event()
    c.agent._shipper.request_flush(lambda error: flushed.set())
    assert flushed.wait(10)
    assert len(c.sink.events) == 2
    c.agent.set("t", 1, "a", 3)
    closer = threading.Thread(target=c.agent.close)
    closer.start()
    closer.join(10)
    assert not closer.is_alive() and c.sink.closed and len(c.sink.events) == 3


def test_a_failing_sink_surfaces_as_shipping_failed_and_the_store_keeps_its_writes() -> None:
    """The sink raises: the next flush says what happened; writes stay in the store."""
    from agent import ShippingFailed

    class BrokenSink(MemorySink):
        def write_events(self, batch: object) -> None:
            raise OSError("disk full")

    store = MemoryStore()
    agent = Agent(store, BrokenSink())
    agent.set("t", 1, "a", 1)
    with pytest.raises(ShippingFailed, match="disk full"):
        agent.flush(timeout=10)
    assert store.get("t", 1, "a") == 1
    with pytest.raises(ShippingFailed):
        agent.set("t", 1, "a", 2)
    with pytest.raises(ShippingFailed):
        agent.close(timeout=10)
    with pytest.raises(ShippingFailed, match="disk full"):  # after close, still said
        agent.flush(timeout=10)


def test_a_flush_whose_sink_fails_while_it_queues_its_request_still_raises_at_once() -> None:
    """The sink fails between the flush's own check and its request joining the queue:
    the shipping thread has already drained the queue and ended, so nobody would answer
    the request. The flush sees the failure after queueing and says so at once, not as
    a timeout after the whole wait."""
    from agent import ShippingFailed

    class FailingSink(MemorySink):
        fail = False

        def write_events(self, batch: object) -> None:
            if self.fail:
                raise OSError("disk full")
            super().write_events(batch)  # type: ignore[arg-type]

    sink = FailingSink()
    agent = Agent(MemoryStore(), sink)
    shipper = agent._shipper
    check = shipper._raise_if_failed

    def check_then_fail() -> None:
        check()
        if not sink.fail:  # only the flush's first check: the sink fails right after it
            sink.fail = True
            agent.set("t", 1, "a", 1)
            shipper._thread.join(30)  # it failed, drained its queue and ended

    shipper._raise_if_failed = check_then_fail  # type: ignore[method-assign]
    with pytest.raises(ShippingFailed, match="disk full"):
        agent.flush(timeout=5)


def test_close_while_writers_keep_writing_drains_and_refuses_new_batches() -> None:
    """close() stops new batches, waits for open ones, and loses nothing they wrote."""
    c = Captured()
    stop = threading.Event()
    refused = []

    def busy_writer(row: int) -> None:
        i = 0
        while not stop.is_set():
            try:
                with c.agent.batch():
                    c.agent.set("t", row, "a", i)
                    c.agent.set("t", row, "b", i)
            except AgentClosed:
                refused.append(row)
                return
            i += 1

    writers = [threading.Thread(target=busy_writer, args=(row,)) for row in range(4)]
    for w in writers:
        w.start()
    while c.agent.stats["batches"] < 200:
        threading.Event().wait(0.001)
    c.agent.close(timeout=30)
    stop.set()
    for w in writers:
        w.join(10)
    assert sorted(refused) == [0, 1, 2, 3]
    assert replayed(c) == bits(c.store.snapshot())


def test_close_inside_a_batch_is_refused() -> None:
    """Closing from inside a batch would wait for itself: a clear error instead."""
    c = Captured()
    with c.agent.batch():
        c.agent.set("t", 1, "a", 1)
        with pytest.raises(RuntimeError, match="inside a write batch"):
            c.agent.close()
    c.agent.close()


def test_a_program_that_forgets_close_still_ships_its_log(tmp_path: object) -> None:
    """At interpreter exit an unclosed agent is closed: the wal3 log has every event."""
    import subprocess
    import sys
    from pathlib import Path

    from sinks.wal3 import read_log

    log_dir = Path(str(tmp_path)) / "log"
    log_dir.mkdir()
    program = (
        "from agent import Agent, MemoryStore\n"
        "from sinks.wal3 import open_log_sink\n"
        f"agent = Agent(MemoryStore(), open_log_sink('file://{log_dir}'))\n"
        "for i in range(300):\n"
        "    agent.set('t', i % 7, 'a', i)\n"
        "# no close(): the program just ends\n"
    )
    subprocess.run([sys.executable, "-c", program], check=True, timeout=60,
                   capture_output=True)
    snapshots = list(Assembler().replay(read_log(f"file://{log_dir}")))
    assert sum(s.changeset.event_count for s in snapshots) == 300
    last_written = {("t", i % 7, "a"): i for i in range(300)}
    assert snapshots[-1].state == last_written


def test_an_unscoped_write_the_store_refuses_still_closes_its_batch() -> None:
    """The store raises on an unscoped write (the fast path outside any batch): the
    error reaches the caller, no event is logged, the automatic batch still closes (the
    agent quiesces and closes at once), and the next write is captured."""

    class Refusing(MemoryStore):
        refuse = True

        def exchange(self, *args: Any) -> Any:
            if self.refuse:
                raise OSError("store unavailable")
            return super().exchange(*args)

    store, sink = Refusing(), MemorySink()
    agent = Agent(store, sink)
    with pytest.raises(OSError, match="store unavailable"):
        agent.set("t", 1, "c", 1)
    assert agent._sequencer.quiescent and agent.stats["batches"] == 1
    store.refuse = False
    assert agent.set("t", 1, "c", 2) is ABSENT
    agent.close(timeout=10)
    assert [(e.row, e.new) for e in sink.events] == [(1, 2)]
    assert sum(1 for r in sink.epochs if r.quiescent) == 2
