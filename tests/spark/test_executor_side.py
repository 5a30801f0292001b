"""The driver's epoch checks and the executors' decoding, without a SparkSession."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from replay import InconsistentLog
from replay.spark._decode import FRAGMENTS, KIND_EVENT, KIND_SEGMENT, event_rows, metadata_rows
from replay.spark._epochs import UnsupportedRecord, build_epoch_table, decode_metadata
from sequencer import EpochRecord
from sinks._setsum import Setsum
from sinks.wal3 import LogReader
from tests.spark._logs import ids_crossing_2_63, write_log


def _epoch(seq: int, begin: int, end: int, quiescent: bool = True, domain: int = 7
           ) -> EpochRecord:
    return EpochRecord(domain_id=domain, epoch_seq=seq, begin_id=begin, end_id=end,
                       event_count=0, quiescent=quiescent, table_counts=(),
                       setsum=Setsum().hexdigest(), stream=None)


def test_epochs_tile_from_zero_and_number_intervals() -> None:
    """Duplicates dropped; intervals end at quiescent epochs; the tail has none."""
    records = [_epoch(1, 0, 10, False), _epoch(2, 10, 20), _epoch(2, 10, 20),
               _epoch(3, 20, 1 << 63 | 5), _epoch(4, 1 << 63 | 5, 1 << 63 | 9, False)]
    table = build_epoch_table(records)
    index = table.index().domains[7]
    assert index.q.tolist() == [2, 2, 3, -1]
    epoch, q = index.locate(np.array([0, 9, 10, 1 << 63, 1 << 63 | 6, 1 << 63 | 9],
                                     dtype=np.uint64))
    assert epoch.tolist() == [1, 1, 2, 3, 4, -1]
    assert q.tolist() == [2, 2, 2, 3, -1, -1]
    assert str(table.position(7, 3)) == f"7:3:{1 << 63 | 5:x}"


@pytest.mark.parametrize(("records", "match"), [
    ([_epoch(1, 0, 10), _epoch(2, 11, 20)], "tile"),
    ([_epoch(1, 0, 10), _epoch(3, 20, 30)], "epoch 2 never arrived"),
    ([_epoch(1, 0, 10), _epoch(1, 0, 11)], "two different records"),
])
def test_epoch_faults_are_refused(records: list[EpochRecord], match: str) -> None:
    """A gap in the id space, a missing epoch, two versions of one: InconsistentLog."""
    with pytest.raises(InconsistentLog, match=match):
        build_epoch_table(records)


def test_a_missing_epoch_in_the_tail_is_only_the_tail() -> None:
    """No quiescence point after the gap: the log's tail, not an error."""
    table = build_epoch_table([_epoch(1, 0, 10), _epoch(3, 20, 30, False)])
    assert [r.epoch_seq for r in table.epochs[7]] == [1]


def test_unknown_record_kinds_are_refused() -> None:
    """Bytes that are no record this reader knows: UnsupportedRecord naming the offset."""
    with pytest.raises(UnsupportedRecord, match="offset 9"):
        decode_metadata([(9, b"CDC\x01\x7f", None)])


def test_executor_functions_place_every_event(tmp_path: Path) -> None:
    """Pass 1 finds the epochs, pass 2 places every event and segment (ids past 2**63)."""
    logged = write_log(tmp_path / "log", domains=1, threads=2, batches=30, rows=10,
                       ids=lambda d: ids_crossing_2_63())
    reader = LogReader(logged.uri)
    frags = pa.RecordBatch.from_arrays(
        [pa.array([json.dumps(json.loads(f.to_json())) for f in reader.scan()])],
        schema=FRAGMENTS)
    meta = pa.Table.from_batches(list(metadata_rows(logged.uri, "", None)([frags])))
    records, chunks = decode_metadata(zip(meta.column("offset").to_pylist(),
                                          meta.column("body").to_pylist(),
                                          meta.column("chunk").to_pylist(), strict=True))
    assert not chunks
    table = build_epoch_table(records)
    rows = pa.Table.from_batches(list(event_rows(logged.uri, "", None, table.index())([frags])))
    kinds = rows.column("kind").to_pylist()
    events = kinds.count(KIND_EVENT)
    assert events == logged.events
    assert kinds.count(KIND_SEGMENT) > 0
    epochs = rows.column("epoch").to_pylist()
    assert None not in epochs  # the agent closed: every event is in a verified interval
    batch = rows.column("batch").to_numpy(zero_copy_only=False).view(np.uint64)
    assert batch.min() < 1 << 63 <= batch.max()
