"""An unscoped ``Agent.set`` runs as one C call (``sequencer._native.UnscopedWriter``)
when the C sequencer is in use, and so do a scoped batch's open and close
(``open_ticket``, ``close_batch``); ``Agent._set_unscoped``, ``Agent._open`` and
``Agent._finish`` in Python are their reference and the fallback (``CDC_AGENT_NATIVE=0``).
Random single-threaded histories through both, with the same domain, ids and clock:
the same results and errors, the same log (every event, every epoch record with its
counts and setsum), the same counters and quiescence points.
"""

from __future__ import annotations

import contextvars
import textwrap
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent import ABSENT, Agent, MemoryStore
from agent import _native as choice
from agent._scope import BatchScope
from sequencer import EpochRecord, MonotonicIds
from sinks import EventBatch, MemorySink
from tests._memory import traced_growth
from tests._subprocess import python_output
from tests.sequencer._impls import native

values = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 63), (1 << 63) - 1),
                   st.floats(allow_nan=False), st.text(max_size=5), st.binary(max_size=5))
# "hold" writes in a batch held open in another context (opened if none is), "release"
# closes it; "fail" fails the sink. Each step first moves the agent's clock on (ns): a
# batch held a few steps outlasts INTERVAL, and forced quiescence refuses new batches.
# At least four steps: Hypothesis favours short lists, and these cases take several.
Step = tuple[str, str, Any, str, Any, int]
steps = st.lists(st.tuples(
    st.sampled_from(["set", "set", "set", "refused", "scoped", "delete", "bad",
                     "hold", "hold", "hold", "release", "fail"]),
    st.sampled_from(["t", "users"]), st.integers(0, 4) | st.sampled_from(["k", "é"]),
    st.sampled_from(["a", "b"]), values,
    st.sampled_from([0, 0, 300_000_000, 700_000_000])), min_size=4, max_size=40)
INTERVAL = 1.0  # the agent's max_quiescence_interval, seconds


class FlakyStore(MemoryStore):
    """Refuses the exchanges it is told to (the store failing under a write)."""

    refuse = False

    def exchange(self, *args: Any) -> Any:
        if self.refuse:
            raise OSError("store unavailable")
        return super().exchange(*args)


class FlakySink(MemorySink):
    """Once told to fail, fails every write and flush (the sink failing for good)."""

    fail = False

    def write_events(self, batch: EventBatch) -> None:
        self._fail()
        super().write_events(batch)

    def write_epoch(self, record: EpochRecord) -> None:
        self._fail()
        super().write_epoch(record)

    def flush(self) -> None:
        self._fail()
        super().flush()

    def _fail(self) -> None:
        if self.fail:
            raise OSError("sink unavailable")


def ticks() -> MonotonicIds:
    clock = iter(range(10**9, 10**12, 977))
    return MonotonicIds(lambda: next(clock), lambda: 5 * 10**9)


def outcome(call: Any, *args: Any) -> Any:
    """What ``call(*args)`` returned, or the type and message of what it raised."""
    try:
        return call(*args)
    except Exception as exc:
        return type(exc).__name__, str(exc)


def run(history: list[Step], watch: bool) -> dict[str, Any]:
    store, sink = FlakyStore(), FlakySink()
    watched: list[EpochRecord] = []
    now = [10**9]  # the agent's clock: moved on by the steps only, never by the calls
    # quiescence_wait_timeout=0: an open that forced quiescence refuses raises at once
    # (in one thread nothing can end the wait). With a positive timeout the open is
    # retried at each wake-up, a fresh id each time, and how many wake-ups come before
    # the deadline depends on scheduling: the ids would differ from run to run.
    agent = Agent(store, sink, domain_id=42, ids=ticks(),
                  on_quiescence=watched.append if watch else None,
                  clock_ns=lambda: now[0], max_quiescence_interval=INTERVAL,
                  quiescence_wait_timeout=0.0)
    held: tuple[contextvars.Context, BatchScope] | None = None
    results: list[Any] = []
    for op, table, row, column, value, elapsed in history:
        now[0] += elapsed
        try:
            if op == "scoped":
                with agent.batch():
                    results.append(agent.set(table, row, column, value))
                    results.append(agent.set(table, row, "z", value))
            elif op == "delete":
                results.append(agent.delete(table, row, column))
            elif op == "bad":
                results.append(agent.set(table, row, column, 1j))  # type: ignore[arg-type]
            elif op == "hold":
                if held is None:  # opened in a context of its own, as another task's
                    context, scope = contextvars.copy_context(), agent.batch()
                    context.run(scope.__enter__)
                    held = context, scope
                results.append(held[0].run(agent.set, table, row, column, value))
            elif op == "release":
                if held is not None:
                    (context, scope), held = held, None
                    context.run(scope.__exit__, None, None, None)
            elif op == "fail":
                results.append(outcome(agent.flush, 30))  # what came before is shipped
                sink.fail = True
                results.append(outcome(agent.set, table, row, column, value))
                # The shipper fails on this write's shipment, or on this flush if it
                # queued none. Waiting for its thread to end leaves nothing to thread
                # timing: from here on every call sees the failure, and nothing is left
                # queued (the count of unshipped records is part of the message).
                agent._shipper.request_flush(lambda error: None)
                agent._shipper._thread.join(30)
                results.append(outcome(agent.flush, 30))
            else:
                store.refuse = op == "refused"
                results.append(agent.set(table, row, column, value))
        except Exception as exc:
            results.append((type(exc).__name__, str(exc)))
        finally:
            store.refuse = False
        results.append((dict(agent.stats), agent._last_point, agent._batches_closed))
    if held is not None:  # close() waits for every batch
        results.append(outcome(held[0].run, held[1].__exit__, None, None, None))
    results.append(outcome(agent.close, 30))  # a failed sink: close raises, as a flush
    events = sorted(sink.events, key=lambda e: (e.batch_id, e.seq))
    return {"native": type(agent._set_unscoped).__module__ == "sequencer._native",
            "results": results, "events": events, "epochs": sink.epochs,
            "watched": watched, "state": store.snapshot()}


@settings(max_examples=60, deadline=None)
@given(steps, st.booleans())
def test_the_c_writer_logs_what_the_python_one_logs(history: list[Step], watch: bool) -> None:
    """Including a batch held open in another context across steps (forced quiescence
    then refuses new batches once the interval passed) and a sink that fails for good
    (every later open, close and unscoped write refuses alike)."""
    native()
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(choice.ENV_VAR, raising=False)
        c = run(history, watch)
        patch.setenv(choice.ENV_VAR, "0")
        python = run(history, watch)
    assert c.pop("native") and not python.pop("native")
    assert c == python


def test_the_c_writer_takes_the_general_path_when_the_agent_is_closed() -> None:
    """The C writer writes to ``agent.store`` as it is at each write; closing (or held
    back, or a failed shipper): it hands the write to the general path, which refuses it
    as the Python one does."""
    native()
    agent = Agent(MemoryStore(), MemorySink())
    assert type(agent._set_unscoped).__module__ == "sequencer._native"
    assert agent.set("t", 1, "c", 1) is ABSENT
    first, agent.store = agent.store, MemoryStore()  # read at each write, as in Python
    assert agent.set("t", 1, "c", 3) is ABSENT
    assert first.get("t", 1, "c") == 1
    agent.close()
    with pytest.raises(RuntimeError, match="closed"):
        agent.set("t", 1, "c", 2)
    assert agent.store.get("t", 1, "c") == 3


def test_the_c_writer_leaks_nothing() -> None:
    """20,000 unscoped writes through the C writer (its queue items untracked by the
    collector): once shipped, traced memory is back where it was (a reference leaked
    per write, or an untracked cycle, would keep megabytes)."""
    native()
    store = MemoryStore()
    agent = Agent(store, MemorySink(keep_messages=False))
    assert type(agent._set_unscoped).__module__ == "sequencer._native"

    def run(n: int) -> None:
        for i in range(n):
            agent.set("t", i % 50, "c", i)
        agent.flush(timeout=30)
        # One more shipment: the shipper holds its last one until it takes the next.
        agent.set("t", 0, "c", 0)
        agent.flush(timeout=30)
        agent._sink.records.clear()  # type: ignore[attr-defined]

    try:
        grown = traced_growth(run, warm_up=2000, measured=20_000)
    finally:
        agent.close()
    assert grown < 64 * 1024, f"{grown} bytes more after 20,000 writes"


def test_a_wait_for_ticket_override_that_returns_no_ticket_raises_type_error() -> None:
    """Forced quiescence makes the C writer call ``agent._wait_for_ticket()``; a result
    that is not a (batch id, epoch) ticket (an override's bug) is a TypeError, not a
    read of memory that is not there (in a subprocess: a regression kills only it)."""
    native()
    code = textwrap.dedent("""
        import threading
        from agent import Agent, MemoryStore
        from sinks import MemorySink

        now = [10**9]
        agent = Agent(MemoryStore(), MemorySink(), clock_ns=lambda: now[0],
                      max_quiescence_interval=1.0)
        assert type(agent._set_unscoped).__name__ == "UnscopedWriter", "no C writer"
        agent._wait_for_ticket = lambda: None
        said = []

        def unscoped() -> None:
            try:
                agent.set("t", 2, "a", 1)
            except TypeError as exc:
                said.append("refused" if "not a (batch id, epoch) ticket" in str(exc)
                            else str(exc))

        with agent.batch():
            agent.set("t", 1, "a", 1)
            now[0] += 2 * 10**9  # past the interval: the next open is held back
            writer = threading.Thread(target=unscoped)
            writer.start()
            writer.join(10)
        agent.close()
        print(*said)
        """)
    assert python_output(code) == "refused"
