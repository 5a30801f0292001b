"""Crash injection at every step of the write path and of garbage collection.

Each seeded trial runs a few writer "processes" against one in-memory store; each
process crashes at a random step (a ``Crash`` before or after a chosen store call:
fragment PUT, manifest swap, snapshot PUT, a read, a delete). After each process,
a collector may run with its own crash point. Finally a clean writer opens the log with
no manual step. Then: scrub passes, offsets are contiguous, no record appears twice,
and every acknowledged record is at its acknowledged offset (unless garbage collected
below the cursor, which only happens at or below the cursor).

A crash point is "the nth matching store call". How many calls a session makes depends
on how the batcher groups records into fragments (group commit: records queued while a
fragment is in flight ship together), and that depends on thread timing. So a seeded
trial replays its faults, not its interleaving: on a loaded machine fewer fragments may
be cut and an nth-call crash point may never be reached. The durability checks hold for
every interleaving; only the number of crashes that fire varies (9 to 14 per block of
25 for the lowest blocks under CPU load, 10 to 14 unloaded). ``merged=True`` replays a
trial with the batching pinned to the latest batcher (a frozen clock, no shipping when
idle: only full batches, flushes and close cut fragments), so the fragments cut no
longer depend on timing and that case runs on every machine (uploads still run in
parallel).
"""

from __future__ import annotations

import contextlib
import itertools
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import replace

import pytest

from sinks.objstore import Call, Crash, InMemoryObjectStore
from sinks.wal3 import (
    CursorStore,
    GarbageCollector,
    LogPosition,
    LogReader,
    LogUnavailable,
    LogWriter,
    SnapshotOptions,
    Wal3Error,
    WriterOptions,
    encode_fragment,
    fragment_path,
)
from tests.sinks.wal3.conftest import ProcessStore, no_sleep

KEYS = ["log/*", "manifest/*", "snapshot/*", "gc/*", "cursor/*", "*"]
OPS = ["put_if_absent", "put_if_match", "put", "get", "delete", "list", "*"]


def _arm(store: InMemoryObjectStore, rng: random.Random) -> None:
    store.faults.clear()
    store.faults.crash(rng.choice(OPS), key=rng.choice(KEYS), nth=rng.randint(1, 10),
                       after=rng.random() < 0.5)
    if rng.random() < 0.3:
        store.faults.fail("put*", times=rng.randint(1, 3), probability=0.3,
                          after=rng.random() < 0.5)


# The fewest crashes a block of 25 trials must see: enough to show the crash points
# are wired and fire, with a wide margin under the timing-dependent count (see above).
MIN_CRASHES_PER_BLOCK = 5


def run_trial(seed: int, *, merged: bool = False) -> tuple[int, int]:
    """One trial; returns (acknowledged records, crashes) for the summary check.

    ``merged``: cut fragments only when full, on flush and on close (a frozen clock and
    no shipping when idle), as a batcher that always runs late would.
    """
    rng = random.Random(seed)
    store = InMemoryObjectStore(f"crash-{seed}", seed=seed, sleep=no_sleep)
    LogWriter.initialize(store)
    opts = WriterOptions(
        batch_size_records=rng.choice([1, 3, 8]), max_in_flight=rng.choice([1, 2, 4]),
        snapshots=SnapshotOptions(rng.choice([2, 3, 5]), rng.choice([2, 3])),
        store_retries=2, max_contention_retries=50,
    )
    session_opts = replace(opts, ship_when_idle=False) if merged else opts
    clock: Callable[[], float] = (lambda: 1_700_000_000.0) if merged else time.time
    acked: dict[int, bytes] = {}
    next_id = 0
    crashes = 0
    cursor = CursorStore(store).init("reader", 1)
    for _session in range(rng.randint(2, 4)):
        proc = ProcessStore(store)
        _arm(store, rng)
        submitted: list[tuple[bytes, Future[LogPosition]]] = []
        try:
            writer = LogWriter.open(proc, options=session_opts, clock=clock, sleep=no_sleep)
        except Crash:
            crashes += 1
            continue
        except Wal3Error:
            # The store failed more often than the retries allow (LogUnavailable): this
            # process gives up before appending anything; the next one opens the log.
            continue
        for _ in range(rng.randint(1, 6)):
            bodies = [b"%d:%d" % (seed, next_id + k) for k in range(rng.randint(1, 12))]
            next_id += len(bodies)
            try:
                submitted.extend(zip(bodies, writer.submit_many(bodies), strict=True))
                if rng.random() < 0.4:
                    writer.flush(timeout=30)
            except Wal3Error:
                break
        with contextlib.suppress(Wal3Error):
            writer.flush(timeout=30)
        writer.close()
        crashes += proc.dead
        for body, fut in submitted:
            if fut.done() and fut.exception() is None:
                acked[fut.result().offset] = body
        if rng.random() < 0.4 and acked:
            # Move the cursor (never past what was acknowledged), then collect.
            store.faults.clear()
            position = rng.randint(cursor.cursor.position, max(max(acked), 1))
            cursor = CursorStore(store).upsert("reader", position)
            gc_proc = ProcessStore(store)
            _arm(store, rng)
            try:
                GarbageCollector(gc_proc).collect()
            except Crash:
                crashes += 1
            except Wal3Error:
                pass
    # Recovery: a clean writer and collector, no manual step.
    store.faults.clear()
    check_recovered(store, opts, acked, cursor.cursor.position, f"seed {seed}")
    return len(acked), crashes


def check_recovered(store: InMemoryObjectStore, opts: WriterOptions, acked: dict[int, bytes],
                    cutoff: int, what: str) -> None:
    """A new writer and collector need no manual step; then scrub passes, offsets are
    contiguous, nothing appears twice, and every acknowledged record is in place."""
    with LogWriter.open(store, options=opts, sleep=no_sleep) as writer:
        final = writer.append(b"final").offset
    GarbageCollector(store).collect()
    seed = what
    reader = LogReader(store)
    reader.scrub()
    manifest = reader.manifest()
    records = list(reader.records())
    offsets = [r.offset for r in records]
    assert offsets == list(range(manifest.oldest_offset, final + 1)), f"{seed}: gap"
    counts = Counter(r.body for r in records)
    assert max(counts.values()) == 1, f"{seed}: a record appears twice"
    got = {r.offset: r.body for r in records}
    assert manifest.oldest_offset <= cutoff
    for offset, body in acked.items():
        if offset >= manifest.oldest_offset:
            assert got.get(offset) == body, f"{seed}: acknowledged {offset} lost"


@pytest.mark.slow
@pytest.mark.parametrize("block", range(8))
def test_crash_trials(block: int) -> None:
    """200 seeded trials (8 blocks of 25): no acknowledged record lost or duplicated,
    recovery needs no manual step, scrub passes."""
    total_acked = total_crashes = 0
    for seed in range(block * 25, block * 25 + 25):
        acked, crashes = run_trial(seed)
        total_acked += acked
        total_crashes += crashes
    assert total_crashes >= MIN_CRASHES_PER_BLOCK, "the crash points almost never fired"
    assert total_acked > 0


@pytest.mark.slow
@pytest.mark.parametrize("block", [1, 5])
def test_crash_trials_merged_batches(block: int) -> None:
    """The blocks whose crash count fell to 9 under CPU load (a late batcher merged
    records of several submits into fewer fragments, so fewer nth-call crash points were
    reached), replayed with that batching pinned: every trial recovers with nothing
    lost or duplicated, and the crash points still fire."""
    total_acked = total_crashes = 0
    for seed in range(block * 25, block * 25 + 25):
        acked, crashes = run_trial(seed, merged=True)
        total_acked += acked
        total_crashes += crashes
    assert total_crashes >= MIN_CRASHES_PER_BLOCK, "the crash points almost never fired"
    assert total_acked > 0


def _scenario(proc: ProcessStore, opts: WriterOptions, acked: dict[int, bytes]) -> None:
    """Appends that roll the manifest into snapshots, a cursor, then a collection."""
    writer = LogWriter.open(proc, options=opts, sleep=no_sleep)
    try:
        for i in range(6):
            try:
                futures = writer.submit_many([b"r%d-%d" % (i, k) for k in range(3)])
            except Wal3Error:
                break  # the writer died (its process crashed)
            with contextlib.suppress(Wal3Error):
                writer.flush()
            for k, fut in enumerate(futures):
                if fut.done() and fut.exception() is None:
                    acked[fut.result().offset] = b"r%d-%d" % (i, k)
    finally:
        writer.close()
    if proc.dead:
        return
    CursorStore(proc).upsert("reader", 7)
    GarbageCollector(proc).collect()


@pytest.mark.slow
def test_crash_at_every_store_call() -> None:
    """Crash before, and after, each store call in turn of a run that appends, rolls
    snapshots, moves a cursor and collects garbage: every one recovers."""
    opts = WriterOptions(batch_size_records=3, max_in_flight=1, store_retries=0,
                         snapshots=SnapshotOptions(2, 2))
    reference = InMemoryObjectStore("reference", sleep=no_sleep)
    LogWriter.initialize(reference)
    _scenario(ProcessStore(reference), opts, {})
    total = sum(1 for c in reference.calls if c.phase == "before")
    assert total > 40
    crashed = 0
    for step in range(1, total + 1):
        for phase in ("before", "after"):
            store = InMemoryObjectStore(f"step-{step}-{phase}", sleep=no_sleep)
            LogWriter.initialize(store)
            seen = itertools.count(1)
            target: list[tuple[str, str, int]] = []

            def hook(call: Call, step: int = step, phase: str = phase,
                     seen: Iterator[int] = seen,
                     target: list[tuple[str, str, int]] = target) -> None:
                if call.phase == "before" and next(seen) == step:
                    target.append((call.op, call.key, call.n))
                if call.phase == phase and target == [(call.op, call.key, call.n)]:
                    target.append(("", "", 0))  # fire once
                    raise Crash(f"crash {phase} store call {step}")

            store.on_step = hook
            acked: dict[int, bytes] = {}
            proc = ProcessStore(store)
            with contextlib.suppress(Crash):
                _scenario(proc, opts, acked)
            store.on_step = None
            crashed += proc.dead
            cursor = CursorStore(store).load("reader")
            check_recovered(store, opts, acked, cursor.cursor.position if cursor else 1,
                            f"crash {phase} call {step}")
    # Thread timing can merge two batches, so a run may make a call or two fewer.
    assert crashed >= 2 * total * 0.9


def test_open_during_an_outage_fails_then_the_next_open_recovers() -> None:
    """Rolling forward at open hits more transient failures than the retries allow (seed
    4769 of the trials did): open raises LogUnavailable, adopts nothing, acknowledges
    nothing; the next open adopts the orphan with no manual step."""
    store = InMemoryObjectStore("outage-at-open", sleep=no_sleep)
    LogWriter.initialize(store)
    opts = WriterOptions(store_retries=2)
    with LogWriter.open(store, options=opts, sleep=no_sleep) as writer:
        writer.append(b"a")
    data, _ = encode_fragment(2, 99, [b"orphan"])
    store.put_if_absent(fragment_path(2), data)
    store.faults.fail("put_if_match", key="manifest/*", times=3)
    with pytest.raises(LogUnavailable, match="failed 3 times"):
        LogWriter.open(store, options=opts, sleep=no_sleep)
    assert LogReader(store).manifest().next_offset == 2
    store.faults.clear()
    check_recovered(store, opts, {1: b"a"}, 1, "open after an outage")
    assert [r.body for r in LogReader(store).records()] == [b"a", b"orphan", b"final"]
