"""What the shipper hands the sink for closed epochs: a shipment's lone epoch record as
itself (``Sink.write_epoch``), several as one run (``Sink.write_epochs``); either way
the records a reader verifies the log with."""

from __future__ import annotations

import contextvars
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent import Agent, MemoryStore
from agent._shipper import epoch_records
from replay import Assembler
from sequencer import EpochClosed, EpochRecord
from sinks import SinkBackpressure
from sinks.codec import EpochRun, EventBatch, encode_value


class _CallsSink:
    """Keeps every record in log order, and which call brought each epoch record."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.lone: list[EpochRecord] = []
        self.runs = 0

    def write_events(self, batch: EventBatch) -> None:
        self.items.append(batch)

    def write_epoch(self, record: EpochRecord) -> None:
        self.lone.append(record)
        self.items.append(record)

    def write_epochs(self, run: EpochRun) -> None:
        self.runs += 1
        self.items.append(run)

    def flush(self) -> None: ...

    def close(self) -> None: ...


class _RecordsSink(_CallsSink):
    """A sink of epoch records one by one (no ``write_epochs``: Kafka's kind)."""

    write_epochs = None  # type: ignore[assignment]


class _ShipmentsSink(_CallsSink):
    """A sink taking a shipment's records in one call (``write_shipment``: wal3's
    kind); the first ``refusals`` calls refuse everything, as a sink that is behind."""

    def __init__(self, refusals: int = 0) -> None:
        super().__init__()
        self.shipments: list[list[Any]] = []
        self.refusals = refusals

    def write_shipment(self, records: list[Any]) -> None:
        if self.refusals:
            self.refusals -= 1
            raise SinkBackpressure("behind: nothing taken")
        self.shipments.append(list(records))
        for record in records:
            if isinstance(record, EpochRecord):
                self.lone.append(record)
            self.runs += isinstance(record, EpochRun)
            self.items.append(record)


# One step: which of two batch scopes acts (0 or 1), and what it does.
steps = st.lists(st.tuples(st.integers(0, 1), st.sampled_from(["set", "flip", "flush"]),
                           st.sampled_from(["t", "u", "v"]), st.integers(0, 5)),
                 min_size=1, max_size=40)


@pytest.mark.parametrize("sink_type", [_CallsSink, _RecordsSink, _ShipmentsSink],
                         ids=["runs", "records", "shipments"])
@settings(max_examples=40, deadline=None)
@given(steps)
def test_lone_epoch_records_are_the_records_a_run_would_hold(
        sink_type: type[_CallsSink], plan: list[tuple[int, str, str, int]]) -> None:
    """Two batch scopes in one thread open, write and close in turn (``flip``), with
    flushes between: a close that ends one epoch while the other scope's batch is open
    ships that epoch's record alone. Every lone record is what a run holding it gives
    back, and the log replays to the store's state (counts, per-table counts and
    setsums verified)."""
    store = MemoryStore()
    sink = sink_type()
    agent = Agent(store, sink)
    scopes = [contextvars.copy_context(), contextvars.copy_context()]
    open_batches: list[Any] = [None, None]
    # An automatic batch while no other is open: its event and its two epochs close
    # together, a shipment of more than one record.
    unscoped = False
    for who, action, table, row in plan:
        scope = scopes[who]
        if action == "flush":
            agent.flush()
        elif action == "flip" and open_batches[who] is not None:
            scope.run(open_batches[who].__exit__, None, None, None)
            open_batches[who] = None
        elif action == "flip":
            open_batches[who] = agent.batch()
            scope.run(open_batches[who].__enter__)
        else:
            unscoped |= open_batches == [None, None]
            scope.run(agent.set, table, row, "c", len(sink.items))
    for who in (0, 1):
        if open_batches[who] is not None:
            scopes[who].run(open_batches[who].__exit__, None, None, None)
    agent.close()
    for record in sink.lone:
        assert EpochRun.from_records([record]).records() == [record]
    if sink_type is _RecordsSink:
        assert sink.runs == 0
    if sink_type is _ShipmentsSink and unscoped:
        assert sink.shipments  # type: ignore[attr-defined]
    snapshots = list(Assembler().replay(sink.items))
    final = snapshots[-1].state if snapshots else {}
    assert ({cell: encode_value(v) for cell, v in final.items()}
            == {cell: encode_value(v) for cell, v in store.snapshot().items()})


def test_a_close_while_another_batch_is_open_ships_its_record_alone() -> None:
    """The pattern above, fixed: each first close ends one epoch (shipped alone), each
    second one its epoch and the quiescence marker (a run of two)."""
    sink = _CallsSink()
    agent = Agent(MemoryStore(), sink)
    first, second = contextvars.copy_context(), contextvars.copy_context()
    for k in range(5):
        a, b = agent.batch(), agent.batch()
        first.run(a.__enter__)
        first.run(agent.set, "t", k, "c", k)
        second.run(b.__enter__)
        second.run(agent.set, "u", k, "c", k)
        first.run(a.__exit__, None, None, None)
        agent.flush()
        second.run(b.__exit__, None, None, None)
        agent.flush()
    agent.close()
    assert len(sink.lone) == 5 and sink.runs == 5
    assert [r.table_counts for r in sink.lone] == [(("t", 1),)] * 5
    assert not any(r.quiescent for r in sink.lone)
    assert len(list(Assembler().replay(sink.items))) == 5


def test_a_shipment_goes_to_the_sink_in_one_call_retried_whole() -> None:
    """A sink with ``write_shipment`` gets each shipment's events and epoch records in
    one call, events first; one that refuses (backpressure) gets the same call again,
    so every record arrives once and the log replays to the store's state."""
    store = MemoryStore()
    sink = _ShipmentsSink(refusals=2)
    agent = Agent(store, sink)
    for k in range(5):
        with agent.batch():
            agent.set("t", k, "c", k)
            agent.set("u", k, "c", -k)
        agent.flush()
    agent.close()
    assert [[type(r) for r in shipment] for shipment in sink.shipments] == [
        [EventBatch, EpochRun]] * 5  # a batch's close ends its epoch and a marker
    assert sum(len(r) for r in sink.items if isinstance(r, EventBatch)) == 10
    final = list(Assembler().replay(sink.items))[-1].state
    assert ({cell: encode_value(v) for cell, v in final.items()}
            == {cell: encode_value(v) for cell, v in store.snapshot().items()})


u64 = st.integers(0, 2**64 - 1)
closes = st.lists(st.tuples(st.builds(EpochClosed, u64, u64, u64, u64, st.booleans()),
                            st.binary(min_size=32, max_size=32),
                            st.lists(st.tuples(st.sampled_from(["t", "u", "é"]), u64),
                                     max_size=3)),
                  min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(closes, st.integers(0, 2**64 - 1))
def test_epoch_records_are_a_runs_records(
        closed: list[tuple[EpochClosed, bytes, list[tuple[str, int]]]], domain_id: int) -> None:
    """Built straight from the shipper's columns, the records a run of the same columns
    holds: fields, setsum text and per-table counts in order."""
    epochs = [c for c, _, _ in closed]
    digests = b"".join(d for _, d, _ in closed)
    tables = [t for _, _, ts in closed for t in ts]
    offsets = np.cumsum([0, *(len(ts) for _, _, ts in closed)]).astype(np.int64)
    names = pa.array([name for name, _ in tables], pa.utf8())
    counts = np.array([n for _, n in tables], dtype=np.uint64)
    columns = [[getattr(e, f) for e in epochs] for f in EpochClosed._fields]
    run = EpochRun.from_columns(domain_id, columns, digests, offsets, names, counts)
    assert epoch_records(domain_id, epochs, digests, offsets, names, counts) == run.records()
