"""The consistency proof: heavy concurrent overlap, then replay gives states the store had."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from agent._workload import Workload
from replay import Assembler, InconsistentLog
from sequencer import ChangeEvent, EpochRecord, Record
from tests.helpers import Captured, bits


@pytest.fixture(scope="module")
def run() -> Captured:
    """8 writer threads x 1500 random batches on 24 cells, captured into memory."""
    captured = Captured()
    Workload(threads=8, batches=1500, seed=1).run(captured.agent)
    captured.agent.close()
    return captured


def quiescent_intervals(records: Sequence[Record]) -> list[list[Record]]:
    """Split the log after each quiescence marker."""
    intervals: list[list[Record]] = [[]]
    for record in records:
        intervals[-1].append(record)
        if isinstance(record, EpochRecord) and record.quiescent:
            intervals.append([])
    return [i for i in intervals if i]


def test_every_quiescent_snapshot_equals_the_store(run: Captured) -> None:
    """At each quiescence point the replayed state is the store's state, bit for bit."""
    snapshots = list(Assembler().replay(run.sink.records))
    assert len(snapshots) == len(run.at_quiescence) > 50
    for snap in snapshots:
        assert bits(snap.state) == run.at_quiescence[(snap.domain_id, snap.epoch_seq)]
    assert bits(snapshots[-1].state) == bits(run.store.snapshot())
    events = sum(isinstance(r, ChangeEvent) for r in run.sink.records)
    assert events == run.agent.stats["events"] > 20_000


def test_duplicated_and_reordered_records_give_the_same_snapshots(run: Captured) -> None:
    """Shuffle and duplicate records inside each quiescent interval: same snapshots."""
    rng = random.Random(7)
    mangled: list[Record] = []
    previous: list[Record] = []
    for interval in quiescent_intervals(run.sink.records):
        body, marker = interval[:-1], interval[-1]
        body = body + rng.sample(body, len(body) // 3)  # duplicates
        body += rng.sample(previous, min(3, len(previous)))  # late copies of older records
        rng.shuffle(body)
        mangled += [*body, marker]
        if rng.random() < 0.2:
            mangled.append(marker)  # a duplicated marker
        previous = interval
    expected = [(s.epoch_seq, bits(s.state)) for s in Assembler().replay(run.sink.records)]
    assert [(s.epoch_seq, bits(s.state)) for s in Assembler().replay(mangled)] == expected


@pytest.mark.parametrize("seed", range(6))
def test_dropping_one_event_is_detected(run: Captured, seed: int) -> None:
    """Remove any single event: InconsistentLog, and no snapshot after the loss."""
    rng = random.Random(seed)
    records = list(run.sink.records)
    event_positions = [i for i, r in enumerate(records) if isinstance(r, ChangeEvent)]
    lost = rng.choice(event_positions)
    lost_event = records.pop(lost)
    assert isinstance(lost_event, ChangeEvent)
    good = []
    with pytest.raises(InconsistentLog) as info:
        for snap in Assembler().replay(records):
            good.append(snap)
    assert info.value.domain_id == lost_event.domain_id
    # Everything handed out before the error is a state the store really had.
    for snap in good:
        assert bits(snap.state) == run.at_quiescence[(snap.domain_id, snap.epoch_seq)]
    assert not any(
        isinstance(r, EpochRecord) and r.covers(lost_event.batch_id) and r.epoch_seq <= s.epoch_seq
        for s in good for r in run.sink.records
    )


def test_altering_one_value_is_detected(run: Captured) -> None:
    """Change an event's new value: the cell check or the setsum catches it."""
    records = list(run.sink.records)
    index = next(i for i, r in enumerate(records)
                 if isinstance(r, ChangeEvent) and r.new != "tampered")
    event = records[index]
    assert isinstance(event, ChangeEvent)
    records[index] = ChangeEvent(event.domain_id, event.batch_id, event.seq, event.table,
                                 event.row, event.column, event.old, "tampered")
    with pytest.raises(InconsistentLog):
        list(Assembler().replay(records))


def test_encoded_log_replays_like_the_records(run: Captured) -> None:
    """Records through the codec's bytes replay to the same snapshots."""
    from sinks.codec import EventBatch, decode, encode_epoch, encode_events

    messages: list[bytes] = []
    events: list[ChangeEvent] = []
    for record in run.sink.records:
        if isinstance(record, ChangeEvent):
            events.append(record)
            continue
        if events:
            messages.append(encode_events(EventBatch.from_events(events)))
            events = []
        messages.append(encode_epoch(record))
    decoded = [decode(m) for m in messages]
    expected = [(s.epoch_seq, bits(s.state)) for s in Assembler().replay(run.sink.records)]
    assert [(s.epoch_seq, bits(s.state)) for s in Assembler().replay(decoded)] == expected


def test_streaming_and_bulk_verification_agree(run: Captured) -> None:
    """feed() one record at a time and changesets() in bulk give identical changesets."""
    streaming = Assembler()
    one_by_one = [c for record in run.sink.records for c in streaming.feed(record)]
    bulk = list(Assembler().changesets(run.sink.records))
    assert len(one_by_one) == len(bulk)
    for a, b in zip(one_by_one, bulk, strict=True):
        assert (a.epoch_seq, a.event_count, a.position) == (b.epoch_seq, b.event_count, b.position)
        assert bits(a.changes) == bits(b.changes) and bits(a.before) == bits(b.before)
