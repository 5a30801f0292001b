"""``Agent.set`` runs as one C call (``sequencer._native.CellWriter``) when the C
sequencer is in use; the Python method ``Agent.set`` is its reference and the fallback
(``CDC_AGENT_NATIVE=0``). Random single-threaded histories of batches through both,
with the same domain and ids: the same results and errors, the same log (every event,
every epoch record with its counts and setsum), the same counters and store.
"""

from __future__ import annotations

import gc
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent import ABSENT, Agent, MemoryStore, ShippingFailed
from agent import _agent as agent_module
from agent import _native as choice
from sinks import MemorySink
from tests._memory import traced_growth
from tests.agent.test_unscoped_native import FlakyStore, ticks
from tests.sequencer._impls import native

# Values on both sides of every fast test: ASCII and not, 64-bit ints and beyond, bools
# (an int subclass), and types no cell may hold.
edges = st.sampled_from([(1 << 63) - 1, 1 << 63, -(1 << 63), -(1 << 63) - 1])
values = st.one_of(
    st.none(), st.booleans(), st.integers(-(1 << 64), 1 << 64), edges,
    st.floats(allow_nan=False), st.text(max_size=4), st.binary(max_size=4),
    st.sampled_from([1j, [1], "\ud800", ABSENT]))
rows = st.one_of(st.integers(-(1 << 64), 1 << 64), edges, st.text(max_size=3),
                 st.sampled_from([True, 1.5, b"k", "\udc80", None]))
# New names each history (the full checks run, then the fast ones), and bad ones.
names = st.one_of(st.sampled_from(["t", "c"]),
                  st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True),
                  st.sampled_from(["1x", "", "a-b", "é", 3]))
writes = st.tuples(st.sampled_from(["set", "set", "set", "kw", "refused", "delete"]),
                   names, rows, names, values)
history = st.lists(st.tuples(st.sampled_from(["batch", "nested", "unscoped"]),
                             st.lists(writes, min_size=1, max_size=8)),
                   min_size=1, max_size=8)


def run(steps: list[tuple[str, list[tuple[str, Any, Any, Any, Any]]]]) -> dict[str, Any]:
    store, sink = FlakyStore(), MemorySink()
    agent = Agent(store, sink, domain_id=42, ids=ticks())
    results: list[Any] = []

    def write(op: str, table: Any, row: Any, column: Any, value: Any) -> None:
        try:
            if op == "kw":
                results.append(agent.set(table=table, row=row, column=column, value=value))
            elif op == "delete":
                results.append(agent.delete(table, row, column))
            else:
                store.refuse = op == "refused"
                results.append(agent.set(table, row, column, value))
        except Exception as exc:
            results.append((type(exc).__name__, str(exc)))
        finally:
            store.refuse = False

    for kind, group in steps:
        try:
            if kind == "unscoped":
                for w in group:
                    write(*w)
            else:
                with agent.batch():
                    for i, w in enumerate(group):
                        if kind == "nested" and i % 2:
                            with agent.batch():  # joins: still the one batch
                                write(*w)
                        else:
                            write(*w)
        except Exception as exc:
            results.append((type(exc).__name__, str(exc)))
        results.append((dict(agent.stats), agent._last_point, agent._batches_closed))
    agent.close(timeout=30)
    events = sorted(sink.events, key=lambda e: (e.batch_id, e.seq))
    return {"native": type(agent.set).__module__ == "sequencer._native",
            "results": results, "events": events, "epochs": sink.epochs,
            "state": store.snapshot()}


def both(steps: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    native()
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(choice.ENV_VAR, raising=False)
        c = run(steps)
        patch.setenv(choice.ENV_VAR, "0")
        python = run(steps)
    assert c.pop("native") and not python.pop("native")
    return c, python


@settings(max_examples=30, deadline=None)
@given(history)
def test_the_c_set_logs_what_the_python_one_logs(steps: Any) -> None:
    c, python = both(steps)
    assert c == python


def test_a_full_segment_ships_from_inside_the_batch() -> None:
    """A batch of more than SEGMENT_EVENTS writes: the C set hands the full segment to
    the agent's ``_ship_segment`` as Python's does, so both logs hold the same events
    under the same seqs, counted once."""
    n = agent_module.SEGMENT_EVENTS + 3
    c, python = both([("batch", [("set", "t", i % 7, "c", i) for i in range(n)])])
    assert len(c["events"]) == n and c["epochs"][0].event_count == n
    assert [e.seq for e in c["events"]] == list(range(n))
    assert c == python


def test_a_subclass_keeps_its_own_set() -> None:
    native()

    class Counting(Agent):
        calls = 0

        def set(self, *args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return super().set(*args, **kwargs)

    agent = Counting(MemoryStore(), MemorySink())
    with agent.batch():
        agent.set("t", 1, "c", 1)
    agent.close()
    assert agent.calls == 1 and "set" not in vars(agent)


def test_a_subclass_keeps_its_own_batch_close() -> None:
    """A subclass's own ``_finish`` (or ``_quiesced``) closes its scoped batches: the C
    close is installed only for the steps ``_Capture`` defines."""
    native()

    class Counting(Agent):
        finished = 0

        def _finish(self, *args: Any) -> None:
            self.finished += 1
            super()._finish(*args)

    class Watching(Agent):
        def _quiesced(self, marker: Any) -> None:
            self.quiesced = getattr(self, "quiesced", 0) + 1
            super()._quiesced(marker)

    counting, watching = Counting(MemoryStore(), MemorySink()), Watching(MemoryStore(),
                                                                         MemorySink())
    for agent in (counting, watching):
        with agent.batch():
            agent.set("t", 1, "c", 1)
        agent.close()
    assert counting.finished == 1 and "_finish" not in vars(counting)
    assert watching.quiesced >= 1 and "_finish" not in vars(watching)
    plain = Agent(MemoryStore(), MemorySink())
    assert "_finish" in vars(plain)  # the C close, for the steps _Capture defines
    plain.close()


def test_a_close_whose_event_count_is_out_of_range_is_refused_before_an_id_is_taken(
        ) -> None:
    """The C close adds the events shipped before (``seq_start``) to the last
    segment's: a total outside int64 is refused with OverflowError before the close
    takes an id or counts anything; the batch then closes as usual, and the log is the
    one an agent that never tried writes (same scripted ids)."""
    native()

    def log(tries: list[int]) -> tuple[Any, Any]:
        sink = MemorySink()
        agent = Agent(MemoryStore(), sink, domain_id=7, ids=ticks())
        ticket = agent._open_ticket() if agent._open_ticket is not None else None
        assert ticket is not None and "_finish" in vars(agent)  # the C open and close
        for seq_start in tries:
            with pytest.raises(OverflowError, match="out of range"):
                agent._finish(ticket, seq_start, [None])
        agent._finish(ticket, 0, [])
        with agent.batch():
            agent.set("t", 1, "c", 1)
        agent.close()
        return sink.epochs, (dict(agent.stats), agent._batches_closed)

    assert log([(1 << 63) - 1, -1]) == log([])


def test_the_c_set_reads_the_store_and_the_batch_at_each_write() -> None:
    native()
    agent = Agent(MemoryStore(), MemorySink())
    assert type(agent.set).__module__ == "sequencer._native"
    with agent.batch():
        agent.set("t", 1, "c", 1)
        first, agent.store = agent.store, MemoryStore()
        assert agent.set("t", 1, "c", 2) is ABSENT
    assert first.get("t", 1, "c") == 1 and agent.store.get("t", 1, "c") == 2
    agent.close()
    assert agent.stats["batches"] == 1 and agent.stats["events"] == 2


def test_an_old_value_the_collector_tracks_keeps_its_event_tracked() -> None:
    """Events of scalars are untracked by the collector; one holding a container the
    store handed back (a store may return anything) stays tracked, so a cycle through
    it is still found. An insert's event (old ABSENT, an object the collector tracks
    though it holds nothing) is untracked. The batch's list of events is untracked
    (nothing in it can lead back to it)."""
    native()

    class OddStore(MemoryStore):
        def exchange(self, *args: Any) -> Any:
            super().exchange(*args)
            return self.odd

    store = OddStore()
    agent = Agent(store, MemorySink())
    batch_events: list[Any] = []
    with agent.batch():
        store.odd = 5
        agent.set("t", 1, "c", 1)
        store.odd = [1]
        agent.set("t", 1, "c", 2)
        store.odd = ABSENT
        agent.set("t", 2, "c", 3)
        batch_events = agent._current.get().events  # type: ignore[union-attr]
        assert gc.is_tracked(ABSENT)
        assert [gc.is_tracked(e) for e in batch_events] == [False, True, False]
        assert not gc.is_tracked(batch_events)  # events cannot lead back to their list
    with pytest.raises(ShippingFailed):  # a list is no cell value: the codec refuses it
        agent.close()


def test_the_c_set_leaks_nothing() -> None:
    """20,000 writes in batches through the C set: once shipped, traced memory is back
    where it was (a reference leaked per write would keep megabytes)."""
    native()
    agent = Agent(MemoryStore(), MemorySink(keep_messages=False))
    assert type(agent.set).__module__ == "sequencer._native"

    def run(n: int) -> None:
        for start in range(0, n, 100):
            with agent.batch():
                for i in range(start, start + 100):
                    agent.set("t", i % 50, "c", i)
        agent.flush(timeout=30)
        with agent.batch():  # the shipper holds its last shipment until the next
            agent.set("t", 0, "c", 0)
        agent.flush(timeout=30)
        agent._sink.records.clear()  # type: ignore[attr-defined]

    try:
        grown = traced_growth(run, warm_up=2000, measured=20_000)
    finally:
        agent.close()
    assert grown < 64 * 1024, f"{grown} bytes more after 20,000 writes"


def test_agent_set_replaced_after_import_hears_every_call(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A spy put on ``Agent.set`` (as tests and tracing do) sees every write: an agent
    made afterwards keeps ``set`` in Python rather than a C writer that bypasses it."""
    heard: list[tuple[Any, ...]] = []
    python_set = Agent.set

    def spy(self: Agent, *args: Any) -> Any:
        heard.append(args)
        return python_set(self, *args)

    monkeypatch.setattr(Agent, "set", spy)
    agent = Agent(MemoryStore(), MemorySink())
    agent.set("t", 1, "c", 1)
    with agent.batch():
        agent.set("t", 2, "c", 2)
    agent.close()
    assert heard == [("t", 1, "c", 1), ("t", 2, "c", 2)]
