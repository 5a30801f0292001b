"""Random workloads written through the Agent into a wal3 log, with the store's states.

Several domains (one Agent each, each on its own tables of one shared MemoryStore) run
concurrent overlapping writers; every Agent ships into the same wal3 log (a lock keeps
one caller at a time, as the Sink protocol asks). At each quiescence point the store's
cells of that domain's tables are captured as tagged bytes, to compare bit for bit.
"""

from __future__ import annotations

import itertools
import random
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import Agent, MemoryStore
from agent._workload import Workload
from replay import Assembler, Snapshot
from sequencer import EpochRecord, MonotonicIds
from sinks.codec import EpochRun, EventBatch, SnapshotChunk, decode_key, records
from sinks.wal3 import Wal3Sink, WriterOptions, read_log
from tests.helpers import bits

Cell = tuple[str, Any, str]


class SharedSink:
    """Forwards to one sink under a lock, so several Agents can ship into one log."""

    def __init__(self, sink: Any) -> None:
        self.sink = sink
        self._lock = threading.Lock()

    def write_events(self, batch: EventBatch) -> None:
        with self._lock:
            self.sink.write_events(batch)

    def write_epoch(self, record: EpochRecord) -> None:
        with self._lock:
            self.sink.write_epoch(record)

    def write_epochs(self, run: EpochRun) -> None:  # runs of epoch records: EPOCHS messages
        with self._lock:
            if hasattr(self.sink, "write_epochs"):
                self.sink.write_epochs(run)
            else:  # a sink without runs (KafkaSink): each record
                for record in records(run):
                    self.sink.write_epoch(record)

    def write_snapshot(self, chunk: SnapshotChunk) -> None:
        with self._lock:
            self.sink.write_snapshot(chunk)

    def flush(self) -> None:
        with self._lock:
            self.sink.flush()

    def close(self) -> None:
        self.flush()


def ids_crossing_2_63(step_ns: int = 1_000_000) -> MonotonicIds:
    """Ids that start 20 ms before 2**63 (January 2038) and soon cross it."""
    start = ((1 << 31) * 1_000_000_000) - 20_000_000
    ticks = itertools.count()
    return MonotonicIds(boottime_ns=lambda: start + next(ticks) * step_ns,
                        realtime_ns=lambda: start)


@dataclass
class Logged:
    uri: str
    path: Path
    tables: dict[int, tuple[str, ...]]  # domain -> its tables
    at_quiescence: dict[tuple[int, int], dict[Cell, bytes]] = field(default_factory=dict)
    final: dict[Cell, bytes] = field(default_factory=dict)
    events: int = 0

    def domain_state(self, domain_id: int, state: dict[Cell, bytes]) -> dict[Cell, bytes]:
        return {c: v for c, v in state.items() if c[0] in self.tables[domain_id]}

    def python_snapshots(self, endpoint_url: str | None = None) -> list[Snapshot]:
        return list(Assembler().replay(read_log(self.uri, endpoint_url=endpoint_url)))


def write_log(path: Path, *, domains: int = 3, threads: int = 3, batches: int = 150,
              rows: int = 120, seed: int = 0,
              ids: Callable[[int], MonotonicIds | None] = lambda d: None,
              uri: str | None = None, endpoint_url: str | None = None,
              table_prefix: str = "", sink: Any = None) -> Logged:
    """Run ``domains`` Agents concurrently into a wal3 log at ``path`` (or ``uri``; or
    into ``sink``, e.g. a KafkaSink, with ``uri`` naming where it writes)."""
    uri = uri or f"file://{path}"
    if sink is None:
        sink = Wal3Sink(uri, endpoint_url=endpoint_url,
                        options=WriterOptions(batch_interval=0.002))
    shared = SharedSink(sink)
    store = MemoryStore()
    logged = Logged(uri, path, {})
    lock = threading.Lock()
    agents = []
    for d in range(domains):
        tables = (f"{table_prefix}d{d}_items", f"{table_prefix}d{d}_users")

        def capture(marker: EpochRecord, tables: tuple[str, ...] = tables) -> None:
            state = {c: v for c, v in bits(store.snapshot()).items() if c[0] in tables}
            with lock:
                logged.at_quiescence[(marker.domain_id, marker.epoch_seq)] = state

        agent = Agent(store, shared, on_quiescence=capture, ids=ids(d))
        logged.tables[agent.domain_id] = tables
        agents.append((agent, Workload(
            threads=threads, batches=batches, tables=tables,
            rows=(*range(rows), "k", "κ", ""), columns=("a", "b", "c", "d"),
            seed=seed * 100 + d)))
    runners = [threading.Thread(target=w.run, args=(a,)) for a, w in agents]
    for t in runners:
        t.start()
    for t in runners:
        t.join()
    for agent, _ in agents:
        agent.close()
        logged.events += agent.stats["events"]
    sink.close()
    logged.final = bits(store.snapshot())
    return logged


Message = EventBatch | EpochRecord | SnapshotChunk


def messages(uri: str) -> list[Message]:
    """The log's records in order, as the codec decodes them."""
    return list(read_log(uri))


def rewrite(path: Path, records: list[Message]) -> str:
    """A new wal3 log at ``path`` holding ``records`` (valid fragments, so only the
    event-level checks can tell what changed)."""
    uri = f"file://{path}"
    sink = Wal3Sink(uri, options=WriterOptions(batch_interval=0.001))
    for record in records:
        if isinstance(record, EpochRecord):
            sink.write_epoch(record)
        elif isinstance(record, SnapshotChunk):
            sink.write_snapshot(record)
        else:
            sink.write_events(record)
    sink.close()
    return uri


_ODD_VALUES: tuple[Any, ...] = (
    float("nan"), struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_0000_00A5))[0], -0.0, 0.0,
    b"\x00", "\x00", "", b"", None, True, False, (1 << 63) - 1, -(1 << 63), "κ")


@dataclass
class BaselineLogged:
    """A log whose first domain took a baseline of a pre-populated store while its
    writers ran (before, during and after); the second domain writes its own empty
    store throughout and takes none."""

    uri: str
    report: Any  # agent.BaselineReport of the first domain
    baseline_domain: int
    other_domain: int
    at_quiescence: dict[tuple[int, int], dict[Cell, bytes]] = field(default_factory=dict)
    final: dict[Cell, bytes] = field(default_factory=dict)


def _prepopulated(rng: random.Random, rows: int) -> MemoryStore:
    cells: dict[Cell, Any] = {}
    for i in range(rows):
        table = rng.choice(["t", "u"])
        row: int | str = (rng.choice([rng.randrange(-50, 400), (1 << 63) - 1 - i, -(1 << 63) + i])
                          if rng.random() < 0.7 else f"r{i}")
        for column in rng.sample(["a", "b", "c"], rng.randrange(1, 4)):
            cells[(table, row, column)] = rng.choice((*_ODD_VALUES, i, f"v{i}"))
    return MemoryStore(cells)


def _writer(agent: Agent, tables: tuple[str, ...], seed: int, stop: threading.Event) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        with agent.batch():
            for _ in range(rng.randrange(1, 5)):
                table = rng.choice(tables)
                row: int | str = (rng.randrange(-60, 420) if rng.random() < 0.7
                                  else f"r{rng.randrange(300)}")
                column = rng.choice(["a", "b", "c"])
                roll = rng.random()
                if roll < 0.15:
                    agent.delete(table, row, column)
                elif roll < 0.2:
                    agent.clear_row(table, row)
                else:
                    agent.set(table, row, column, rng.choice((*_ODD_VALUES, rng.randrange(99))))
        time.sleep(0.0005)


def write_baseline_log(path: Path, *, rows: int = 400, chunk_rows: int = 37, seed: int = 0,
                       writers: int = 2) -> BaselineLogged:
    """Pre-populated store, writers, ``Agent.snapshot()`` mid-run, more writes after."""
    rng = random.Random(seed)
    uri = f"file://{path}"
    sink = Wal3Sink(uri, options=WriterOptions(batch_interval=0.002))
    shared = SharedSink(sink)
    stores = (_prepopulated(rng, rows), MemoryStore())
    lock = threading.Lock()
    captured: dict[tuple[int, int], dict[Cell, bytes]] = {}

    def capture(store: MemoryStore) -> Callable[[EpochRecord], None]:
        def run(marker: EpochRecord) -> None:
            state = bits(store.snapshot())
            with lock:
                captured[(marker.domain_id, marker.epoch_seq)] = state
        return run

    agents = [Agent(store, shared, on_quiescence=capture(store)) for store in stores]
    stop = threading.Event()
    threads = [threading.Thread(target=_writer, args=(agents[0], ("t", "u"), seed * 10 + i,
                                                      stop)) for i in range(writers)]
    threads.append(threading.Thread(target=_writer, args=(agents[1], ("o",), seed * 10 + 9,
                                                          stop)))
    for t in threads:
        t.start()
    time.sleep(0.15)  # pre-baseline events on cells the log never saw
    report = agents[0].snapshot(chunk_rows=chunk_rows)
    time.sleep(0.15)
    stop.set()
    for t in threads:
        t.join()
    for agent in agents:
        agent.close()
    sink.close()
    final = {**bits(stores[0].snapshot()), **bits(stores[1].snapshot())}
    return BaselineLogged(uri, report, agents[0].domain_id, agents[1].domain_id, captured,
                          final)


def compose_states(rows: list[Any]) -> dict[tuple[int, int], dict[Any, bytes]]:
    """Each domain's state after each changeset point, applying ``changesets()`` rows
    in order (either style: before/after, or Delta's pre/post images)."""
    by_point: dict[tuple[int, int], list[Any]] = {}
    for row in rows:
        by_point.setdefault((row["_domain"] % (1 << 64), row["_epoch"]), []).append(row)
    states: dict[int, dict[Any, bytes]] = {}
    out = {}
    for (domain_id, epoch), found in sorted(by_point.items()):
        state = states.setdefault(domain_id, {})
        for row in found:
            cell = (row["table"], decode_key(bytes(row["row"])), row["column"])
            value = bytes(row["after"] if "after" in row else row["value"])
            kind = row["_change_type"]
            if kind in ("delete",):
                state.pop(cell, None)
            elif kind != "update_preimage":
                if value:
                    state[cell] = value
                else:
                    state.pop(cell, None)
        out[(domain_id, epoch)] = dict(state)
    return out


def check_streamed(rows: list[Any], logs: list[Logged],
                   python: dict[Any, bytes] | None = None) -> None:
    """The changeset rows a stream wrote from ``logs`` (written one after another into
    one log): no interval written twice; at every quiescence point of every domain the
    changesets written up to it give the store's state there (nothing skipped, nothing
    applied twice); the final state is the Python assembler's (or ``python``, e.g. the
    consistent Kafka consumer's final state) and the stores'."""
    keys = [(r["_domain"], r["_epoch"], r["table"], bytes(r["row"]), r["column"])
            for r in rows]
    assert len(keys) == len(set(keys)), "an interval was written twice"
    states = compose_states(rows)
    expected = {k: v for log in logs for k, v in log.at_quiescence.items()}
    tables = {k: v for log in logs for k, v in log.tables.items()}
    assert set(states) <= set(expected)
    for (domain_id, epoch), truth in expected.items():
        written = [e for d, e in states if d == domain_id and e <= epoch]
        state = states[(domain_id, max(written))] if written else {}
        assert state == {c: v for c, v in truth.items() if c[0] in tables[domain_id]}, (
            domain_id, epoch)
    if python is None:
        python = bits(list(Assembler().replay(read_log(logs[0].uri)))[-1].state)
    final: dict[Any, bytes] = {}
    for domain_id in tables:
        final.update(states[(domain_id, max(e for d, e in states if d == domain_id))])
    assert final == python == {k: v for log in logs for k, v in log.final.items()}
