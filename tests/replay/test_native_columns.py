"""The assembler's C passes equal their Python twins, on odd input too.

- ``EpochColumns.of_records`` (``sequencer.NATIVE.epoch_fields``: every field of every
  epoch record in one pass) against ``of_records_py``: the same columns, or the same
  error, whatever the records hold (bogus setsums, odd table lists, ints out of range).
- ``segment_digests_at`` (``sequencer.NATIVE.sha3_segments``: items built and hashed in
  C) against ``sinks.codec.segment_digest_array``: the same segments and digests, on
  sliced Arrow arrays and across SHA3 block edges; its argument checks.
- The assembler's fast path with both switched off (the pure-Python fallback) still
  equals the reference on a damaged log.
"""

from __future__ import annotations

import dataclasses
import gc
import textwrap
import weakref
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import replay._assembler as assembler_module
import replay._epoch_columns as columns_module
from replay import Assembler
from replay._epoch_columns import EpochColumns, segment_digests_at
from sequencer import NATIVE, EpochRecord
from sinks.codec import EVENT_SCHEMA, SEGMENT_BITS, EventBatch, segment_digest_array
from tests._subprocess import python_output
from tests.sequencer._impls import sha3_lane_counts, sha3_lanes

HEX = "0123456789abcdef"
setsums = st.one_of(
    st.text(HEX, min_size=64, max_size=64),  # a digest
    st.just(""),  # not filled in
    st.text(HEX.upper(), min_size=64, max_size=64),  # no canonical digest
    st.text(HEX + "g é", min_size=62, max_size=66),
    st.just("é" * 64),
)
u64 = st.integers(0, (1 << 64) - 1)
pairs = st.tuples(st.sampled_from(["t", "users", "é", ""]), st.integers(0, 9) | u64)
tables = (st.lists(pairs, max_size=3).map(tuple)
          | st.lists(pairs, max_size=2)  # a list, not a tuple: C leaves it to Python
          | st.just((("t",),)))  # not a pair
records = st.builds(EpochRecord, domain_id=u64, epoch_seq=u64, begin_id=u64, end_id=u64,
                    event_count=u64, quiescent=st.booleans() | st.integers(0, 2),
                    table_counts=tables, setsum=setsums)


def _outcome(build: Any, rows: list[EpochRecord]) -> Any:
    try:
        cols = build(rows)
    except Exception as exc:
        return type(exc).__name__
    return [f.to_pylist() if isinstance(f, pa.Array) else (f.dtype.str, f.tolist())
            for f in (getattr(cols, name) for name in cols.__dataclass_fields__)]


def native() -> Any:
    assert NATIVE is not None, "the C extension is built by scripts/test.sh"
    return NATIVE


@settings(max_examples=150, deadline=None)
@given(st.lists(records, max_size=12))
def test_epoch_fields_give_the_python_columns(rows: list[EpochRecord]) -> None:
    native()
    assert _outcome(EpochColumns.of_records, rows) == _outcome(EpochColumns.of_records_py,
                                                                rows)


valid_tables = st.lists(st.tuples(st.sampled_from(["t", "users", "é"]), u64),
                        max_size=3).map(tuple)
valid_records = st.builds(EpochRecord, domain_id=u64, epoch_seq=u64, begin_id=u64,
                          end_id=u64, event_count=u64, quiescent=st.booleans(),
                          table_counts=valid_tables, setsum=setsums)


@settings(max_examples=150, deadline=None)
@given(st.lists(valid_records, max_size=12), st.randoms(use_true_random=False))
def test_taking_columns_in_an_order_gives_the_records_in_that_order(
        rows: list[EpochRecord], rng: Any) -> None:
    """``EpochColumns.take`` (a tail piece's runs and lone records put in seq order)."""
    picks = rng.randrange(len(rows) + 2) if rows else 0  # some records twice, some not
    order = [rng.randrange(len(rows)) for _ in range(picks)]
    taken = EpochColumns.of_records_py(rows).take(np.array(order, dtype=np.int64))
    assert _outcome(lambda _: taken, []) == _outcome(EpochColumns.of_records_py,
                                                      [rows[i] for i in order])


def test_epoch_fields_read_a_usual_run() -> None:
    """A digest, an empty setsum and a bogus one side by side; tables counted."""
    digest = "0123456789abcdef" * 4
    rows = [EpochRecord(7, 1, 0, 5, 2, False, (("t", 1), ("u", 1)), digest),
            EpochRecord(7, 2, 5, 9, 0, True, (), ""),
            EpochRecord(7, 3, 9, 12, 1, True, (("t", 1),), digest.upper())]
    cols = EpochColumns.of_records(rows)
    assert cols.seqs.tolist() == [1, 2, 3] and cols.ends.tolist() == [5, 9, 12]
    assert cols.setsum_kind.tolist() == [1, 0, 2]
    assert cols.lanes[0].tobytes() == bytes.fromhex(digest)
    assert cols.lanes[2].tobytes() == bytes(32)
    assert cols.table_offsets.tolist() == [0, 2, 2, 3]
    assert cols.table_names.to_pylist() == ["t", "u", "t"]
    found = EpochColumns.of_records_native(rows)
    assert found is not None and found[1].tolist() == [7, 7, 7]  # the domain ids
    assert _outcome(EpochColumns.of_records, rows) == _outcome(EpochColumns.of_records_py,
                                                                rows)


@pytest.mark.parametrize("bad", [
    {"epoch_seq": -1}, {"end_id": 1 << 64}, {"event_count": None},
    {"table_counts": (("t", -1),)}, {"setsum": None}])
def test_epoch_fields_leave_what_is_out_of_range_to_python(bad: dict[str, Any]) -> None:
    """The C pass declines (None) and the Python path raises as it always did."""
    record = EpochRecord(7, 1, 0, 5, 1, True, (("t", 1),), "")
    rows = [record, EpochRecord(**{**_fields(record), **bad})]
    assert native().epoch_fields(rows) is None
    outcome = _outcome(EpochColumns.of_records, rows)
    assert outcome == _outcome(EpochColumns.of_records_py, rows)
    assert isinstance(outcome, str), outcome  # the error's name


class _Int(int):
    """An int subclass: read the generic way, as before."""


@pytest.mark.parametrize("value", [
    0, 1, (1 << 30) - 1, 1 << 30, (1 << 60) - 1, 1 << 60, (1 << 63) + 12345, (1 << 64) - 1,
    1 << 64, (1 << 64) + 1, 1 << 90, -1, -(1 << 60), True, _Int((1 << 64) - 2), _Int(-5)])
def test_epoch_fields_read_each_int_as_python_does(value: int) -> None:
    """The C pass reads exact ints from their digits: every value of 0..2**64-1 the same
    as PyLong_AsUnsignedLongLong; any other leaves the records to Python."""
    record = EpochRecord(7, 1, 0, 5, 1, True, (("t", 1),), "")
    for name in ("domain_id", "epoch_seq", "begin_id", "end_id", "event_count"):
        rows = [record, EpochRecord(**{**_fields(record), name: value})]
        found = native().epoch_fields(rows)
        if not 0 <= value < 1 << 64:
            assert found is None, (name, value)
            continue
        assert found is not None, (name, value)
        column = ["epoch_seq", "begin_id", "end_id", "event_count", "domain_id"].index(name)
        ints = np.frombuffer(found[0], dtype=np.uint64).reshape(5, 2)
        assert int(ints[column][1]) == value, (name, value)


def _fields(record: EpochRecord) -> dict[str, Any]:
    return {name: getattr(record, name) for name in record.__dataclass_fields__}


class _LooseRecord:
    """Not an EpochRecord: the same fields as plain attributes (read by getattr)."""

    def __init__(self, record: EpochRecord, **change: Any) -> None:
        self.__dict__.update({**_fields(record), **change})


def test_epoch_fields_read_records_of_any_type_alike() -> None:
    """Records of other types, mixed with EpochRecords (the C pass caches where one type
    keeps its fields): the same columns as the Python path."""
    digest = "ab" * 32
    first = EpochRecord(7, 1, 0, 5, 1, False, (("t", 1),), digest)
    rows: list[Any] = [first, _LooseRecord(first, epoch_seq=2, setsum=""),
                       EpochRecord(7, 3, 5, 9, 0, True, (), digest),
                       _LooseRecord(first, epoch_seq=4, quiescent=True)]
    assert native().epoch_fields(rows) is not None
    assert _outcome(EpochColumns.of_records, rows) == _outcome(EpochColumns.of_records_py,
                                                                rows)
    assert EpochColumns.of_records(rows).seqs.tolist() == [1, 2, 3, 4]


values = st.binary(max_size=150)
events = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(0, 9),
                            st.sampled_from(["t", "users", "é"]), values,
                            st.sampled_from(["a", "b"]), values, values),
                  max_size=40)


def _batch(rows: list[tuple[Any, ...]]) -> pa.RecordBatch:
    """Events sorted by (domain, batch, seq): whole segments, each in seq order."""
    rows = sorted({r[:3]: r for r in rows}.values())
    return pa.RecordBatch.from_pylist(
        [dict(zip(EVENT_SCHEMA.names,
                  (d, b, (s // 4) << SEGMENT_BITS | s, t, r, c, o, n), strict=True))
         for d, b, s, t, r, c, o, n in rows], schema=EVENT_SCHEMA)


@pytest.mark.parametrize("lanes", sha3_lane_counts())
@settings(max_examples=150, deadline=None)
@given(events, st.integers(0, 5))
@example([(0, 0, 0, "t", b"x" * 136, "a", b"", b"y" * 97)], 0)  # items across block edges
def test_sha3_segments_give_the_codecs_digests(lanes: int, rows: list[tuple[Any, ...]],
                                               cut: int) -> None:
    """One message at a time and four at once (AVX2), the codec's digests; with one,
    long items go to the codec itself."""
    native()
    data = _batch(rows)
    with sha3_lanes(lanes):
        for piece in (data, data.slice(min(cut, data.num_rows)),
                      pa.Table.from_batches([data.slice(0, cut), data.slice(cut)])):
            starts, digests = segment_digests_at(piece)
            expected_starts, expected = segment_digest_array(piece)
            assert starts.tolist() == expected_starts.tolist()
            assert digests == expected


@pytest.mark.parametrize("lanes", sha3_lane_counts())
def test_sha3_segments_past_one_scratch_buffer(lanes: int) -> None:
    """Items built and hashed a scratch buffer (1 MiB) at a time, one item larger than
    that included: every digest is still the codec's."""
    native()
    # three events a segment: the one-lane case takes the C path too (4 at most)
    rows = [(0, b, s, "t", b"k%d" % b, "c", b"", b"v" * (400 + b % 900))
            for b in range(900) for s in range(3)]
    rows.append((0, 900, 0, "t", b"big", "c", b"", b"w" * (3 << 20)))
    rows += [(0, 901, s, "t", b"after", "c", b"", b"z" * 90) for s in range(3)]
    data = _batch(rows)
    with sha3_lanes(lanes):
        starts, digests = segment_digests_at(data)
    expected_starts, expected = segment_digest_array(data)
    assert starts.tolist() == expected_starts.tolist() and len(starts) == 902
    assert digests == expected


def test_sha3_segments_refuse_what_does_not_fit() -> None:
    sha3 = native().sha3_segments
    one = np.array([1], np.uint64)
    seqs = np.array([0], np.uint32)
    good = (np.array([0, 1], np.int32), b"x")
    sha3(np.array([0, 1], np.int64), one, one, seqs, (good,) * 5)
    with pytest.raises(ValueError, match="outside the values buffer"):
        sha3(np.array([0, 1], np.int64), one, one, seqs,
             ((np.array([0, 2], np.int32), b"x"),) + (good,) * 4)
    with pytest.raises(ValueError, match="must not decrease"):
        sha3(np.array([0, 2], np.int64), np.array([1], np.uint64), np.array([1], np.uint64),
             np.array([0, 1], np.uint32), ((np.array([0, 1, 0], np.int32), b"x"),) * 5)
    with pytest.raises(ValueError, match="bounds must increase"):
        sha3(np.array([0, 0, 1], np.int64), one, one, seqs, (good,) * 5)
    with pytest.raises(ValueError, match="seqs"):
        sha3(np.array([0, 1], np.int64), one, one, np.array([0, 1], np.uint32), (good,) * 5)
    with pytest.raises(TypeError, match="sha3_segments"):
        sha3(np.array([0, 1], np.int64), one, one, seqs, (good,) * 4)


def test_the_python_fallback_verifies_as_the_c_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the C extension the fast path is the same: a damaged log gives the same
    changesets, then the same error, as with it."""
    from agent import Agent, MemoryStore
    from sinks import MemorySink

    sink = MemorySink()
    agent = Agent(MemoryStore(), sink)
    for i in range(30):
        agent.set("t", i % 7, "c", i)
    agent.close()
    log: list[Any] = [EventBatch.from_events(sink.events), *sink.epochs]
    # Alter one event's new value: its epoch's setsum no longer holds.
    data = log[0].data
    new = data.column("new").to_pylist()
    new[17] = b"\x02" + (99).to_bytes(8, "big")
    log[0] = EventBatch(pa.RecordBatch.from_arrays(
        [*data.columns[:7], pa.array(new, pa.binary())], schema=EVENT_SCHEMA))

    def run() -> tuple[list[Any], str]:
        seen = []
        try:
            for changeset in Assembler().changesets(log):
                seen.append((changeset.epoch_seq, changeset.changes))
        except Exception as exc:
            return seen, str(exc)
        return seen, ""

    with_c = run()
    monkeypatch.setattr(columns_module, "_EPOCH_FIELDS", None)
    monkeypatch.setattr(columns_module, "_SHA3_SEGMENTS", None)
    without = run()
    assert with_c == without
    assert "setsum" in with_c[1] and len(with_c[0]) == 17


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_setsum_fault_finds_the_numpy_ones(data: st.DataObject) -> None:
    """The C sums and comparisons name the same first epoch as numpy's: records whose
    setsum is their segments' (some altered in one lane, some bogus or unfilled)."""
    native()
    n = data.draw(st.integers(1, 12))
    owner = np.array(sorted(data.draw(st.lists(st.integers(0, n), max_size=20))), np.int64)
    digests = data.draw(st.binary(min_size=32 * len(owner), max_size=32 * len(owner)))
    segment_lanes = np.frombuffer(digests, "<u4").reshape(-1, 8).astype(np.uint64)
    primes = columns_module._PRIMES
    lanes = np.zeros((n, 8), np.uint32)
    for epoch in range(n):
        lanes[epoch] = segment_lanes[owner == epoch].sum(axis=0) % primes
    kinds = np.array(data.draw(st.lists(st.sampled_from([0, 1, 1, 1, 2]), min_size=n,
                                        max_size=n)), np.int8)
    for epoch in data.draw(st.lists(st.integers(0, n - 1), max_size=2)):
        lanes[epoch, data.draw(st.integers(0, 7))] ^= 1 << data.draw(st.integers(0, 31))
    cols = EpochColumns(*(np.zeros(n, np.uint64),) * 4, np.zeros(n, bool), lanes, kinds,
                        np.zeros(n + 1, np.int64), pa.array([], pa.utf8()),
                        np.zeros(0, np.uint64))
    calls: list[Any] = []

    def digests_of(_data: Any) -> tuple[np.ndarray, bytes]:
        calls.append(1)
        return np.arange(len(owner)), digests

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(columns_module, "segment_digests_at", digests_of)
        found = columns_module.first_setsum_fault(cols, None, owner)  # type: ignore[arg-type]
        patch.setattr(columns_module, "_SETSUM_FAULT", None)
        expected = columns_module.first_setsum_fault(cols, None, owner)  # type: ignore[arg-type]
    assert found == expected
    assert len(calls) == (2 if (kinds != 0).any() else 0)


def _one_writer_log(events: int) -> tuple[EventBatch, list[EpochRecord]]:
    from agent import Agent, MemoryStore
    from sinks import MemorySink

    sink = MemorySink()
    agent = Agent(MemoryStore(), sink)
    for i in range(events):
        agent.set("t", i % 7, "c", i)
    agent.close()
    return EventBatch.from_events(sink.events), sink.epochs


def _assembled(log: list[Any], *, bulk: bool) -> tuple[list[Any], str]:
    seen: list[Any] = []
    assembler = Assembler()
    try:
        if bulk:
            for changeset in assembler.changesets(log):
                seen.append((changeset.epoch_seq, changeset.changes, changeset.before))
        else:
            for record in log:
                for changeset in assembler.feed(record):
                    seen.append((changeset.epoch_seq, changeset.changes, changeset.before))
            assembler.check_gaps()
    except Exception as exc:
        return seen, str(exc)
    return seen, ""


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 59), st.integers(1, 60)), min_size=1, max_size=4),
       st.booleans(), st.integers(0, 59))
def test_epoch_records_met_together_as_one_at_a_time(
        pieces: list[tuple[int, int]], alter: bool, which: int) -> None:
    """Epoch records come in groups (kept as columns when consecutive and new): groups
    repeating, overlapping or preceding held ones, and a repeat that differs, give the
    changesets and error of storing each record by itself; with no differing repeat,
    those of feeding each record by itself. (A differing copy of an epoch the reference
    has already applied is dropped there, unseen, but refused by ``changesets()``, which
    may still hold the epoch: that is older than the groups.)"""
    batch, epochs = _one_writer_log(30)  # 60 epoch records
    nothing = EventBatch(batch.data.slice(0, 0))  # ends a group, changes nothing
    log: list[Any] = [batch]
    for start, length in pieces:
        log += [*epochs[start:start + length], nothing]
    if alter:  # a second, different record for one epoch
        log.append(dataclasses.replace(epochs[which], event_count=epochs[which].event_count + 1))
    log += epochs  # every epoch at least once
    found = _assembled(log, bulk=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(assembler_module, "_RECORDS_AS_COLUMNS", 1 << 30)  # one by one
        assert found == _assembled(log, bulk=True)
    if not alter:
        assert found == _assembled(log, bulk=False)


def test_a_failing_source_hands_out_the_groups_taken_first() -> None:
    """Epoch records gathered when the source fails are stored: their intervals are
    handed out, then the source's error."""
    batch, epochs = _one_writer_log(30)

    def source() -> Any:
        yield batch
        yield from epochs[:41]  # 20 whole intervals, and one epoch of the next
        raise OSError("fragment unreadable")

    seen = []
    with pytest.raises(OSError, match="fragment unreadable"):
        for changeset in Assembler().changesets(source()):
            seen.append(changeset.epoch_seq)
    assert seen == [2 * k for k in range(1, 21)]


one_table_epochs = st.lists(st.tuples(
    st.integers(0, 3),  # the record's event count (0: the epoch is not checked)
    st.lists(st.tuples(st.sampled_from(["t", "t", "u"]), st.integers(0, 3)), max_size=2),
    st.integers(0, 3)), min_size=1, max_size=8)  # events found (table "t", or one "u")


@settings(max_examples=150, deadline=None)
@given(one_table_epochs, st.booleans())
@example([(1, [("t", 0)], 0), (1, [("t", 1)], 1)], False)  # a count of 0 listed: refused
@example([(1, [("t", 0)], 1), (1, [], 1)], False)  # the general way: counts part first
def test_one_table_counts_flag_the_first_epoch_the_reference_refuses(
        epochs: list[tuple[int, list[tuple[str, int]], int]], foreign: bool) -> None:
    """The one-table shortcut of ``first_table_fault`` flags exactly the first epoch with
    events whose per-table counts the reference (``dict(table_counts) != seen``) refuses;
    logs of another kind (two tables, a table listed twice) go the general way, which
    flags no later epoch than the reference (and none it accepts, but for a table
    listed twice: refused there, as the docstring says)."""
    rows = [EpochRecord(7, k + 1, k, k + 1, count, True, tuple(listed), "")
            for k, (count, listed, _) in enumerate(epochs)]
    columns = EpochColumns.of_records(rows)
    epoch_index = np.repeat(np.arange(len(epochs)), [found for _, _, found in epochs])
    tables = ["t"] * len(epoch_index)
    if foreign and tables:
        tables[-1] = "u"
    refused = []
    lists_tables = any(listed for _, listed, _ in epochs)  # else the reference skips
    for k, (count, listed, _) in enumerate(epochs if lists_tables else ()):
        seen: dict[str, int] = {}
        for i in np.flatnonzero(epoch_index == k).tolist():
            seen[tables[i]] = seen.get(tables[i], 0) + 1
        if count and dict(listed) != seen:
            refused.append(k)
    found = columns_module.first_table_fault(columns, pa.array(tables, pa.utf8()), epoch_index)
    shortcut = columns_module._one_table_fault(columns, pa.array(tables, pa.utf8()),
                                               epoch_index, columns.counts != 0)
    if shortcut is not columns_module._NOT_ONE_TABLE:
        assert found == (refused[0] if refused else None)
    elif refused:  # the general way may be stricter, never more lenient
        assert found is not None and found <= refused[0]
    elif found is not None:  # stricter: it refuses a table listed twice
        listed = [name for name, _ in epochs[found][1]]
        assert len(set(listed)) < len(listed)


def test_a_run_applies_each_cells_last_value_deletes_included() -> None:
    """One run of one-write intervals: cells deleted, deleted then set again, set then
    deleted, all in the same run. The state after it is the store's (a cell whose last
    value is ABSENT is gone, one set again after a delete is there)."""
    from agent import Agent, MemoryStore
    from sinks import MemorySink

    sink = MemorySink()
    store = MemoryStore()
    agent = Agent(store, sink)
    for row in range(6):
        agent.set("t", row, "c", row)
    agent.delete("t", 0, "c")  # deleted
    agent.delete("t", 1, "c")
    agent.set("t", 1, "c", "again")  # deleted, then set again
    agent.set("t", 2, "c", "new")
    agent.delete("t", 2, "c")  # set, then deleted
    agent.close()
    log = [EventBatch.from_events(sink.events), *sink.epochs]
    assembler = Assembler()
    handed = list(assembler.changesets(log))
    assert len(handed) == 11
    assert assembler.state == {("t", 1, "c"): "again", ("t", 3, "c"): 3, ("t", 4, "c"): 4,
                               ("t", 5, "c"): 5}


# -- epoch_fields: its cache of where a record type keeps its fields, and odd records --

RECORD_FIELDS = ("domain_id", "epoch_seq", "begin_id", "end_id", "event_count", "quiescent",
                 "table_counts", "setsum")


def _slotted_type(*extra: str) -> type:
    """A new class keeping the record fields (and ``extra`` ones) in __slots__: the
    layout epoch_fields caches (CPython lays slots out by sorted name)."""
    def init(self: Any, **values: Any) -> None:
        for name, value in values.items():
            setattr(self, name, value)

    return type("SlottedRecord", (), {"__slots__": (*extra, *RECORD_FIELDS, "stream"),
                                      "__init__": init})


def test_epoch_fields_see_a_record_class_changed_after_it_was_read() -> None:
    """A class whose field becomes a property after epoch_fields read its instances: the
    next call reads the property (the cached slot offsets are stale), as Python does."""
    kind = _slotted_type()
    record = kind(**_fields(EpochRecord(7, 1, 0, 5, 1, True, (("t", 1),), "")))
    assert EpochColumns.of_records([record]).seqs.tolist() == [1]
    kind.epoch_seq = property(lambda self: 99)  # type: ignore[attr-defined]
    assert record.epoch_seq == 99
    assert EpochColumns.of_records([record]).seqs.tolist() == [99]
    assert _outcome(EpochColumns.of_records, [record]) == _outcome(
        EpochColumns.of_records_py, [record])


def test_epoch_fields_hold_the_record_type_they_cache() -> None:
    """The type whose layout is cached is held (it cannot be freed, and another type
    made at its address, while cached), and let go when another type replaces it."""
    kind = _slotted_type()
    held = weakref.ref(kind)
    native().epoch_fields([kind(**_fields(EpochRecord(7, 1, 0, 5, 1, True, (), "")))])
    del kind
    gc.collect()
    assert held() is not None, "the cached type was freed: the cache held no reference"
    native().epoch_fields([EpochRecord(7, 1, 0, 5, 1, True, (), "")])
    gc.collect()
    assert held() is None, "the type is still held after another replaced it in the cache"


def test_epoch_fields_survive_code_that_empties_the_list_being_read() -> None:
    """Reading a field runs Python code (here ``quiescent.__bool__``) that clears the
    list epoch_fields walks, freeing its records: it reads its own copy of the list
    (in a subprocess: a read of a freed record can crash)."""
    code = textwrap.dedent("""
        import gc
        from sequencer._accel import NATIVE
        rows = []

        class Emptying:
            def __bool__(self):
                rows.clear()
                gc.collect()
                return True

        class Record:
            def __init__(self, seq):
                self.domain_id, self.epoch_seq, self.begin_id = 7, seq, seq
                self.end_id, self.event_count, self.setsum = seq + 1, 0, ""
                self.quiescent, self.table_counts = Emptying(), (("t" * 1000, 1),)
                self.ballast = bytearray(10**5)

        for _ in range(5):
            rows.extend(Record(i) for i in range(1, 500))
            found = NATIVE.epoch_fields(rows)
            assert found is not None and len(found[1]) == 499, found
        print("ok")
        """)
    native()
    assert python_output(code, timeout=120) == "ok"


def test_epoch_fields_refuse_a_slot_descriptor_of_another_class() -> None:
    """A class given another class's slot descriptors (whose offsets lie past its own
    objects): Python refuses to read them, and epoch_fields declines (None) instead of
    reading past the object (in a subprocess: such a read can crash)."""
    code = textwrap.dedent("""
        from sequencer._accel import NATIVE
        from tests.replay.test_native_columns import RECORD_FIELDS, _slotted_type
        wide = _slotted_type(*(f"pad{i}" for i in range(10)))

        class Borrowing:
            __slots__ = ()

        for name in RECORD_FIELDS:
            setattr(Borrowing, name, wide.__dict__[name])
        print(NATIVE.epoch_fields([Borrowing()] * 3))
        """)
    native()
    assert python_output(code, timeout=60) == "None"


def test_epoch_fields_do_not_read_a_new_type_at_a_freed_ones_address() -> None:
    """A type read by epoch_fields, dropped, and a type of another layout made (often at
    the same address): its records read right (run in a subprocess: a stale layout
    reads other slots, or past the object)."""
    code = textwrap.dedent("""
        import gc
        from sequencer._accel import NATIVE
        from tests.replay.test_native_columns import _slotted_type
        from replay._epoch_columns import EpochColumns
        values = dict(domain_id=7, epoch_seq=1, begin_id=2, end_id=5, event_count=3,
                      quiescent=True, table_counts=(("t", 3),), setsum="")
        old = _slotted_type()
        NATIVE.epoch_fields([old(**values)])
        del old
        gc.collect()
        for attempt in range(20):
            new = _slotted_type("a_pad", "b_pad")
            record = new(**values)
            record.a_pad, record.b_pad = 1000, "x"
            found = NATIVE.epoch_fields([record])
            assert found is not None, "a record of the usual shape declined"
            columns, domains = EpochColumns._of_fields(1, *found)
            assert columns.seqs.tolist() == [1] and columns.begins.tolist() == [2], found
            assert domains.tolist() == [7] and columns.table_names.to_pylist() == ["t"]
            del new, record
            gc.collect()
        print("ok")
        """)
    native()
    assert python_output(code, timeout=120) == "ok"


def test_epoch_fields_leave_a_record_without_a_domain_to_python() -> None:
    """A record without domain_id (which the Python columns do not read): the C pass
    declines (None) instead of raising AttributeError, and the columns are Python's."""
    first = EpochRecord(7, 1, 0, 5, 1, False, (("t", 1),), "")
    loose = _LooseRecord(first, epoch_seq=2)
    del loose.domain_id
    assert native().epoch_fields([first, loose]) is None
    assert EpochColumns.of_records_native([first, loose]) is None
    assert EpochColumns.of_records([first, loose]).seqs.tolist() == [1, 2]


class _Raising:
    """A record whose one field raises when read."""

    def __init__(self, record: EpochRecord, field: str) -> None:
        self.__dict__.update(_fields(record))
        self.__dict__.pop(field)
        self.field = field

    def __getattr__(self, name: str) -> Any:
        raise ValueError(f"{name} cannot be read")


@st.composite
def odd_records(draw: st.DrawFn) -> Any:
    """An epoch record, a look-alike missing a field or failing to read one, a slotted
    one, or any other object."""
    record = draw(records)
    kind = draw(st.sampled_from(["record", "loose", "missing", "raising", "slotted",
                                 "other"]))
    if kind == "record":
        return record
    if kind == "loose":
        return _LooseRecord(record)
    if kind == "missing":
        loose = _LooseRecord(record)
        delattr(loose, draw(st.sampled_from(RECORD_FIELDS)))
        return loose
    if kind == "raising":
        return _Raising(record, draw(st.sampled_from(RECORD_FIELDS)))
    if kind == "slotted":
        return _SLOTTED(**_fields(record))
    return draw(st.none() | st.integers() | st.text(max_size=3) | st.tuples(st.integers()))


_SLOTTED = _slotted_type()


@settings(max_examples=150, deadline=None)
@given(st.lists(odd_records(), max_size=6))
def test_epoch_fields_decline_what_python_decides(rows: list[Any]) -> None:
    """On any records: the C pass never raises; where it gives columns, they are the
    Python columns and the domain ids the records'; of_records (C, then Python where C
    declines) gives the Python outcome, columns or error."""
    found = native().epoch_fields(rows)
    if found is not None:
        columns, domains = EpochColumns._of_fields(len(rows), *found)
        assert _outcome(lambda _: columns, rows) == _outcome(EpochColumns.of_records_py, rows)
        assert domains.tolist() == [row.domain_id for row in rows]
    assert _outcome(EpochColumns.of_records, rows) == _outcome(EpochColumns.of_records_py,
                                                                rows)


# -- setsum_fault: refuses inputs that are no setsum (never divides by zero) --------------

def _setsum_args(digests: bytes, primes: np.ndarray) -> tuple[Any, ...]:
    owner = np.zeros(len(digests) // 32, np.int64)
    lanes = np.zeros((1, 8), np.uint32)
    return digests, owner, lanes, np.ones(1, np.int8), primes


@pytest.mark.parametrize("extra", [1, 4, 31])
def test_setsum_fault_refuses_digests_that_are_not_whole(extra: int) -> None:
    """Digests whose length is no multiple of 32 are refused as ``Setsum.insert_digests``
    refuses them (they were read as fewer digests, the rest ignored)."""
    with pytest.raises(ValueError, match="whole number of 32-byte"):
        native().setsum_fault(*_setsum_args(bytes(32 + extra), columns_module._PRIMES))


def test_setsum_fault_refuses_a_zero_prime() -> None:
    """A prime of 0 in any lane is refused with a ValueError (it divided by zero: SIGFPE),
    and arbitrary buffers either give an epoch index or a ValueError/TypeError. In a
    subprocess: a regression kills it, not pytest."""
    code = textwrap.dedent("""
        import random
        import numpy as np
        from sequencer._accel import NATIVE
        from sinks import SETSUM_PRIMES
        from tests.replay.test_native_columns import _setsum_args
        for lane in range(8):
            primes = np.array(SETSUM_PRIMES, np.uint64)
            primes[lane] = 0
            try:
                NATIVE.setsum_fault(*_setsum_args(bytes(64), primes))
            except ValueError as exc:
                assert f"prime {lane} is 0" in str(exc), exc
            else:
                raise SystemExit(f"a zero prime in lane {lane} was not refused")
        rng = random.Random(5)
        def buf(n, dtype):
            return np.frombuffer(rng.randbytes(n * np.dtype(dtype).itemsize), dtype)
        for _ in range(2000):
            m, n = rng.randrange(4), rng.randrange(4)
            args = [rng.randbytes(32 * m + rng.choice([0, 0, 0, 1, 8, 31])),
                    buf(m + rng.choice([0, 0, 1]), np.int64) % (n + 2) - 1,
                    buf(8 * n + rng.choice([0, 0, 1]), np.uint32),
                    buf(n, np.int8) % 3,
                    buf(8 + rng.choice([0, 0, 0, -1]), np.uint64) % rng.choice([1, 3, 1 << 32])]
            try:
                found = NATIVE.setsum_fault(*args)
            except (ValueError, TypeError):
                continue
            assert -1 <= found < n, found
        print("ok")
        """)
    native()
    assert python_output(code, timeout=120) == "ok"
