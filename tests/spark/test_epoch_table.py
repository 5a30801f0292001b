"""Epoch records as columns: pass 1's rows and the driver's checks, without Spark.

The driver used to decode every epoch record into a Python object and check tiling
record by record; it now checks numpy columns. ``_reference_table`` is that
record-by-record algorithm, kept here as the reference the columns must agree with.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay import InconsistentLog
from replay._position import Position
from replay.spark._baselines import ChunkHeader
from replay.spark._decode import DomainEpochs, EpochIndex
from replay.spark._epoch_rows import (
    EPOCH_FIELDS,
    METADATA_ROWS,
    metadata_batch,
    place_epochs,
    record_rows,
    rows_to_records,
)
from replay.spark._epochs import EpochColumns, build_epoch_table, read_metadata
from sequencer import EpochRecord
from sinks.codec import (
    CodecError,
    EpochRun,
    SnapshotChunk,
    encode_epoch,
    encode_epochs,
    encode_snapshot,
)

_HIGH = 1 << 63


def _reference_table(records: list[EpochRecord], starts: Mapping[int, Position],
                     retained: Mapping[int, list[Position]]
                     ) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """Each domain's verified epoch seqs and quiescence points, record by record."""
    by_domain: dict[int, dict[int, EpochRecord]] = {d: {} for d in starts}
    for r in records:
        start = starts.get(r.domain_id)
        if start is not None and r.epoch_seq <= start.epoch_seq:
            continue
        held = by_domain.setdefault(r.domain_id, {})
        known = held.get(r.epoch_seq)
        if known is not None and known != r:
            raise InconsistentLog("two different records for one epoch",
                                  domain_id=r.domain_id, epoch_seq=r.epoch_seq)
        held[r.epoch_seq] = r
    epochs, points = {}, {}
    for domain_id, held in sorted(by_domain.items()):
        start = starts.get(domain_id)
        base = 0 if start is None else start.epoch_seq
        begin = 0 if start is None else start.end_id
        prefix: list[EpochRecord] = []
        while (following := held.get(base + len(prefix) + 1)) is not None:
            if following.begin_id != begin:
                raise InconsistentLog("epochs must tile the id space", domain_id=domain_id,
                                      epoch_seq=following.epoch_seq)
            prefix.append(following)
            begin = following.end_id
        beyond = [r.epoch_seq for r in held.values()
                  if r.epoch_seq > base + len(prefix) and r.quiescent]
        if beyond:
            raise InconsistentLog("never arrived", domain_id=domain_id,
                                  epoch_seq=base + len(prefix) + 1)
        epochs[domain_id] = [r.epoch_seq for r in prefix]
        points[domain_id] = [*(p.epoch_seq for p in retained.get(domain_id, [])),
                             *(r.epoch_seq for r in prefix if r.quiescent)]
    return epochs, points


@st.composite
def _logs(draw: st.DrawFn) -> tuple[list[EpochRecord], dict[int, Position],
                                    dict[int, list[Position]]]:
    """Two domains' epochs (ids crossing 2**63 in one), shuffled, with copies, some
    altered copies, lost records, torn ids; sometimes a start point (a collected log)."""
    records: list[EpochRecord] = []
    starts = {}
    for domain_id in (5, _HIGH | 9):
        n = draw(st.integers(0, 12))
        ends = sorted(draw(st.sets(st.integers(1, 60), min_size=n, max_size=n)))
        offset = _HIGH - 30 if domain_id > _HIGH else 0
        begin = offset
        own = []
        for seq, end in enumerate(ends, 1):
            own.append(EpochRecord(domain_id, seq, begin, offset + end, draw(st.integers(0, 3)),
                                   draw(st.booleans()), (("t", 1),), "ab" * 32, None))
            begin = offset + end
        if own and draw(st.booleans()):
            at = draw(st.integers(0, len(own) - 1))
            starts[domain_id] = Position(domain_id, own[at].epoch_seq, own[at].end_id)
        records += own
    for _ in range(draw(st.integers(0, 4))):  # copies, some altered
        if records:
            r = draw(st.sampled_from(records))
            if draw(st.integers(0, 3)) == 0:
                r = EpochRecord(r.domain_id, r.epoch_seq, r.begin_id, r.end_id,
                                r.event_count + 1, r.quiescent, r.table_counts, r.setsum)
            records.append(r)
    if records and draw(st.booleans()):  # a lost record
        records.pop(draw(st.integers(0, len(records) - 1)))
    if records and draw(st.integers(0, 4)) == 0:  # torn ids
        i = draw(st.integers(0, len(records) - 1))
        r = records[i]
        records[i] = EpochRecord(r.domain_id, r.epoch_seq, r.begin_id + 1, r.end_id,
                                 r.event_count, r.quiescent, r.table_counts, r.setsum)
    retained = {d: [Position(d, seq, seq * 3) for seq in sorted(draw(st.sets(
        st.integers(1, p.epoch_seq), max_size=3)))] for d, p in starts.items()}
    return draw(st.permutations(records)), starts, retained


def _kind(message: str) -> str:
    return next(k for k in ("two different records", "tile the id space", "never arrived")
                if k in message)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_logs())
def test_the_columns_check_epochs_as_record_by_record(
        log: tuple[list[EpochRecord], dict[int, Position], dict[int, list[Position]]]
) -> None:
    """Same prefix and points per domain, or the same error (domain, epoch, kind)."""
    records, starts, retained = log
    try:
        want = _reference_table(records, starts, retained)
    except InconsistentLog as expected:
        with pytest.raises(InconsistentLog) as got:
            build_epoch_table(EpochColumns.from_records(records), starts, retained)
        assert (got.value.domain_id, got.value.epoch_seq) == (
            expected.domain_id, expected.epoch_seq)
        assert _kind(str(got.value)) == _kind(str(expected))
        return
    table = build_epoch_table(EpochColumns.from_records(records), starts, retained)
    epochs, points = want
    assert {d: p.seqs.tolist() for d, p in table.epochs.items()} == epochs
    assert {d: p.seqs.tolist() for d, p in table.intervals.items()} == points
    read = [(r.domain_id, r.epoch_seq) for r in records
            if r.domain_id not in starts or r.epoch_seq > starts[r.domain_id].epoch_seq]
    assert table.copies == (len(set(read)) < len(read))
    for domain_id, prefix in table.epochs.items():  # each epoch's interval: the next point
        q = table.index().domains[domain_id].q.tolist()
        for seq, closing in zip(prefix.seqs.tolist(), q, strict=True):
            assert closing == min((p for p in points[domain_id] if p >= seq), default=-1)
    for domain_id, seqs in points.items():  # the lookups on the points
        held = table.intervals[domain_id]
        for seq in range(0, max(seqs, default=0) + 2):
            found = held.find(seq)
            assert (found is not None) == (seq in seqs)
            assert found is None or found.epoch_seq == seq
            assert held.last_before(seq) == max((p for p in seqs if p < seq), default=None)


def test_two_different_records_are_named() -> None:
    a = EpochRecord(7, 1, 0, 10, 2, True, (("t", 2),), "cd" * 32)
    b = EpochRecord(7, 1, 0, 10, 3, True, (("t", 3),), "cd" * 32)
    with pytest.raises(InconsistentLog, match="two different records") as info:
        build_epoch_table(EpochColumns.from_records([a, a, b]))
    assert str(a) in str(info.value) and str(b) in str(info.value)


_RECORDS = st.builds(
    EpochRecord, st.sampled_from([3, _HIGH | 3]), st.integers(1, 1 << 40),
    st.integers(0, (1 << 64) - 1), st.integers(0, (1 << 64) - 1), st.integers(0, 1 << 40),
    st.booleans(),
    st.lists(st.tuples(st.sampled_from(["orders", "ü", "t"]), st.integers(0, 1 << 40)),
             max_size=3).map(tuple),
    st.binary(min_size=32, max_size=32).map(bytes.hex), st.none() | st.integers(0, 7))


@settings(max_examples=100, deadline=None)
@given(st.lists(_RECORDS, min_size=1, max_size=8))
def test_a_run_becomes_the_rows_its_records_make_alone(records: list[EpochRecord]) -> None:
    """An EPOCHS run turned into rows from its columns equals the same records sent one
    message each (each field, the setsum's lanes), and the rows give the records back."""
    run = metadata_batch([(4, encode_epochs(EpochRun.from_records(records)))])
    alone = metadata_batch([(4, encode_epoch(r)) for r in records])
    got = pa.Table.from_batches(run, schema=METADATA_ROWS)
    want = pa.Table.from_batches(alone, schema=METADATA_ROWS)
    assert got.to_pylist() == want.to_pylist()
    assert rows_to_records(got) == records
    for row, record in zip(got.to_pylist(), records, strict=True):
        lanes = struct.unpack("<8I", bytes.fromhex(record.setsum))
        assert [row[f"e{i}"] for i in range(8)] == list(lanes)
        assert row["domain"] % (1 << 64) == record.domain_id


def test_the_fingerprint_covers_every_field_of_a_record() -> None:
    """Two copies of one epoch are told apart by a hash of these fields: all of the
    record's, none of the row's bookkeeping (offset, chunk, problem, lanes)."""
    bookkeeping = {"offset", "chunk", "problem", *(f"e{i}" for i in range(8))}
    assert set(EPOCH_FIELDS) == set(METADATA_ROWS.names) - bookkeeping


def test_copies_are_told_apart_by_their_fingerprints() -> None:
    """As collected: copies with one fingerprint are one record, two fingerprints are
    two different records (named by ``describe``), refused."""
    record = EpochRecord(3, 1, 0, 5, 0, True, (), "00" * 32)
    table = pa.Table.from_batches(metadata_batch([(1, encode_epoch(record)),
                                                  (2, encode_epoch(record))]))
    same = table.append_column("fingerprint", pa.array([7, 7], pa.int64()))
    columns, _ = read_metadata(same, lambda d, e: "")
    assert build_epoch_table(columns).epochs[3].seqs.tolist() == [1]
    differ = table.append_column("fingerprint", pa.array([7, 8], pa.int64()))
    columns, _ = read_metadata(differ, lambda d, e: f"the copies of {d}:{e}")
    with pytest.raises(InconsistentLog, match="the copies of 3:1"):
        build_epoch_table(columns)


def test_an_epoch_past_2_63_is_refused() -> None:
    """No writer numbers an epoch past 2**63: such a record is refused, not dropped."""
    record = EpochRecord(3, (1 << 63) + 5, 0, 5, 0, True, (), "00" * 32)
    table = pa.Table.from_batches(metadata_batch([(6, encode_epoch(record))]))
    with pytest.raises(InconsistentLog, match=r"offset 6 .* past 2\*\*63"):
        read_metadata(table.append_column("fingerprint", pa.array([1], pa.int64())),
                      lambda d, e: "")
    with pytest.raises(InconsistentLog, match="past 2"):
        EpochColumns.from_records([record])


def test_refused_records_and_chunks_are_rows_too() -> None:
    """A record kind this reader does not know is a row saying why; so is a record the
    codec cannot read; the driver raises the first by offset. A chunk is a row of its
    header; a damaged chunk fails with the codec's error."""
    chunk = SnapshotChunk.build(9, 3, 50, 0xB, 0, True, None, None, [("t", 1, "c", 5)])
    rows = pa.Table.from_batches(metadata_batch([(5, encode_snapshot(chunk))]),
                                 schema=METADATA_ROWS)
    header = ChunkHeader.parse(rows.column("chunk")[0].as_py())
    assert (header.domain_id, header.baseline_id, header.epoch_seq) == (9, 0xB, 3)
    with pytest.raises(CodecError):
        metadata_batch([(5, encode_snapshot(chunk)[:-3])])
    rows = pa.Table.from_batches(metadata_batch([(12, b"CDC\x01\x7f"), (3, b"CDC\xff\x02")]),
                                 schema=METADATA_ROWS)
    assert [r["problem"] is not None for r in rows.to_pylist()] == [True, True]
    fingerprints = rows.append_column("fingerprint", pa.array([0, 0], pa.int64()))
    with pytest.raises(ValueError, match="offset 3 of the log"):
        read_metadata(fingerprints, lambda d, e: "")


def test_each_epoch_row_gets_its_interval_and_the_rest_are_left_out() -> None:
    """``place_epochs``: rows of the verified prefix get the index's q; rows before it,
    past it, in its tail (q -1) or of an unknown domain are dropped."""
    records = [EpochRecord(3, s, s, s + 1, 0, s in (2, 4), (), "00" * 32) for s in range(1, 7)]
    records += [EpochRecord(8, 1, 0, 1, 0, True, (), "00" * 32)]
    table = record_rows(records)
    index = EpochIndex({3: DomainEpochs(np.arange(3, 7, dtype=np.uint64),
                                        np.arange(2, 6, dtype=np.int64),
                                        np.array([2, 4, 4, -1], dtype=np.int64))})
    out = pa.Table.from_batches(list(place_epochs(index)(table.to_batches())))
    assert list(zip(out.column("epoch").to_pylist(), out.column("q").to_pylist(),
                    strict=True)) == [(2, 2), (3, 4), (4, 4)]


def test_quiescence_points_keep_their_first_offset() -> None:
    """Where a stream resumes: each point's first copy in the log."""
    point = EpochRecord(3, 2, 0, 5, 0, True, (), "00" * 32)
    rows = [(30, point), (10, point), (20, EpochRecord(3, 3, 5, 6, 0, False, (), "00" * 32)),
            (40, EpochRecord(_HIGH | 1, 1, 0, 1, 0, True, (), "00" * 32))]
    batches = metadata_batch([(o, encode_epoch(r)) for o, r in rows])
    table = pa.Table.from_batches(batches, schema=METADATA_ROWS)
    prints = [hash(json.dumps([r[f] for f in EPOCH_FIELDS], default=bytes.hex))
              for r in table.to_pylist()]
    columns, _ = read_metadata(
        table.append_column("fingerprint", pa.array(prints, pa.int64())), lambda d, e: "")
    offsets = columns.quiescent_offsets()
    assert offsets.get((3, 2)) == 10
    assert offsets.get((3, 3)) is None  # not a quiescence point
    assert offsets.get((_HIGH | 1, 1)) == 40
    assert offsets.get((4, 2)) is None
