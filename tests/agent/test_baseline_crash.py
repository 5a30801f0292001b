"""Crash injection: a baseline into a wal3 log on the in-memory object store, the process
'crashing' at each store call in turn; a restart (a new agent, a new baseline) leaves a
log from which a consumer given nothing rebuilds the store."""

from __future__ import annotations

import contextlib
import random
from typing import Any

import pytest

from agent import Agent, MemoryStore
from replay import Assembler
from sinks.codec import encode_value
from sinks.objstore import Call, Crash, InMemoryObjectStore
from sinks.wal3 import Wal3Sink, read_log
from sinks.wal3._writer import WriterOptions
from tests.sinks.wal3.conftest import ProcessStore, no_sleep


def _bits(state: dict[Any, Any]) -> dict[Any, bytes]:
    return {cell: encode_value(value) for cell, value in state.items()}


def _store() -> MemoryStore:
    rng = random.Random(3)
    return MemoryStore({("t", i, c): rng.randrange(99) for i in range(40) for c in "ab"})


_OPTIONS = WriterOptions(batch_size_records=2, max_in_flight=1, store_retries=0)


def _run(objects: Any, store: MemoryStore) -> None:
    agent = Agent(store, Wal3Sink(objects, options=_OPTIONS))
    try:
        agent.set("t", 1, "a", "first")
        agent.snapshot(chunk_rows=7)
        agent.set("t", 2, "b", "after")
    finally:
        with contextlib.suppress(BaseException):
            agent.close(timeout=10)


def _calls() -> int:
    objects = InMemoryObjectStore("reference", sleep=no_sleep)
    _run(objects, _store())
    return sum(1 for c in objects.calls if c.phase == "before")


@pytest.mark.parametrize("phase", ["before", "after"])
def test_a_crash_at_any_store_call_of_a_baseline_then_a_restart(phase: str) -> None:
    total = _calls()
    assert total > 10
    for step in range(1, total + 1):
        objects = InMemoryObjectStore(f"crash-{phase}-{step}", sleep=no_sleep)
        seen = [0]

        def hook(call: Call, step: int = step, seen: list[int] = seen) -> None:
            if call.phase == "before":
                seen[0] += 1
            if call.phase == phase and seen[0] == step and call.phase == phase:
                seen[0] = -10**9  # fire once
                raise Crash(f"crash {phase} store call {step}")

        objects.on_step = hook
        store = _store()
        process = ProcessStore(objects)  # after its crash, nothing of it runs any more
        with contextlib.suppress(BaseException):
            _run(process, store)
        objects.on_step = None
        # Restart: a new agent on the same log takes a new baseline.
        with Agent(store, Wal3Sink(objects, options=_OPTIONS)) as agent:
            agent.snapshot(chunk_rows=7)
            agent.set("t", 3, "a", "restarted")
        snaps = list(Assembler().replay(read_log(objects)))
        assert _bits(snaps[-1].state) == _bits(store.snapshot()), (phase, step)
