"""Random workloads written through the Agent into a wal3 log, with the store's states.

Several domains (one Agent each, each on its own tables of one shared MemoryStore) run
concurrent overlapping writers; every Agent ships into the same wal3 log (a lock keeps
one caller at a time, as the Sink protocol asks). At each quiescence point the store's
cells of that domain's tables are captured as tagged bytes, to compare bit for bit.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import Agent, MemoryStore
from agent._workload import Workload
from replay import Assembler, Snapshot
from sequencer import EpochRecord, MonotonicIds
from sinks.codec import EpochRun, EventBatch
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
            self.sink.write_epochs(run)

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
              uri: str | None = None, endpoint_url: str | None = None) -> Logged:
    """Run ``domains`` Agents concurrently into a wal3 log at ``path`` (or ``uri``)."""
    uri = uri or f"file://{path}"
    sink = Wal3Sink(uri, endpoint_url=endpoint_url,
                    options=WriterOptions(batch_interval=0.002))
    shared = SharedSink(sink)
    store = MemoryStore()
    logged = Logged(uri, path, {})
    lock = threading.Lock()
    agents = []
    for d in range(domains):
        tables = (f"d{d}_items", f"d{d}_users")

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


Message = EventBatch | EpochRecord


def messages(uri: str) -> list[Message]:
    """The log's records in order, as the codec decodes them."""
    return [r for r in read_log(uri) if isinstance(r, EventBatch | EpochRecord)]


def rewrite(path: Path, records: list[Message]) -> str:
    """A new wal3 log at ``path`` holding ``records`` (valid fragments, so only the
    event-level checks can tell what changed)."""
    uri = f"file://{path}"
    sink = Wal3Sink(uri, options=WriterOptions(batch_interval=0.001))
    for record in records:
        if isinstance(record, EpochRecord):
            sink.write_epoch(record)
        else:
            sink.write_events(record)
    sink.close()
    return uri
