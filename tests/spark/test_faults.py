"""Faults in the log: duplicates are harmless, anything lost or altered is refused."""

from __future__ import annotations

import collections
import dataclasses
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from replay import Assembler, InconsistentLog
from replay.spark import LogReplay, UnsupportedRecord, to_state
from sequencer import EpochRecord
from sinks._setsum import Setsum
from sinks.codec import EventBatch
from sinks.wal3 import CorruptFragment, LogReader, Wal3Sink, fragment_path
from tests.helpers import bits
from tests.spark._logs import Logged, Message, messages, rewrite

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


def _epoch_of(records: list[Message], domain_id: int, batch_id: int) -> EpochRecord:
    return next(r for r in records if isinstance(r, EpochRecord)
                and r.domain_id == domain_id and r.covers(batch_id))


def _last_point_before(records: list[Message], domain_id: int, epoch_seq: int) -> int | None:
    points = [r.epoch_seq for r in records if isinstance(r, EpochRecord)
              and r.domain_id == domain_id and r.quiescent and r.epoch_seq < epoch_seq]
    return max(points) if points else None


def _pick_event(records: list[Message], rng: random.Random) -> tuple[int, int]:
    """A (message index, row) of an event in an epoch that has a quiescence point after."""
    last_point = {r.domain_id: r.epoch_seq for r in records
                  if isinstance(r, EpochRecord) and r.quiescent}
    while True:
        i = rng.choice([i for i, r in enumerate(records) if isinstance(r, EventBatch)])
        batch = records[i]
        assert isinstance(batch, EventBatch)
        row = rng.randrange(len(batch))
        domain_id = batch.data.column("domain_id")[row].as_py()
        epoch = _epoch_of(records, domain_id, batch.data.column("batch_id")[row].as_py())
        if epoch.epoch_seq <= last_point[domain_id]:
            return i, row


def _lost_epoch_record(records: list[Message]) -> int:
    """The index of an epoch record whose loss can be told: it is the only copy of
    itself and a later quiescence point of its domain is in the log. Which records
    qualify depends on how the writer threads interleaved (a domain whose writers ran
    late can have few epochs, and a record in a domain's tail is lost undetectably)."""
    epochs = [(i, r) for i, r in enumerate(records) if isinstance(r, EpochRecord)]
    copies = collections.Counter(r for _, r in epochs)
    last_point = {r.domain_id: r.epoch_seq for _, r in epochs if r.quiescent}
    told = [i for i, r in epochs if copies[r] == 1 and r.epoch_seq < last_point[r.domain_id]]
    assert told, "the base log has no epoch record whose loss can be told"
    return told[len(told) // 3]


def _replace_row(batch: EventBatch, row: int, column: str, value: bytes) -> EventBatch:
    data = batch.data
    index = data.schema.get_field_index(column)
    values = data.column(index).to_pylist()
    values[row] = value
    return EventBatch(data.set_column(index, data.schema.field(index),
                                      pa.array(values, pa.binary())))


def _drop_row(batch: EventBatch, row: int) -> EventBatch:
    keep = pc.not_equal(pa.array(range(len(batch))), row)
    return EventBatch(batch.data.filter(keep))


@pytest.fixture(scope="module")
def base(small: Logged) -> list[Message]:
    return messages(small.uri)


@pytest.fixture
def open_log(spark: Any, tmp_path: Path) -> Callable[[list[Message]], LogReplay]:
    def run(records: list[Message]) -> LogReplay:
        return LogReplay(spark, rewrite(tmp_path / "log", records))
    return run


def test_duplicated_messages_and_records_are_harmless(open_log: Any, base: list[Message],
                                                      small: Logged) -> None:
    """A third of the messages delivered twice (some late, after their interval): the
    same states as the original log."""
    rng = random.Random(5)
    doubled: list[Message] = []
    for record in base:
        doubled.append(record)
        if rng.random() < 0.33:
            doubled.append(record)
    doubled += rng.sample(base, 10)  # late copies, after their intervals closed
    replay = open_log(doubled)
    assert bits(to_state(replay.snapshot())) == small.final
    assert replay.events().count() == small.events
    report = replay.verify().collect()  # one row per epoch, each copy counted once
    assert len(report) == sum(map(len, replay.epochs.epochs.values()))
    assert sum(r["events"] for r in report) == small.events
    replay.unpersist()


@pytest.mark.parametrize("seed", [1, 2])
def test_a_dropped_event_is_refused(open_log: Any, base: list[Message], small: Logged,
                                    seed: int) -> None:
    """One event lost: InconsistentLog naming its domain and epoch; points before it
    still give the store's states, nothing after it is produced."""
    rng = random.Random(seed)
    i, row = _pick_event(base, rng)
    batch = base[i]
    assert isinstance(batch, EventBatch)
    domain_id = batch.data.column("domain_id")[row].as_py()
    epoch = _epoch_of(base, domain_id, batch.data.column("batch_id")[row].as_py())
    records = [*base[:i], _drop_row(batch, row), *base[i + 1:]]
    replay = open_log(records)
    with pytest.raises(InconsistentLog) as info:
        replay.snapshot()
    assert info.value.domain_id == domain_id
    assert info.value.epoch_seq is not None
    assert info.value.epoch_seq <= _interval_end(base, domain_id, epoch.epoch_seq)
    with pytest.raises(InconsistentLog):
        replay.verify()
    with pytest.raises(InconsistentLog):
        replay.changesets()
    before = _last_point_before(base, domain_id, epoch.epoch_seq)
    if before is not None:
        token = str(replay.epochs.position(domain_id, before))
        state = small.domain_state(domain_id, bits(to_state(replay.snapshot(token))))
        assert state == small.at_quiescence[(domain_id, before)]
    replay.unpersist()


def _interval_end(records: list[Message], domain_id: int, epoch_seq: int) -> int:
    return min(r.epoch_seq for r in records if isinstance(r, EpochRecord)
               and r.domain_id == domain_id and r.quiescent and r.epoch_seq >= epoch_seq)


@pytest.mark.parametrize("column", ["new", "old"])
def test_an_altered_value_is_refused(open_log: Any, base: list[Message], column: str) -> None:
    """One event's value changed (fragments still valid): InconsistentLog."""
    i, row = _pick_event(base, random.Random(11))
    batch = base[i]
    assert isinstance(batch, EventBatch)
    records = [*base[:i], _replace_row(batch, row, column, b"\x04tampered"), *base[i + 1:]]
    with pytest.raises(InconsistentLog) as info:
        open_log(records).verify()
    assert info.value.domain_id == batch.data.column("domain_id")[row].as_py()


def test_an_altered_duplicate_is_refused(open_log: Any, base: list[Message]) -> None:
    """A second copy of a message that differs in one value: InconsistentLog."""
    i, row = _pick_event(base, random.Random(12))
    batch = base[i]
    assert isinstance(batch, EventBatch)
    records = [*base[:i + 1], _replace_row(batch, row, "new", b"\x02" + bytes(8)),
               *base[i + 1:]]
    with pytest.raises(InconsistentLog, match=r"two different copies|chain|setsum|replace"):
        open_log(records).verify()


def test_a_lost_message_is_refused(open_log: Any, base: list[Message]) -> None:
    """A whole message of events lost (as if its fragment were): InconsistentLog."""
    i, _ = _pick_event(base, random.Random(13))
    with pytest.raises(InconsistentLog):
        open_log([*base[:i], *base[i + 1:]]).verify()


def test_a_missing_epoch_record_is_refused(open_log: Any, base: list[Message]) -> None:
    """An epoch record lost before a later quiescence point: InconsistentLog naming it."""
    i = _lost_epoch_record(base)
    lost = base[i]
    assert isinstance(lost, EpochRecord)
    rest = [*base[:i], *base[i + 1:]]
    with pytest.raises(InconsistentLog, match="never arrived") as python:
        list(Assembler().replay(iter(rest)))  # the reference reader agrees
    with pytest.raises(InconsistentLog, match="never arrived") as info:
        open_log(rest).verify()
    assert (info.value.domain_id, info.value.epoch_seq) == (lost.domain_id, lost.epoch_seq)
    assert (python.value.domain_id, python.value.epoch_seq) == (lost.domain_id, lost.epoch_seq)


def test_two_different_records_for_one_epoch_are_refused(open_log: Any,
                                                         base: list[Message]) -> None:
    """A second copy of an epoch record that differs (its count): InconsistentLog naming
    both records, as the Python reader refuses it."""
    i = _lost_epoch_record(base)
    first = base[i]
    assert isinstance(first, EpochRecord)
    other = dataclasses.replace(first, event_count=first.event_count + 1)
    records = [*base[:i + 1], other, *base[i + 1:]]
    with pytest.raises(InconsistentLog, match="two different records") as python:
        list(Assembler().replay(iter(records)))
    with pytest.raises(InconsistentLog, match="two different records") as info:
        open_log(records).verify()
    assert (info.value.domain_id, info.value.epoch_seq) == (first.domain_id, first.epoch_seq)
    assert (python.value.domain_id, python.value.epoch_seq) == (
        first.domain_id, first.epoch_seq)
    assert str(first) in str(info.value) and str(other) in str(info.value)


def test_a_record_kind_it_does_not_know_is_refused(spark: Any, tmp_path: Path,
                                                   base: list[Message]) -> None:
    """A record of a kind replay.spark does not handle is an error, never skipped."""
    uri = f"file://{tmp_path / 'log'}"
    sink = Wal3Sink(uri)
    sink.write_events(next(r for r in base if isinstance(r, EventBatch)))
    sink.writer.submit(b"CDC\x01\x7fsomething new").result()
    sink.close()
    with pytest.raises(UnsupportedRecord, match="offset 2"):
        LogReplay(spark, uri).verify()


def test_orphan_fragments_in_the_folder_are_not_read(spark: Any, tmp_path: Path,
                                                     small: Logged) -> None:
    """Only the manifest's fragments count: an extra file in log/ changes nothing."""
    copy = tmp_path / "log"
    shutil.copytree(small.path, copy)
    reader = LogReader(f"file://{copy}")
    fragments = reader.scan()
    source = copy / fragments[0].path
    orphan = copy / fragment_path(fragments[-1].seq_no + 1)
    orphan.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(source, orphan)  # the same events again, and an epoch record: unlisted
    replay = LogReplay(spark, f"file://{copy}")
    assert len(replay.source.fragments) == len(fragments)
    assert bits(to_state(replay.snapshot())) == small.final
    replay.unpersist()


def test_a_corrupt_fragment_is_refused(spark: Any, tmp_path: Path, small: Logged) -> None:
    """A fragment whose bytes no longer match the manifest: CorruptFragment, named."""
    copy = tmp_path / "log"
    shutil.copytree(small.path, copy)
    fragments = LogReader(f"file://{copy}").scan()  # how many depends on the writers' pace
    fragment = fragments[len(fragments) // 2]
    good = LogReader(f"file://{copy}").fetch(fragment)
    from sinks.wal3 import encode_fragment

    bodies = [r.body for r in good]
    bodies[0] = bodies[0][:-1] + bytes([bodies[0][-1] ^ 1])
    data, _ = encode_fragment(good[0].offset, good[0].timestamp_us, bodies)
    (copy / fragment.path).write_bytes(data)
    with pytest.raises(CorruptFragment, match=fragment.path.split("/")[-1]):
        LogReplay(spark, f"file://{copy}").verify()


def _cell_events(records: list[Message]) -> dict[tuple[Any, ...], list[tuple[int, int]]]:
    """Each cell's events as (message index, row), in log order."""
    cells: dict[tuple[Any, ...], list[tuple[int, int]]] = {}
    for i, record in enumerate(records):
        if isinstance(record, EventBatch):
            d = record.data
            for row in range(len(record)):
                key = (d.column("table")[row].as_py(), d.column("row")[row].as_py(),
                       d.column("column")[row].as_py())
                cells.setdefault(key, []).append((i, row))
    return cells


def _with_true_setsum(records: list[Message], domain_id: int, epoch: EpochRecord
                      ) -> list[Message]:
    """Recompute ``epoch``'s setsum from the events as they now are (a forger's move)."""
    from dataclasses import replace

    from sinks.codec import segment_digests

    digests = [digest for r in records if isinstance(r, EventBatch)
               for d, b, digest in segment_digests(r.data)
               if d == domain_id and epoch.covers(b)]
    forged = replace(epoch, setsum=Setsum.of_digests(digests).hexdigest())
    return [forged if r is epoch else r for r in records]


def test_only_the_setsum_sees_a_changed_final_value(open_log: Any, base: list[Message]) -> None:
    """The last write of a cell altered: the chain still holds, the setsum refuses it."""
    last_point = {r.domain_id: r.epoch_seq for r in base
                  if isinstance(r, EpochRecord) and r.quiescent}
    for where in (w for _, w in sorted(_cell_events(base).items())):
        i, row = where[-1]
        batch = base[i]
        assert isinstance(batch, EventBatch)
        domain_id = batch.data.column("domain_id")[row].as_py()
        epoch = _epoch_of(base, domain_id, batch.data.column("batch_id")[row].as_py())
        if epoch.epoch_seq <= last_point[domain_id] and batch.data.column("new")[row].as_py():
            break
    assert isinstance(batch, EventBatch)
    records = [*base[:i], _replace_row(batch, row, "new", b"\x04forged"), *base[i + 1:]]
    with pytest.raises(InconsistentLog, match="setsum") as info:
        open_log(records).verify()
    assert (info.value.domain_id, info.value.epoch_seq) == (domain_id, epoch.epoch_seq)


def _interval_of(records: list[Message], domain_id: int, batch_id: int) -> int:
    """The quiescence point that ends the interval holding batch ``batch_id``."""
    seq = _epoch_of(records, domain_id, batch_id).epoch_seq
    return min(r.epoch_seq for r in records if isinstance(r, EpochRecord)
               and r.domain_id == domain_id and r.quiescent and r.epoch_seq >= seq)


def test_the_cell_check_sees_a_broken_chain_under_a_forged_setsum(
        open_log: Any, base: list[Message]) -> None:
    """A write altered and its epoch's setsum recomputed, on a cell that a later
    interval writes again: the cell check refuses it, naming the cell. (A write whose
    value is the cell's last can be altered unseen but by the setsum; with concurrent
    writers, a write in the middle of a cell's writes in log order can be that one, when
    the writes after it cancel out in its own interval.)"""
    def interval(at: tuple[int, int]) -> tuple[int, int]:
        data = base[at[0]].data  # type: ignore[union-attr]
        domain_id = data.column("domain_id")[at[1]].as_py()
        return domain_id, _interval_of(base, domain_id, data.column("batch_id")[at[1]].as_py())

    cell, where = next((c, w) for c, w in sorted(_cell_events(base).items())
                       if len({interval(at) for at in w}) >= 2)
    first = min(interval(at) for at in where)
    i, row = [at for at in where if interval(at) == first][-1]
    batch = base[i]
    assert isinstance(batch, EventBatch)
    domain_id = batch.data.column("domain_id")[row].as_py()
    epoch = _epoch_of(base, domain_id, batch.data.column("batch_id")[row].as_py())
    records = [*base[:i], _replace_row(batch, row, "new", b"\x04forged"), *base[i + 1:]]
    records = _with_true_setsum(records, domain_id, epoch)
    with pytest.raises(InconsistentLog, match="cell state cannot be rebuilt") as info:
        open_log(records).verify()
    table, key, column = cell
    from sinks.codec import decode_key

    assert info.value.cell == (table, decode_key(key), column)
    assert info.value.domain_id == domain_id


def test_the_first_failure_of_an_interval_is_named_the_same_way_every_time(spark: Any) -> None:
    """In one interval the segment check wins over an epoch's record, which wins over a
    cell (even of an earlier epoch), whatever the messages and the input order; then the
    earlier epoch; an earlier interval wins over any rank. (A tie once went to whichever
    task answered first, so a dropped event was sometimes named by the cell whose chain
    it broke, not by its epoch's count, as the Python Kafka consumer names it.)"""
    from replay.spark._replay import RANK_CELL, RANK_EPOCH, RANK_SEGMENT, first_failures

    def found(rows: list[tuple[Any, ...]]) -> dict[tuple[int, bool], str]:
        frame = spark.createDataFrame(
            rows, "domain long, forgiven boolean, q long, epoch long, rank int, "
                  "table string, row binary, column string, message string").coalesce(1)
        return {(r["domain"], r["forgiven"]): r["f"]["message"]
                for r in first_failures(frame).collect()}

    cell = (1, False, 9, 8, RANK_CELL, "t", b"\x01", "c", "a cell")
    record = (1, False, 9, 8, RANK_EPOCH, None, None, None, "b the record")
    segment = (1, False, 9, 8, RANK_SEGMENT, None, None, None, "z the segment")
    earlier = (1, False, 5, 5, RANK_CELL, "t", b"\x02", "c", "y an earlier cell")
    forgiven = (1, True, 2, 2, RANK_CELL, "t", b"\x03", "c", "x forgiven")
    earlier_epoch = (1, False, 9, 7, RANK_CELL, "t", b"\x04", "c", "a cell of epoch 7")
    later_record = (1, False, 9, 9, RANK_EPOCH, None, None, None, "a record of epoch 9")
    assert found([cell, record]) == {(1, False): "b the record"}
    assert found([earlier_epoch, cell, later_record, record]) == {
        (1, False): "b the record"}
    assert found([cell, record, segment]) == {(1, False): "z the segment"}
    assert found([segment, record, cell, earlier, forgiven]) == {
        (1, False): "y an earlier cell", (1, True): "x forgiven"}
