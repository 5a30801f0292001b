"""The wal3 sink under the agent: Agent -> wal3 (local fs, S3) -> Assembler."""

from __future__ import annotations

import itertools
import threading
from pathlib import Path
from typing import Any

import pytest

from agent import Agent, MemoryStore
from agent._workload import Workload
from replay import Assembler
from sequencer import ChangeEvent, EpochRecord
from sinks import Sink, SinkBackpressure
from sinks.codec import EventBatch, decode, encode_value, records
from sinks.objstore import LocalStore
from sinks.testing import check_sink, synthetic_log
from sinks.wal3 import (
    CursorStore,
    LogReader,
    Wal3Sink,
    WriterOptions,
    open_log_sink,
    read_log,
)


def _bits(state: dict[Any, Any]) -> dict[Any, bytes]:
    return {cell: encode_value(value) for cell, value in state.items()}


def read_back(sink: Any) -> list[EventBatch | EpochRecord]:
    return list(read_log(sink.writer.store.store, prefix=sink.writer.store.prefix))


def run_agent(sink: Sink, threads: int = 4, batches: int = 150) -> dict[Any, dict[Any, bytes]]:
    store = MemoryStore()
    seen: dict[Any, dict[Any, bytes]] = {}
    agent = Agent(store, sink, on_quiescence=lambda m: seen.__setitem__(
        (m.domain_id, m.epoch_seq), _bits(store.snapshot())))
    for seed in range(3):  # flushed in between: the log has several fragments
        Workload(threads=threads, batches=batches // 3, seed=seed).run(agent)
        agent.flush()
    agent.close()
    seen["final"] = _bits(store.snapshot())
    return seen


def assert_replays(records: list[Any], seen: dict[Any, dict[Any, bytes]]) -> None:
    snapshots = list(Assembler().replay(records))
    assert len(snapshots) == len(seen) - 1 > 0
    for snap in snapshots:
        assert _bits(snap.state) == seen[(snap.domain_id, snap.epoch_seq)]
    assert _bits(snapshots[-1].state) == seen["final"]


def test_conformance_local_filesystem(tmp_path: Path) -> None:
    """The shared sink conformance suite, on a local-filesystem log."""
    counter = itertools.count()
    check_sink(lambda: Wal3Sink(LocalStore(tmp_path / f"log{next(counter)}")), read_back)


@pytest.mark.s3
def test_conformance_s3(s3_endpoint: str, s3_bucket: str) -> None:
    """The shared sink conformance suite, on S3 (moto)."""
    counter = itertools.count()
    check_sink(lambda: open_log_sink(f"s3://{s3_bucket}/log{next(counter)}",
                                     endpoint_url=s3_endpoint), read_back,
               threads=2, batches=40)


def test_agent_to_wal3_to_assembler_local(tmp_path: Path) -> None:
    """Every quiescent snapshot replayed from the log equals the store's, bit for bit;
    the log scrubs clean and each agent shipment is one wal3 record."""
    sink = open_log_sink(f"file://{tmp_path / 'log'}")
    seen = run_agent(sink)
    records = list(read_log(f"file://{tmp_path / 'log'}"))
    reader = LogReader(LocalStore(tmp_path / "log"))
    assert sum(len(reader.fetch(f)) for f in reader.scan()) == sink.records
    assert len(records) > sink.records  # EPOCHS records expand into several each
    assert_replays(records, seen)
    LogReader(LocalStore(tmp_path / "log")).scrub()


@pytest.mark.s3
def test_agent_to_wal3_to_assembler_s3(s3_endpoint: str, s3_bucket: str) -> None:
    """The same through S3."""
    uri = f"s3://{s3_bucket}/agent"
    seen = run_agent(open_log_sink(uri, endpoint_url=s3_endpoint), threads=2, batches=60)
    assert_replays(list(read_log(uri, endpoint_url=s3_endpoint)), seen)


def test_a_flushed_shipment_is_one_fragment(tmp_path: Path) -> None:
    """An agent that flushes after each write leaves one fragment per flush: a
    shipment's events and epoch records go to the writer together (one object write
    and one manifest commit, where a call each made two fragments)."""
    store = MemoryStore()
    agent = Agent(store, Wal3Sink(LocalStore(tmp_path / "log")))
    for k in range(6):
        agent.set("t", k, "c", k)
        agent.flush()
    agent.close()
    assert len(LogReader(LocalStore(tmp_path / "log")).scan()) == 6
    final = list(Assembler().replay(read_log(f"file://{tmp_path / 'log'}")))[-1].state
    assert _bits(final) == _bits(store.snapshot())


def test_a_shipment_refused_for_backpressure_queues_none_of_its_records(
        tmp_path: Path) -> None:
    """With the writer's queue near its bound (its fragment held up by the store), a
    shipment that would pass it is refused at once with ``SinkBackpressure`` and none
    of its records is queued, though the first would fit: the shipper's retry cannot
    write one twice. Once the store answers, the log holds exactly what was taken."""
    gate = threading.Event()

    class HeldStore(LocalStore):
        def put_if_absent(self, key: str, data: bytes) -> str:
            if "FragmentSeqNo" in key:
                gate.wait(30)
            return super().put_if_absent(key, data)

    written = synthetic_log(writers=1, batches=2)
    assert len(written) >= 4
    sink = Wal3Sink(HeldStore(tmp_path / "log"),
                    options=WriterOptions(max_pending_records=3, backpressure_timeout=0))
    sink.write_shipment(written[:2])
    with pytest.raises(SinkBackpressure):
        sink.write_shipment(written[2:4])
    assert sink.records == 2
    gate.set()
    sink.close()
    got = [r for item in read_log(f"file://{tmp_path / 'log'}") for r in records(item)]
    assert got == [r for item in written[:2] for r in records(item)]


def test_read_log_resumes_from_a_cursor(tmp_path: Path) -> None:
    """A consumer that stops midway and resumes from its cursor sees every record (at
    most one fragment again), and the replay is still exact."""
    uri = f"file://{tmp_path / 'log'}"
    seen = run_agent(open_log_sink(uri), threads=3, batches=80)
    everything = list(read_log(uri))
    reader = LogReader(uri)
    fragments = reader.scan(1)
    assert len(fragments) >= 3
    # What the first fragment decodes to (an EPOCHS record gives several records).
    in_first = sum(len(records(decode(r.body))) for r in reader.fetch(fragments[0]))
    first: list[Any] = []
    for record in read_log(uri, "consumer"):
        first.append(record)
        if len(first) == in_first + 1:  # one record into the second fragment
            break
    position = CursorStore(uri).require("consumer").cursor.position
    assert position == fragments[0].limit
    rest = list(read_log(uri, "consumer"))
    assert first[:in_first] + rest == everything
    assert CursorStore(uri).require("consumer").cursor.position == fragments[-1].limit
    assert list(read_log(uri, "consumer")) == []
    assert_replays(first + rest, seen)
    events = [r for r in everything if isinstance(r, (EventBatch, ChangeEvent))]
    assert events


def test_a_run_of_one_epoch_record_is_written_as_an_epoch_message(tmp_path: Path) -> None:
    """Runs of one record become EPOCH messages (small, fast to read), longer runs stay
    EPOCHS; reading the log gives the records the runs held, in order."""
    from sinks.codec import KIND_EPOCH, KIND_EPOCHS, EpochRun

    records_in = [EpochRecord(7, seq, seq * 10, seq * 10 + 10, 1, seq % 2 == 0,
                              (("t", 1),), f"{seq:064x}", None if seq < 3 else 2)
                  for seq in range(1, 5)]
    sink = Wal3Sink(LocalStore(tmp_path / "log"))
    sink.write_epochs(EpochRun.from_records(records_in[:1]))
    sink.write_epochs(EpochRun.from_records(records_in[1:3]))
    sink.write_epochs(EpochRun.from_records(records_in[3:]))
    sink.close()
    bodies = [r.body for r in LogReader(LocalStore(tmp_path / "log")).records()]
    assert [body[4] for body in bodies] == [KIND_EPOCH, KIND_EPOCHS, KIND_EPOCH]
    got = [r for item in read_log(f"file://{tmp_path / 'log'}") for r in records(item)]
    assert got == records_in
