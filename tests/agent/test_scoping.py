"""Write-batch scoping: contextvars give each thread and each asyncio task its own batch."""

from __future__ import annotations

import asyncio
import threading

import pytest

from agent import AsyncAgent, AsyncMemoryStore
from replay import Assembler
from sequencer import ChangeEvent
from sinks import MemorySink
from tests.helpers import Captured, bits


def batches_of(sink: MemorySink) -> dict[int, list[ChangeEvent]]:
    out: dict[int, list[ChangeEvent]] = {}
    for event in sink.events:
        out.setdefault(event.batch_id, []).append(event)
    return out


def test_writes_in_one_block_share_a_batch_and_unscoped_writes_get_their_own() -> None:
    """A `with agent.batch()` block is one batch; each write outside it is its own."""
    c = Captured()
    with c.agent.batch():
        c.agent.set("t", 1, "a", 1)
        c.agent.set("t", 1, "b", 2)
    c.agent.set("t", 2, "a", 3)
    c.agent.set("t", 2, "b", 4)
    c.agent.close()
    sizes = sorted(len(v) for v in batches_of(c.sink).values())
    assert sizes == [1, 1, 2]


def test_nested_batch_joins_the_outer_one() -> None:
    """An inner `batch()` adds to the outer batch instead of opening another."""
    c = Captured()
    with c.agent.batch():
        c.agent.set("t", 1, "a", 1)
        with c.agent.batch():
            c.agent.set("t", 1, "b", 2)
        c.agent.set("t", 1, "c", 3)
    c.agent.close()
    [batch] = batches_of(c.sink).values()
    assert [e.seq for e in batch] == [0, 1, 2]


def test_exception_inside_a_batch_still_closes_it_and_keeps_its_writes() -> None:
    """The writes before the exception took effect: they are shipped, the batch closes."""
    c = Captured()
    with pytest.raises(RuntimeError), c.agent.batch():
        c.agent.set("t", 1, "a", 1)
        raise RuntimeError("application bug")
    c.agent.set("t", 1, "a", 2)  # would hang in close() if the batch had stayed open
    c.agent.close(timeout=10)
    assert [e.new for e in c.sink.events] == [1, 2]
    assert bits(list(Assembler().replay(c.sink.records))[-1].state) == bits(c.store.snapshot())


def test_each_thread_sees_its_own_batch() -> None:
    """Two threads inside batches at the same time write into two different batches."""
    c = Captured()
    both_inside = threading.Barrier(2)

    def writer(row: int) -> None:
        with c.agent.batch():
            c.agent.set("t", row, "a", row)
            both_inside.wait(timeout=10)
            c.agent.set("t", row, "b", row)

    threads = [threading.Thread(target=writer, args=(row,)) for row in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    c.agent.close()
    batches = batches_of(c.sink)
    assert len(batches) == 2
    for events in batches.values():
        assert len({e.row for e in events}) == 1 and len(events) == 2


async def test_each_asyncio_task_sees_its_own_batch() -> None:
    """Interleaved tasks, each in its own `async with` block: one batch per task."""
    sink = MemorySink()
    store = AsyncMemoryStore()
    agent = AsyncAgent(store, sink)

    async def writer(row: int) -> None:
        async with agent.batch():
            for column in ("a", "b", "c"):
                await agent.set("t", row, column, row)
                await asyncio.sleep(0)  # let the other tasks interleave

    await asyncio.gather(*(writer(row) for row in range(5)))
    await agent.aclose()
    batches = batches_of(sink)
    assert len(batches) == 5
    for events in batches.values():
        assert len({e.row for e in events}) == 1 and len(events) == 3
    final = list(Assembler().replay(sink.records))[-1].state
    assert bits(final) == bits(store.sync.snapshot())


async def test_asyncio_workload_replays_to_the_store() -> None:
    """Many tasks with overlapping cells through AsyncAgent: snapshots equal the store's."""
    sink = MemorySink()
    store = AsyncMemoryStore()
    seen: dict[int, dict[object, bytes]] = {}
    agent = AsyncAgent(store, sink,
                       on_quiescence=lambda m: seen.__setitem__(m.epoch_seq,
                                                                bits(store.sync.snapshot())))

    async def writer(n: int) -> None:
        for i in range(200):
            if i % 3:
                async with agent.batch():
                    await agent.set("t", i % 4, "a", n)
                    await agent.delete("t", (i + n) % 4, "a")
                    await agent.conditional_set("t", {i % 4: {"b": (None, i)}})
            else:
                await agent.update("t", [0, 1, 2], {"c": float(i)})

    await asyncio.gather(*(writer(n) for n in range(8)))
    await agent.aclose()
    snapshots = list(Assembler().replay(sink.records))
    assert snapshots and all(bits(s.state) == seen[s.epoch_seq] for s in snapshots)
    assert bits(snapshots[-1].state) == bits(store.sync.snapshot())
