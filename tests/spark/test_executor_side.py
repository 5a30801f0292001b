"""The driver's epoch checks and the executors' decoding, without a SparkSession."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay import InconsistentLog
from replay.spark._cells import (
    CELL_INPUT,
    CELL_ROWS,
    KIND_CELL,
    KIND_COUNT,
    KIND_RESET,
    walk_cells,
)
from replay.spark._decode import FRAGMENTS, KIND_EVENT, KIND_SEGMENT, event_rows
from replay.spark._epoch_rows import EPOCH_FIELDS, METADATA_ROWS, metadata_batch, metadata_rows
from replay.spark._epochs import EpochColumns, EpochTable, UnsupportedRecord, read_metadata
from replay.spark._epochs import build_epoch_table as build_from_columns
from sequencer import EpochRecord
from sinks._setsum import Setsum
from sinks.wal3 import LogReader
from tests.spark._logs import ids_crossing_2_63, write_log


def _epoch(seq: int, begin: int, end: int, quiescent: bool = True, domain: int = 7
           ) -> EpochRecord:
    return EpochRecord(domain_id=domain, epoch_seq=seq, begin_id=begin, end_id=end,
                       event_count=0, quiescent=quiescent, table_counts=(),
                       setsum=Setsum().hexdigest(), stream=None)


def build_epoch_table(records: list[EpochRecord]) -> EpochTable:
    return build_from_columns(EpochColumns.from_records(records))


def collected(batches: list[pa.RecordBatch]) -> pa.Table:
    """Pass 1's rows as the driver collects them, with a fingerprint per record (Spark
    computes it with xxhash64; any hash of the record's fields does here)."""
    table = pa.Table.from_batches(batches, schema=METADATA_ROWS)
    prints = [hash(tuple(json.dumps(row[f], default=bytes.hex) for f in EPOCH_FIELDS))
              for row in table.to_pylist()]
    return table.append_column("fingerprint", pa.array(prints, pa.int64()))


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
    assert table.epochs[7].seqs.tolist() == [1]


def test_unknown_record_kinds_are_refused() -> None:
    """Bytes that are no record this reader knows: UnsupportedRecord naming the offset."""
    rows = collected(metadata_batch([(9, b"CDC\x01\x7f")]))
    with pytest.raises(UnsupportedRecord, match="offset 9"):
        read_metadata(rows, lambda d, e: "")


def test_executor_functions_place_every_event(tmp_path: Path) -> None:
    """Pass 1 finds the epochs, pass 2 places every event and segment (ids past 2**63)."""
    logged = write_log(tmp_path / "log", domains=1, threads=2, batches=30, rows=10,
                       ids=lambda d: ids_crossing_2_63())
    reader = LogReader(logged.uri)
    frags = pa.RecordBatch.from_arrays(
        [pa.array([json.dumps(json.loads(f.to_json())) for f in reader.scan()])],
        schema=FRAGMENTS)
    meta = collected(list(metadata_rows(logged.uri, "", None)([frags])))
    columns, chunks = read_metadata(meta, lambda d, e: "")
    assert not chunks
    table = build_from_columns(columns)
    rows = pa.Table.from_batches(list(event_rows(logged.uri, "", None, table.index())([frags])))
    kinds = rows.column("kind").to_pylist()
    events = kinds.count(KIND_EVENT)
    assert events == logged.events
    assert kinds.count(KIND_SEGMENT) > 0
    epochs = rows.column("epoch").to_pylist()
    assert None not in epochs  # the agent closed: every event is in a verified interval
    batch = rows.column("batch").to_numpy(zero_copy_only=False).view(np.uint64)
    assert batch.min() < 1 << 63 <= batch.max()


# -- the cell walk (``_cells.walk_cells``), fed as Spark feeds it: sorted, in batches --

def _walk(rows: list[tuple[object, ...]], size: int) -> pa.Table:
    """Run the walk over ``rows`` (``CELL_INPUT`` order, sorted) in batches of ``size``."""
    table = pa.table({name: pa.array([r[i] for r in rows], _INPUT_TYPES[name])
                      for i, name in enumerate(CELL_INPUT)})
    return pa.Table.from_batches(list(walk_cells(table.to_batches(max_chunksize=size))),
                                 schema=CELL_ROWS)


_INPUT_TYPES = {"kind": pa.string(), "domain": pa.int64(), "q": pa.int64(),
                "epoch": pa.int64(), "table": pa.string(), "row": pa.binary(),
                "column": pa.string(), "batch": pa.int64(), "seq": pa.int64(),
                "old": pa.binary(), "new": pa.binary(), "reset": pa.binary(),
                "fq": pa.int64()}


def _event(cell: tuple[str, bytes, str], q: int, batch: int, seq: int, old: bytes,
           new: bytes, domain: int = 7, epoch: int | None = None) -> tuple[object, ...]:
    return (KIND_EVENT, domain, q, q if epoch is None else epoch, *cell, batch, seq, old,
            new, None, None)


def _cells_out(out: pa.Table) -> list[dict[str, object]]:
    return [r for r in out.to_pylist() if r["kind"] == KIND_CELL]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.lists(st.sampled_from([b"", b"\x02a", b"\x02b", b"\x03\x00",
                                                   b"\x03\x80"]), min_size=1, max_size=4),
                         min_size=1, max_size=5), min_size=1, max_size=4),
       st.integers(1, 7), st.integers(0, 3))
def test_the_cell_walk_follows_each_chain_whatever_the_batches(
        histories: list[list[list[bytes]]], size: int, dup: int) -> None:
    """Valid chains (with duplicated deliveries) pass unchanged; the state after each
    interval is its last value; counts are per distinct event; batching changes nothing."""
    rows: list[tuple[object, ...]] = []
    expected: list[tuple[tuple[str, bytes, str], int, bytes | None, bool]] = []
    batch = 0
    for c, intervals in enumerate(histories):
        cell = ("t", b"\x02" + bytes([c]), "x")
        held = b""
        for q, values in enumerate(intervals, start=1):
            start = held
            for seq, value in enumerate(values):
                event = _event(cell, q, batch, seq, held, value)
                rows.extend([event] * (2 if seq == dup else 1))
                held = value
            batch += 1
            final = held if held != start else None
            if held == start and all(v == start for v in values):
                final = None
            expected.append((cell, q, final, final is not None))
    whole = _walk(rows, len(rows))
    assert whole.equals(_walk(rows, size))
    got = [((r["table"], r["row"], r["column"]), r["q"], r["after"], r["changed"])
           for r in _cells_out(whole)]
    assert [r["why"] for r in _cells_out(whole)] == [None] * len(expected)
    assert got == expected
    counts = {(r["epoch"], r["table"]): r["events"] for r in whole.to_pylist()
              if r["kind"] == KIND_COUNT}
    per_q: dict[int, int] = {}
    for intervals in histories:
        for q, values in enumerate(intervals, start=1):
            per_q[q] = per_q.get(q, 0) + len(values)
    assert counts == {(q, "t"): n for q, n in per_q.items()}


CELL_A = ("t", b"\x02a", "x")


@pytest.mark.parametrize(("rows", "why"), [
    ([_event(CELL_A, 1, 0, 0, b"", b"\x02v"), _event(CELL_A, 2, 1, 0, b"\x02w", b"\x02z")],
     "did not replace"),
    ([_event(CELL_A, 1, 0, 0, b"", b"\x02v"), _event(CELL_A, 1, 0, 1, b"\x02w", b"\x02z")],
     "do not chain"),
    ([_event(CELL_A, 1, 0, 0, b"", b"\x02v"), _event(CELL_A, 2, 1, 0, b"\x02w", b"\x02w")],
     "never replaced"),
    ([_event(CELL_A, 1, 0, 0, b"", b"\x02v"),
      _event(CELL_A, 2, 1, 0, b"\x02v", b"\x02w", domain=8)], "two domains"),
])
def test_the_cell_walk_names_what_breaks(rows: list[tuple[object, ...]], why: str) -> None:
    """A broken chain, in one event or several, a rewrite of a value never held, a cell
    of two domains: ``why`` says so at that interval."""
    found = [r["why"] for r in _cells_out(_walk(rows, 1)) if r["why"]]
    assert found and why in found[0]


def test_a_reset_replaces_the_value_and_forgives_up_to_its_point() -> None:
    """A baseline chunk's row sets the value at its point; events up to ``fq`` are
    forgiven; an interval of the reset alone is named by its point."""
    rows = [_event(CELL_A, 1, 0, 0, b"\x02old", b"\x02v"),
            (KIND_RESET, 7, 2, None, *CELL_A, None, None, None, None, b"\x02base", 2),
            _event(CELL_A, 3, 1, 0, b"\x02base", b"\x02w")]
    out = _cells_out(_walk(rows, 2))
    assert [(r["q"], r["epoch"], r["after"], r["forgiven"]) for r in out] == [
        (1, 1, b"\x02v", True), (2, 2, b"\x02base", True), (3, 3, b"\x02w", False)]
    assert out[0]["why"] is not None and out[2]["why"] is None


def test_the_cell_walk_refuses_rows_out_of_order() -> None:
    """Unsorted input (a plan that lost its sort) fails rather than check half a cell."""
    b = ("t", b"\x02b", "x")
    with pytest.raises(RuntimeError, match="sorted"):
        _walk([_event(b, 1, 0, 0, b"", b"\x02v"), _event(CELL_A, 1, 1, 0, b"", b"\x02v")], 5)
    with pytest.raises(RuntimeError, match="sorted"):
        _walk([_event(CELL_A, 2, 1, 0, b"", b"\x02v"), _event(CELL_A, 1, 0, 0, b"", b"\x02v")],
              5)
