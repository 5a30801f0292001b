"""Each WriterOptions knob does what it says (each test fails if its knob is ignored)."""

from __future__ import annotations

import pytest

from sinks.objstore import InMemoryObjectStore, PreconditionFailed
from sinks.wal3 import (
    LogContention,
    LogReader,
    LogWriter,
    WriterOptions,
    encode_fragment,
    fragment_path,
)
from tests.sinks.wal3.conftest import FakeClock, no_sleep
from tests.sinks.wal3.test_writer import Gate, WatchedClock


def fragment_sizes(writer: LogWriter) -> list[int]:
    return [f.limit - f.start for f in writer.manifest.fragments]


def test_batching_by_bytes(mem_store: InMemoryObjectStore) -> None:
    """A batch is cut once the queue holds batch_size_bytes and takes records up to that
    size (never splitting one); what is left waits (for the interval, or a flush)."""
    LogWriter.initialize(mem_store)
    opts = WriterOptions(batch_size_bytes=100, ship_when_idle=False, batch_interval=3600)
    with LogWriter.open(mem_store, options=opts, clock=FakeClock()) as writer:
        futures = writer.submit_many([b"%030d" % i for i in range(10)])  # 30 bytes each
        assert [f.result(10).offset for f in futures[:9]] == list(range(1, 10))
        assert fragment_sizes(writer) == [3, 3, 3]
        assert not futures[9].done()  # 30 bytes < 100: not due, and the clock stands still
        writer.flush()
        assert futures[9].result(0).offset == 10
        big = writer.submit(b"x" * 250)  # larger than a batch: ships alone, whole
        assert big.result(10).offset == 11
        assert fragment_sizes(writer) == [3, 3, 3, 1, 1]


def test_ship_when_idle_ships_at_once_and_groups_while_busy(mem_store: InMemoryObjectStore) -> None:
    """With nothing in flight a record ships at once, whatever batch_interval says;
    records that arrive while a fragment is in flight wait and then ship together."""
    LogWriter.initialize(mem_store)
    gate = Gate(mem_store, hold_key=fragment_path(1))
    opts = WriterOptions(batch_interval=3600)  # only idleness (or size, flush) cuts
    with LogWriter.open(mem_store, options=opts, clock=FakeClock()) as writer:
        first = writer.submit(b"first")
        assert gate.held_started.wait(10), "an idle writer did not ship at once"
        rest = [writer.submit(b"r%d" % i) for i in range(3)]
        gate.released.set()
        assert first.result(10).offset == 1
        assert [f.result(10).offset for f in rest] == [2, 3, 4]
        assert fragment_sizes(writer) == [1, 3]


def test_max_in_flight_holds_the_batcher_back(mem_store: InMemoryObjectStore) -> None:
    """With max_in_flight uploads running, nothing more is cut (the batcher does not even
    look at its queue): records due meanwhile wait and then ship as one batch."""
    clock = WatchedClock()
    LogWriter.initialize(mem_store)
    gate = Gate(mem_store, hold_key=fragment_path(1))
    opts = WriterOptions(max_in_flight=1, batch_interval=1.0, ship_when_idle=False)
    with LogWriter.open(mem_store, options=opts, clock=clock) as writer:
        first = writer.submit(b"a")
        clock.advance(1.0)
        writer.wakeup()
        assert gate.held_started.wait(10)
        later = []
        for body in (b"b", b"c"):
            later.append(writer.submit(body))
            clock.advance(1.0)  # due by age, but the one upload slot is taken
            writer.wakeup()
            assert not clock.batcher_looked(1, timeout=0.2), "cut past max_in_flight"
        gate.released.set()
        assert [f.result(10).offset for f in [first, *later]] == [1, 2, 3]
        assert fragment_sizes(writer) == [1, 2]


class RivalStore(InMemoryObjectStore):
    """Another writer always stores its fragment first, at every sequence number, and
    one that never follows on from the manifest (so it is never adopted)."""

    RIVAL = encode_fragment(1_000, 1, [b"rival"])[0]

    def put_if_absent(self, key: str, data: bytes) -> str:
        if key.startswith("log/"):
            raise PreconditionFailed(key)
        return super().put_if_absent(key, data)

    def get(self, key: str) -> tuple[bytes, str]:
        if key.startswith("log/"):
            return self.RIVAL, "rival"
        return super().get(key)


def test_contention_gives_up_after_max_contention_retries() -> None:
    """A writer that loses every sequence number retries max_contention_retries rounds,
    then fails the records with LogContention saying they were not stored."""
    store = RivalStore("rival", sleep=no_sleep)
    LogWriter.initialize(store)
    opts = WriterOptions(max_contention_retries=3)
    with LogWriter.open(store, options=opts, sleep=no_sleep) as writer:
        future = writer.submit(b"mine")
        with pytest.raises(LogContention, match="after 4 rounds of contention"):
            future.result(20)


def test_nothing_is_acknowledged_before_the_manifest_links_it() -> None:
    """The manifest swap fails past the store retries (no answer: LogUnavailable); the
    writer re-reads and swaps again, and only then resolves the append, so an
    acknowledged record is always readable at that moment."""
    store = InMemoryObjectStore("ack", sleep=no_sleep)
    LogWriter.initialize(store)
    store.faults.fail("put_if_match", key="manifest/*", times=5)  # 1 try + 4 retries
    with LogWriter.open(store, sleep=no_sleep) as writer:
        position = writer.submit(b"durable").result(10)
        assert [r.body for r in LogReader(store).read(position.offset)] == [b"durable"]
        assert store.count("put_if_match") >= 6
