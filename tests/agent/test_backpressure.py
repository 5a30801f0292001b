"""A slow sink slows capture but never stops it (issue 10, item 11): new batches wait a
bounded time for the shipping queue, the caller that waited too long gets
ShippingBackpressure (nothing written), and the same Agent ships again once the sink
catches up."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent import ABSENT, AsyncAgent, AsyncMemoryStore, ShippingBackpressure
from agent.sidecar import _protocol as p
from replay import Assembler
from sequencer import EpochRecord
from sinks import EventBatch, MemorySink, SinkBackpressure, SinkTimeout
from sinks.wal3 import LogBackpressure
from tests.agent._sidecar import Raw, Served, short_dir
from tests.helpers import Captured, bits


class StallingSink(MemorySink):
    """While ``stalled`` is set, refuses every record as wal3 does when its queue is full
    (``LogBackpressure``: nothing taken), after a short wait of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.stalled = threading.Event()
        self.refusals = 0

    def _refuse_while_stalled(self) -> None:
        if self.stalled.is_set():
            self.refusals += 1
            time.sleep(0.005)
            raise LogBackpressure("the writer holds too much; nothing was queued")

    def write_events(self, batch: EventBatch) -> None:
        self._refuse_while_stalled()
        super().write_events(batch)

    def write_epoch(self, record: EpochRecord) -> None:
        self._refuse_while_stalled()
        super().write_epoch(record)


@pytest.fixture
def folder() -> Iterator[Path]:
    with short_dir() as path:
        yield path


def _check_replay(captured: Captured) -> None:
    snapshots = list(Assembler().replay(captured.sink.records))
    for snap in snapshots:
        assert bits(snap.state) == captured.at_quiescence[(snap.domain_id, snap.epoch_seq)]
    assert bits(snapshots[-1].state) == bits(captured.store.snapshot())


def _once_caught_up(write: Any) -> None:
    """Retry ``write`` while the shipper drains its backlog (bounded)."""
    deadline = time.monotonic() + 20
    while True:
        try:
            write()
            return
        except ShippingBackpressure:
            assert time.monotonic() < deadline, "the shipper did not catch up"


def test_a_stalled_sink_refuses_new_batches_then_capture_resumes() -> None:
    captured = Captured(max_queue=4, backpressure_timeout=0.3)
    sink = StallingSink()
    captured.sink = sink
    captured.agent._sink = sink  # the agent's own sink and shipper use it from here
    captured.agent._shipper._sink = sink
    agent, store = captured.agent, captured.store
    assert issubclass(LogBackpressure, SinkBackpressure)  # wal3's "took nothing, retry"
    agent.set("t", "before", "a", 1)
    agent.flush()
    sink.stalled.set()
    refused = None
    started = time.monotonic()
    for i in range(40):
        try:
            agent.set("t", i, "a", i)
        except ShippingBackpressure as exc:
            refused = i
            assert "sink is behind" in str(exc) and "nothing was written" in str(exc)
            break
    assert refused is not None, "a stalled sink never held a writer back"
    assert time.monotonic() - started < 20  # waits are bounded
    assert store.get("t", refused, "a") is ABSENT  # refused before the store was touched
    assert agent.shipping_error is None and sink.refusals > 0
    with pytest.raises(ShippingBackpressure):  # still behind: the next caller waits, too
        agent.set("t", "again", "a", 0)
    sink.stalled.clear()  # the sink catches up: the same Agent captures again
    _once_caught_up(lambda: agent.set("t", "first-after", "a", 0))
    for i in range(refused, refused + 30):
        agent.set("t", i, "a", i)
    with agent.batch():
        agent.set("t", "last", "a", 1)
        agent.set("t", "last", "b", 2)
    agent.flush()
    agent.close()
    _check_replay(captured)


class _FlakyFlushSink(MemorySink):
    def __init__(self) -> None:
        super().__init__()
        self.failures = 3

    def flush(self) -> None:
        if self.failures:
            self.failures -= 1
            raise SinkTimeout("not durable within the time allowed; still queued")
        super().flush()


def test_a_flush_that_times_out_is_retried() -> None:
    captured = Captured()
    sink = _FlakyFlushSink()
    captured.sink = sink
    captured.agent._shipper._sink = sink
    captured.agent._sink = sink
    captured.agent.set("t", 1, "a", 1)
    captured.agent.flush()
    assert sink.failures == 0 and captured.agent.shipping_error is None
    captured.agent.close()
    _check_replay(captured)


async def test_async_agent_waits_for_room_without_blocking_the_loop() -> None:
    sink = StallingSink()
    store = AsyncMemoryStore()
    agent = AsyncAgent(store, sink, max_queue=2, backpressure_timeout=0.3)
    sink.stalled.set()
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    ticker = asyncio.create_task(tick())
    with pytest.raises(ShippingBackpressure):
        for i in range(40):
            await agent.set("t", i, "a", i)
    assert ticks > 5  # the loop kept running while the writer waited
    ticker.cancel()
    sink.stalled.clear()
    deadline = time.monotonic() + 20
    while True:
        try:
            await agent.set("t", "after", "a", 1)
            break
        except ShippingBackpressure:
            assert time.monotonic() < deadline
    agent.flush()
    agent.close()
    assert bits(list(Assembler().replay(sink.records))[-1].state) == bits(
        await store.snapshot())


def test_the_sidecar_answers_backpressure_and_recovers(folder: Path) -> None:
    sink = StallingSink()
    served = Served(folder / "s", sink=sink, max_queue=2, backpressure_timeout=0.3)
    raw = Raw(folder / "s")
    sink.stalled.set()
    reply: dict[str, Any] = {}
    for i in range(40):
        reply = raw.call({"op": "open"})
        if not reply["ok"]:
            break
        served.store.exchange("t", i, "a", i)
        assert raw.call({"op": "close", "batch": reply["batch"], "events": [
            ["t", i, "a", {"absent": True}, i]]})["ok"]
    assert reply["ok"] is False and reply["error"] == p.BACKPRESSURE, reply
    assert raw.call({"op": "ping"})["ok"]  # the connection is fine
    sink.stalled.clear()
    deadline = time.monotonic() + 20
    while not (reply := raw.call({"op": "open"}))["ok"]:
        assert reply["error"] == p.BACKPRESSURE and time.monotonic() < deadline
    batch = reply["batch"]
    served.store.exchange("t", "after", "a", 1)
    assert raw.call({"op": "close", "batch": batch, "durable": True, "events": [
        ["t", "after", "a", {"absent": True}, 1]]})["durable"] is True
    raw.close()
    served.stop()
    served.check_against_store()
