"""Codec version 3: runs of epoch records (kind 0x04 EPOCHS) round trip, and readers
expand them into the records a run of EPOCH messages would have given."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sequencer import EpochRecord
from sinks._epochs_codec import build_run
from sinks.codec import (
    CodecError,
    EpochRun,
    decode,
    encode_epoch,
    encode_epochs,
    records,
)

u64 = st.integers(0, (1 << 64) - 1)
epoch_records = st.builds(
    EpochRecord, domain_id=u64, epoch_seq=u64, begin_id=u64, end_id=u64, event_count=u64,
    quiescent=st.booleans(),
    table_counts=st.dictionaries(st.text(min_size=1, max_size=6), u64, max_size=4).map(
        lambda d: tuple(sorted(d.items()))),
    setsum=st.binary(min_size=32, max_size=32).map(bytes.hex),
    stream=st.none() | st.integers(0, (1 << 32) - 1),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(epoch_records, max_size=12))
def test_a_run_round_trips_to_the_same_records(run_records: list[EpochRecord]) -> None:
    """encode_epochs then decode gives back every record, in order, field for field,
    each equal to what its own EPOCH message decodes to."""
    message = encode_epochs(EpochRun.from_records(run_records))
    assert message[:5] == b"CDC\x03\x04"
    back = records(decode(message))
    assert back == run_records
    assert back == [decode(encode_epoch(r)) for r in run_records]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(u64, u64, u64, st.booleans(), st.binary(min_size=32, max_size=32),
                          st.dictionaries(st.sampled_from("abcé"), u64, max_size=3)),
                max_size=10), u64)
def test_the_shippers_columnar_build_equals_the_record_by_record_one(
        rows: list[tuple[int, int, int, bool, bytes, dict[str, int]]], domain: int) -> None:
    """``build_run`` (the shipper's way: columns, no step per record) makes the same run
    as ``EpochRun.from_records`` over the equivalent records."""
    closed = [(k + 1, begin, end, count, quiet) for k, (begin, end, count, quiet, _, _)
              in enumerate(rows)]
    tables = [sorted(r[5].items()) for r in rows]
    offsets = np.concatenate(([0], np.cumsum([len(t) for t in tables]))).astype(np.int64)
    run = build_run(domain, list(zip(*closed, strict=True)) if closed else [()] * 5,
                    b"".join(r[4] for r in rows), offsets,
                    pa.array([n for t in tables for n, _ in t], pa.utf8()),
                    np.array([c for t in tables for _, c in t], dtype=np.uint64))
    expected = [EpochRecord(domain, seq, begin, end, count, quiet, tuple(t), digest.hex())
                for (seq, begin, end, count, quiet), t, digest
                in zip(closed, tables, [r[4] for r in rows], strict=True)]
    assert run.records() == expected
    assert run.data.equals(EpochRun.from_records(expected).data)


def test_epoch_runs_need_version_3() -> None:
    """Kind 0x04 did not exist before version 3: an older header with it is refused."""
    good = encode_epochs(EpochRun.from_records([EpochRecord(1, 2, 3, 4, 5, True)]))
    with pytest.raises(CodecError, match="unknown message kind"):
        decode(b"CDC\x02" + good[4:])


def test_a_run_with_a_null_is_refused() -> None:
    """Arrow's reader lets a null through a non-nullable column: decode refuses it."""
    fields = EpochRun.from_records([EpochRecord(1, 2, 3, 4, 5, True)]).data
    columns = fields.columns
    columns[5] = pa.array([None], pa.bool_())
    bad = pa.RecordBatch.from_arrays(columns, schema=fields.schema)
    with pytest.raises(CodecError, match="holds nulls"):
        decode(encode_epochs(EpochRun(bad)))


def test_an_agent_ships_runs_to_wal3_and_the_log_replays_every_quiescent_state() -> None:
    """Agent -> Wal3Sink: epoch records leave in runs (EPOCHS messages of several
    records), read_log expands them, and the Assembler rebuilds every quiescent state
    the store had, bit for bit."""
    import uuid

    from agent import Agent, MemoryStore
    from agent._workload import Workload
    from replay import Assembler
    from sinks.wal3 import LogReader, Wal3Sink, read_log
    from tests.helpers import bits

    uri = f"memory://runs-{uuid.uuid4().hex}"
    store = MemoryStore()
    truth: dict[int, dict[object, bytes]] = {}
    agent = Agent(store, Wal3Sink(uri), on_quiescence=lambda m: truth.__setitem__(
        m.epoch_seq, bits(store.snapshot())))
    for seed in range(4):  # flushes between rounds: several shipments, several runs
        Workload(threads=3, batches=40, seed=seed).run(agent)
        agent.flush()
    agent.close()
    reader = LogReader(uri)
    bodies = [r.body for f in reader.scan() for r in reader.fetch(f)]
    runs = [decode(b) for b in bodies if b[3:5] == b"\x03\x04"]
    assert len(runs) >= 4 and max(len(r) for r in runs) > 2  # type: ignore[arg-type]
    assert not any(b[4] == 0x02 for b in bodies)  # no single EPOCH messages
    snapshots = list(Assembler().replay(read_log(uri)))
    assert len(snapshots) == len(truth) > 20
    for snap in snapshots:
        assert bits(snap.state) == truth[snap.epoch_seq]
