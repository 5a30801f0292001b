"""The write path: batching, pipelining, backpressure, recovery, contention, sealing."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

import pytest

from sinks.objstore import Call, InMemoryObjectStore
from sinks.wal3 import (
    AlreadyInitialized,
    AsyncLogWriter,
    LogBackpressure,
    LogClosed,
    LogContention,
    LogPosition,
    LogReader,
    LogSealed,
    LogUnavailable,
    LogWriter,
    SnapshotOptions,
    UninitializedLog,
    WriterOptions,
    continue_log,
    encode_fragment,
    fragment_path,
    seal_log,
)
from tests.sinks.wal3.conftest import FakeClock, no_sleep


def bodies_in_log(store: Any, prefix: str = "") -> list[bytes]:
    reader = LogReader(store, prefix)
    reader.scrub()
    return [r.body for r in reader.records()]


class Gate:
    """Holds fragment uploads at the store until released; tracks their concurrency."""

    def __init__(self, store: InMemoryObjectStore, hold: int = 1_000_000,
                 hold_key: str | None = None) -> None:
        self.released = threading.Event()
        self.hold_key = hold_key  # hold only this object's upload (else the first `hold`)
        self.held_started = threading.Event()
        self.second_started = threading.Event()
        self.active = 0
        self.max_active = 0
        self.started = 0
        self.hold = hold
        self._lock = threading.Lock()
        store.on_step = self

    def __call__(self, call: Call) -> None:
        if call.op != "put_if_absent" or not call.key.startswith("log/"):
            return
        with self._lock:
            if call.phase == "before":
                self.active += 1
                self.started += 1
                self.max_active = max(self.max_active, self.active)
                if self.hold_key is not None:
                    # With a held key: "second" is any other fragment's upload.
                    (self.held_started if call.key == self.hold_key
                     else self.second_started).set()
                elif self.started >= 2:
                    self.second_started.set()
                held = (call.key == self.hold_key if self.hold_key is not None
                        else self.started <= self.hold)
            else:
                self.active -= 1
                return
        if held:
            assert self.released.wait(30), "gate never released"


def test_initialize_open_and_append(mem_store: InMemoryObjectStore) -> None:
    """Offsets start at 1 and increase by one per record; reopen continues after them."""
    with pytest.raises(UninitializedLog):
        LogWriter.open(mem_store)
    LogWriter.initialize(mem_store)
    with pytest.raises(AlreadyInitialized):
        LogWriter.initialize(mem_store)
    with LogWriter.open(mem_store) as writer:
        assert writer.append(b"a") == LogPosition(1)
        assert writer.append_many([b"b", b"c"]) == [LogPosition(2), LogPosition(3)]
    with LogWriter.open_or_initialize(mem_store) as writer:
        assert writer.append(b"d") == LogPosition(4)
    assert bodies_in_log(mem_store) == [b"a", b"b", b"c", b"d"]
    assert mem_store.head("manifest/MANIFEST") is not None


def test_batching_by_size_then_flush(mem_store: InMemoryObjectStore, clock: FakeClock) -> None:
    """With a frozen clock, batches are cut at batch_size_records; flush cuts the rest."""
    LogWriter.initialize(mem_store)
    opts = WriterOptions(batch_size_records=4, batch_interval=1e9, ship_when_idle=False)
    with LogWriter.open(mem_store, options=opts, clock=clock) as writer:
        futures = [writer.submit(bytes([i])) for i in range(10)]
        assert [f.result(10).offset for f in futures[:8]] == list(range(1, 9))
        writer.flush()
        assert futures[9].result(0).offset == 10
        sizes = [f.limit - f.start for f in writer.manifest.fragments]
    assert sizes == [4, 4, 2]


class WatchedClock(FakeClock):
    """A FakeClock that counts the batcher's reads: a batcher that read it again has
    looked at its queue again (and, if it is right, decided to keep waiting)."""

    def __init__(self) -> None:
        super().__init__()
        self._cv = threading.Condition()
        self.batcher_reads = 0

    def __call__(self) -> float:
        if threading.current_thread().name == "wal3-batcher":
            with self._cv:
                self.batcher_reads += 1
                self._cv.notify_all()
        return self.now

    def batcher_looked(self, times: int = 3, timeout: float = 10) -> bool:
        """Wait until the batcher has read the clock ``times`` more times (it re-checks
        a waiting queue at least every 50 ms of real time, and stops once it is empty)."""
        with self._cv:
            target = self.batcher_reads + times
            return self._cv.wait_for(lambda: self.batcher_reads >= target, timeout)


def test_batching_by_interval(mem_store: InMemoryObjectStore) -> None:
    """Records wait for batch_interval on the injected clock, then ship as one fragment.

    The batcher is seen to look at the queue repeatedly and hold the records (a writer
    that ignored batch_interval and cut at once would empty its queue and stop looking,
    one that never cut by age would never ship them).
    """
    clock = WatchedClock()
    LogWriter.initialize(mem_store)
    opts = WriterOptions(batch_interval=1.0, ship_when_idle=False)
    with LogWriter.open(mem_store, options=opts, clock=clock) as writer:
        futures = [writer.submit(b"r%d" % i) for i in range(3)]
        for step in (0.0, 0.5, 0.49):  # 0.99 s in all: not yet due
            clock.advance(step)
            writer.wakeup()
            assert clock.batcher_looked(), "the batcher stopped looking at its queue"
            assert not any(f.done() for f in futures)
            assert not [c for c in mem_store.calls if c.op.startswith("put") and "log/" in c.key]
        clock.advance(0.01)
        writer.wakeup()
        assert [f.result(10).offset for f in futures] == [1, 2, 3]
        assert len(writer.manifest.fragments) == 1


def test_more_than_one_fragment_in_flight(mem_store: InMemoryObjectStore) -> None:
    """Another fragment uploads while fragment 1 is still unlinked; links stay in order."""
    LogWriter.initialize(mem_store)
    # Hold fragment 1 itself: which upload thread reaches the store first is up to the
    # scheduler, and under load fragment 2's may.
    gate = Gate(mem_store, hold_key=fragment_path(1))
    opts = WriterOptions(batch_size_records=5, max_in_flight=3)
    with LogWriter.open(mem_store, options=opts) as writer:
        futures = writer.submit_many([b"x%d" % i for i in range(15)])
        assert gate.held_started.wait(10), "fragment 1 never started uploading"
        assert gate.second_started.wait(10), "a second fragment never started uploading"
        assert not futures[0].done()  # fragment 1 is held, so nothing can be linked
        gate.released.set()
        assert [f.result(10).offset for f in futures] == list(range(1, 16))
    # Another fragment was stored while fragment 1 was held, so before the first manifest
    # swap: more than one fragment in flight (which one is up to the scheduler).
    calls = [(c.op, c.key) for c in mem_store.calls if c.phase == "before"]
    first_swap = next(i for i, c in enumerate(calls) if c[0] == "put_if_match")
    other_puts = [i for i, (op, key) in enumerate(calls) if op == "put_if_absent"
                  and key.startswith("log/") and key != fragment_path(1)]
    assert other_puts and other_puts[0] < first_swap
    assert bodies_in_log(mem_store) == [b"x%d" % i for i in range(15)]


def test_backpressure_raises_a_typed_error(mem_store: InMemoryObjectStore) -> None:
    """A full queue raises LogBackpressure (at once, or after the timeout); nothing is
    queued; once the store drains, appends flow again."""
    LogWriter.initialize(mem_store)
    gate = Gate(mem_store)
    opts = WriterOptions(max_pending_records=4, backpressure_timeout=0.01)
    with LogWriter.open(mem_store, options=opts) as writer:
        futures = writer.submit_many([b"1", b"2", b"3", b"4"])
        with pytest.raises(LogBackpressure, match="nothing was queued"):
            writer.submit(b"5", timeout=0)
        with pytest.raises(LogBackpressure):
            writer.submit(b"5")
        gate.released.set()
        assert [f.result(10).offset for f in futures] == [1, 2, 3, 4]
        assert writer.append(b"5") == LogPosition(5)
    assert bodies_in_log(mem_store) == [b"1", b"2", b"3", b"4", b"5"]


def test_orphaned_fragment_is_rolled_forward(mem_store: InMemoryObjectStore) -> None:
    """A fragment whose manifest update never happened is adopted by the next writer."""
    LogWriter.initialize(mem_store)
    with LogWriter.open(mem_store) as writer:
        writer.append_many([b"a", b"b"])
    data, setsum = encode_fragment(3, 99, [b"orphan1", b"orphan2"])
    mem_store.put_if_absent(fragment_path(2), data)
    with LogWriter.open(mem_store) as writer:
        frag = writer.manifest.fragment(2)
        assert frag is not None and frag.setsum == setsum and frag.limit == 5
        assert writer.append(b"c") == LogPosition(5)
    assert bodies_in_log(mem_store) == [b"a", b"b", b"orphan1", b"orphan2", b"c"]


def test_unreachable_orphan_is_deleted_not_adopted(mem_store: InMemoryObjectStore) -> None:
    """An orphan whose offsets do not follow the manifest can never be linked: deleted."""
    LogWriter.initialize(mem_store)
    with LogWriter.open(mem_store) as writer:
        writer.append(b"a")
    data, _ = encode_fragment(7, 99, [b"stranded"])
    mem_store.put_if_absent(fragment_path(2), data)
    with LogWriter.open(mem_store) as writer:
        assert writer.manifest.next_seq_no == 2
        assert writer.append(b"b") == LogPosition(2)
    assert bodies_in_log(mem_store) == [b"a", b"b"]


def test_two_writers_in_one_process_never_lose_acknowledged_appends(
        mem_store: InMemoryObjectStore) -> None:
    """Two writers race on one log; every acknowledged append is read back exactly once."""
    LogWriter.initialize(mem_store)
    opts = WriterOptions(batch_size_records=8, max_in_flight=3, max_contention_retries=1000)
    writers = [LogWriter.open(mem_store, options=opts, sleep=no_sleep,
                              writer_name=f"w{i}") for i in range(2)]
    acked: list[tuple[bytes, int]] = []
    lock = threading.Lock()

    def run(i: int) -> None:
        for j in range(40):
            futures = writers[i].submit_many([b"w%d-%d-%d" % (i, j, k) for k in range(5)])
            for k, fut in enumerate(futures):
                try:
                    pos = fut.result(30)
                except Exception:
                    continue
                with lock:
                    acked.append((b"w%d-%d-%d" % (i, j, k), pos.offset))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for writer in writers:
        writer.close()
    reader = LogReader(mem_store)
    reader.scrub()
    records = {r.offset: r.body for r in reader.records()}
    counts = Counter(records.values())
    assert all(n == 1 for n in counts.values()), "a record appears twice"
    for body, offset in acked:
        assert records[offset] == body
    assert len(acked) > 200


def test_snapshots_keep_the_manifest_small(mem_store: InMemoryObjectStore) -> None:
    """Past the thresholds the manifest rolls into a snapshot tree; reads see everything."""
    LogWriter.initialize(mem_store)
    opts = WriterOptions(batch_size_records=3, snapshots=SnapshotOptions(4, 3))
    with LogWriter.open(mem_store, options=opts) as writer:
        for i in range(60):
            writer.append_many([b"%d" % (3 * i + k) for k in range(3)])
        manifest = writer.manifest
    assert len(manifest.fragments) <= 5
    assert max(s.depth for s in manifest.snapshots) >= 2
    assert bodies_in_log(mem_store) == [b"%d" % i for i in range(180)]
    assert mem_store.list("snapshot/")


def test_seal_refuses_appends_and_a_new_log_continues(mem_store: InMemoryObjectStore) -> None:
    """A sealed log fails appends with LogSealed; a continuation starts at its end."""
    LogWriter.initialize(mem_store, "old")
    other = LogWriter.open(mem_store, "old")
    with LogWriter.open(mem_store, "old") as writer:
        writer.append_many([b"a", b"b", b"c"])
        sealed = writer.seal()
        assert sealed.sealed and sealed.next_offset == 4
        with pytest.raises(LogSealed):
            writer.append(b"late")
    with pytest.raises(LogSealed, match="initial_offset"):
        other.append(b"racing")
    other.close()
    with pytest.raises(LogSealed):
        LogWriter.open(mem_store, "old")
    assert seal_log(mem_store, "old").sealed  # idempotent
    manifest = continue_log(mem_store, mem_store, sealed_prefix="old", new_prefix="new")
    assert manifest.next_offset == 4
    with LogWriter.open(mem_store, "new") as writer:
        assert writer.append(b"d") == LogPosition(4)
    assert bodies_in_log(mem_store, "old") == [b"a", b"b", b"c"]
    assert [r.offset for r in LogReader(mem_store, "new").records()] == [4]


def test_closed_writer_refuses_appends(mem_store: InMemoryObjectStore) -> None:
    """After close(), appends raise LogClosed; close() twice is fine."""
    LogWriter.initialize(mem_store)
    writer = LogWriter.open(mem_store)
    writer.append(b"a")
    writer.close()
    writer.close()
    with pytest.raises(LogClosed):
        writer.append(b"b")


def test_store_failures_are_retried(mem_store: InMemoryObjectStore) -> None:
    """Transient failures (and ambiguous ones: written, then an error) are absorbed."""
    LogWriter.initialize(mem_store)
    mem_store.faults.fail("put_if_absent", key="log/*", times=2)
    mem_store.faults.fail("put_if_match", times=1, after=True)
    mem_store.faults.fail("put_if_absent", key="log/*", nth=5, after=True)
    with LogWriter.open(mem_store, sleep=no_sleep) as writer:
        positions = [writer.append(b"%d" % i) for i in range(10)]
    assert [p.offset for p in positions] == list(range(1, 11))
    assert bodies_in_log(mem_store) == [b"%d" % i for i in range(10)]


def test_async_cancelled_callers_never_wedge_the_log(mem_store: InMemoryObjectStore) -> None:
    """Cancelling awaiting callers stops only their waiting; the log keeps going and
    their records still become durable, in order."""
    LogWriter.initialize(mem_store)
    gate = Gate(mem_store)

    async def main() -> list[LogPosition]:
        log = AsyncLogWriter(LogWriter.open(mem_store))
        tasks = [asyncio.create_task(log.append(b"c%d" % i)) for i in range(5)]
        await asyncio.sleep(0)
        while not gate.started:
            await asyncio.sleep(0.001)
        for task in tasks[:3]:
            task.cancel()
        await asyncio.gather(*tasks[:3], return_exceptions=True)
        gate.released.set()
        rest = [await t for t in tasks[3:]]
        rest.append(await log.append(b"after"))
        await log.close()
        return rest

    positions = asyncio.run(main())
    assert [p.offset for p in positions] == [4, 5, 6]
    assert bodies_in_log(mem_store) == [b"c0", b"c1", b"c2", b"c3", b"c4", b"after"]


def test_stranded_fragment_is_failed_not_retried(mem_store: InMemoryObjectStore) -> None:
    """Fragment 2 lands but fragment 1 cannot be stored: 1's records are retried, 2's
    fail with LogContention (they may appear once, when a later writer adopts the
    orphan) and are never appended a second time."""
    LogWriter.initialize(mem_store)
    second_done = threading.Event()

    def hook(call: Call) -> None:
        if call.op != "put_if_absent":
            return
        if call.key == fragment_path(2) and call.phase == "after":
            second_done.set()
        if call.key == fragment_path(1) and call.phase == "before" and call.n == 1:
            assert second_done.wait(10)

    mem_store.on_step = hook
    mem_store.faults.fail("put_if_absent", key=fragment_path(1), times=3)
    opts = WriterOptions(batch_size_records=2, max_in_flight=2, store_retries=2)
    with LogWriter.open(mem_store, options=opts, sleep=no_sleep) as writer:
        futures = writer.submit_many([b"a", b"b", b"c", b"d"])
        assert [f.result(10).offset for f in futures[:2]] == [1, 2]
        for fut in futures[2:]:
            with pytest.raises(LogContention, match="may appear once"):
                fut.result(10)
    mem_store.on_step = None
    with LogWriter.open(mem_store) as writer:
        writer.append(b"e")
    assert bodies_in_log(mem_store) == [b"a", b"b", b"c", b"d", b"e"]


def test_an_outage_fails_appends_then_the_writer_recovers(mem_store: InMemoryObjectStore) -> None:
    """While the store is down appends fail with LogUnavailable (not acknowledged);
    once it is back the same writer appends again and the log is sound."""
    LogWriter.initialize(mem_store)
    opts = WriterOptions(store_retries=1)
    with LogWriter.open(mem_store, options=opts, sleep=no_sleep) as writer:
        assert writer.append(b"before") == LogPosition(1)
        mem_store.faults.fail("*", times=None)
        with pytest.raises(LogUnavailable):
            writer.append(b"lost", timeout=30)
        mem_store.faults.clear()
        after = writer.append(b"after", timeout=30)
    bodies = bodies_in_log(mem_store)
    assert bodies[0] == b"before" and bodies[-1] == b"after"
    assert after.offset == len(bodies)
    assert bodies.count(b"lost") <= 1
