"""The Kafka stream source's cut, without a broker: ``TopicScan`` fed messages as the
consumer hands them over (markers of three partitions, baseline chunks, a foreign
message); the frontier is each domain's last quiescence point whose marker every
partition holds, never inside a baseline that is not whole."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from replay import Frontier, InconsistentLog
from replay.spark._kafka import vouched_epochs
from replay.spark._kafka_points import ChunkSeen, TopicScan
from replay.spark._stream import _Scan, topic_frontier
from sequencer import EpochRecord
from sinks.codec import (
    HEADER_PARTITION,
    HEADER_WHOLE,
    SnapshotChunk,
    encode_epoch,
    encode_snapshot,
)
from tests.helpers import ConsumedMessage

pytestmark = pytest.mark.spark

DOMAIN = 0xD0
PARTITIONS = 3


def _record(seq: int, stream: int | None = None, domain: int = DOMAIN) -> EpochRecord:
    # Empty epochs, 10 ids each; the even ones are quiescence points.
    return EpochRecord(domain, seq, (seq - 1) * 10, seq * 10, 0, seq % 2 == 0, stream=stream)


def _marker(scan: TopicScan, partition: int, seq: int, domain: int = DOMAIN) -> None:
    headers = [(HEADER_PARTITION, encode_epoch(_record(seq, partition, domain))),
               (HEADER_WHOLE, encode_epoch(_record(seq, None, domain)))]
    offset = scan.read[partition]
    scan._take(partition, offset, encode_epoch(_record(seq, partition, domain)), headers)
    scan.read[partition] = offset + 1


def _chunk(scan: TopicScan, seq: int, index: int, last: bool, domain: int = DOMAIN,
           baseline_id: int = 0xB0) -> None:
    chunk = SnapshotChunk.build(domain, seq, seq * 10, baseline_id, index, last, None, None,
                                [])
    scan._take(0, scan.read[0], encode_snapshot(chunk), None)
    scan.read[0] += 1


def _cut(scan: TopicScan) -> int | None:
    p = topic_frontier(scan).get(DOMAIN)
    return None if p is None else p.epoch_seq


def _scan() -> TopicScan:
    scan = TopicScan("kafka://127.0.0.1:1/t")  # no broker: fed by hand
    scan.read = [0] * PARTITIONS
    return scan


def test_the_cut_waits_for_every_partition_and_for_a_whole_baseline() -> None:
    scan = _scan()
    for seq in range(1, 7):
        for p in (0, 1):
            _marker(scan, p, seq)
    for seq in (1, 2, 3):
        _marker(scan, 2, seq)
    assert _cut(scan) == 2  # partitions 0, 1 are at epoch 6; partition 2 vouched to 3
    _marker(scan, 2, 4)
    assert _cut(scan) == 4
    _chunk(scan, 4, 0, last=False)  # a baseline starts at 4: its states are partial
    _marker(scan, 2, 5)
    _marker(scan, 2, 6)
    assert _cut(scan) == 2  # the last point before the baseline
    _chunk(scan, 6, 1, last=True)
    assert _cut(scan) == 6


def test_a_lost_marker_or_a_foreign_message_is_refused() -> None:
    scan = _scan()
    for seq in (1, 2, 4):  # partition 1 lost its marker of epoch 3
        for p in range(PARTITIONS):
            if (p, seq) != (1, 3):
                _marker(scan, p, seq)
    _marker(scan, 0, 3)
    _marker(scan, 2, 3)
    with pytest.raises(InconsistentLog, match="skips from epoch"):
        scan.quiescence_points()
    headers: Any = [("other", b"x")]
    with pytest.raises(InconsistentLog, match="not a cdc-agent native record"):
        _scan()._take(1, 7, b"plain text", headers)


class _TopicPartition:
    """confluent_kafka.TopicPartition's stand-in."""

    def __init__(self, topic: str, partition: int, offset: int = -1) -> None:
        self.topic, self.partition, self.offset = topic, partition, offset


# What ``topic_consumer`` yields as the confluent_kafka module: its TopicPartition.
_CK = SimpleNamespace(TopicPartition=_TopicPartition)


def test_a_partition_stuck_below_its_end_times_out_while_others_keep_growing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Partition 0 never reaches its end (a gap no position covers) while partition 1,
    done, keeps receiving messages past its end: the look stops with KafkaUnavailable
    after its timeout (messages past the ends are no progress), and partition 1 is
    paused once it reached its end."""
    import contextlib
    import time

    import replay.spark._kafka_points as points
    from replay.spark._kafka import NATIVE_MAGIC
    from sinks.kafka import KafkaUnavailable

    skipped = NATIVE_MAGIC + b"an event: skipped by its first bytes"

    class Consumer:
        def __init__(self) -> None:
            self.calls, self.paused, self.next = 0, set[int](), {0: 0, 1: 0}

        def assign(self, parts: list[_TopicPartition]) -> None:
            pass

        def pause(self, parts: list[_TopicPartition]) -> None:
            self.paused.update(tp.partition for tp in parts)

        def consume(self, count: int, timeout: float) -> list[ConsumedMessage]:
            self.calls += 1
            assert self.calls < 2000, "the look spun on messages past the ends"
            time.sleep(0.001)  # (a real consume waits for messages)
            out = []
            if self.next[0] < 3:  # partition 0: offsets 0..2 of its end 5, then nothing
                out.append(ConsumedMessage(0, self.next[0], None, skipped))
                self.next[0] += 1
            out.append(ConsumedMessage(1, self.next[1], None, skipped))  # partition 1: always new
            self.next[1] += 1
            return out

        def position(self, parts: list[_TopicPartition]) -> list[_TopicPartition]:
            return [_TopicPartition("t", tp.partition, 3) for tp in parts]

    consumer = Consumer()

    @contextlib.contextmanager
    def fake(*args: Any, **kwargs: Any) -> Any:
        yield _CK, consumer, [0, 0], [5, 2]

    monkeypatch.setattr(points, "topic_consumer", fake)
    scan = TopicScan("kafka://127.0.0.1:1/t")
    with pytest.raises(KafkaUnavailable, match="stalled"):
        scan.advance(timeout=0.3)
    assert scan.read == [3, 2] and 1 in consumer.paused


def _keep_everything(markers: list[Any], chunks: list[ChunkSeen]) -> Frontier:
    """The cut as the scan made it before it forgot anything: every marker ever read
    checked from the start at each look, every chunk header replayed."""
    records, _ = vouched_epochs(markers, PARTITIONS)
    scan = _Scan()
    for r in records:
        if r.quiescent:  # every point (_Scan.point keeps only those the cut can use)
            scan.points.setdefault(r.domain_id, []).append((r.epoch_seq, r.end_id))
    for c in chunks:
        scan.chunk(c.domain_id, c.baseline_id, c.epoch_seq, c.last)
    return scan.frontier()


_KINDS = ("marker",) * 8 + ("copy", "chunk", "look", "look")


@settings(max_examples=60, deadline=None)
# Three vouched points (2, 4, 6), a look, then a chunk at the last one: the cut is 4, so
# the look, with no chunk seen yet, must have kept 4; after two more points, still 4.
@example(
    steps=[*[("marker", 0, p, False) for _ in range(6) for p in range(PARTITIONS)],
           ("look", 0, 0, False), ("chunk", 0, 0, False),
           *[("marker", 0, p, False) for _ in range(2) for p in range(PARTITIONS)]],
    lost=None)
@given(st.lists(st.tuples(st.sampled_from(_KINDS), st.integers(0, 1),
                          st.integers(0, PARTITIONS - 1), st.booleans()),
                min_size=40, max_size=150),
       st.none() | st.integers(0, 80))
def test_forgetting_vouched_markers_changes_no_cut(
        steps: list[tuple[str, int, int, bool]], lost: int | None) -> None:
    """Two domains' markers over three partitions in any interleaving (copies of earlier
    markers, baseline chunks, maybe a lost marker, step ``lost``): at every look the
    scan that forgets the vouched epochs' markers cuts where the keep-everything scan
    cuts (or refuses as it does), and it keeps exactly the markers of epochs not every
    partition vouched for."""
    scan = _scan()
    every: list[Any] = []
    chunks: list[ChunkSeen] = []
    sent: dict[tuple[int, int], int] = {}  # (partition, domain) -> last epoch sent
    for step, (kind, d, partition, last) in enumerate([*steps, ("look", 0, 0, False)]):
        domain = DOMAIN + d
        if kind in ("marker", "copy"):
            lane = (partition, domain)
            sent_last = sent.get(lane, 0)
            seq = sent_last + (2 if step == lost else 1)  # (lost: one epoch skipped)
            if kind == "copy":
                if not sent_last:
                    continue
                seq = 1 + (len(every) % sent_last)  # some epoch it sent already
            _marker(scan, partition, seq, domain)
            every.append(scan.markers[-1])
            sent[lane] = max(sent_last, seq)
        elif kind == "chunk":
            seq = sent.get((0, domain), 0)
            baseline = 0xB0 + sum(c.domain_id == domain and c.last for c in chunks)
            _chunk(scan, seq, 0, last, domain, baseline)
            chunks.append(ChunkSeen(domain, baseline, seq, last))
        else:
            try:
                expected: Frontier | str = _keep_everything(every, chunks)
            except InconsistentLog as exc:
                expected = str(exc)
            try:
                got: Frontier | str = topic_frontier(scan)
            except InconsistentLog as exc:
                got = str(exc)
            assert got == expected
            if isinstance(got, str):
                return  # (the stream stops here)
            vouched = {r.domain_id: r.epoch_seq for r in vouched_epochs(every, PARTITIONS)[0]}
            assert scan.markers == [m for m in every if _epoch_of(m)[1] > vouched.get(
                _epoch_of(m)[0], 0)]
    assert scan.taken == len(every)


def _epoch_of(marker: Any) -> tuple[int, int]:
    from sinks.codec import decode

    whole = decode(marker[3])
    assert isinstance(whole, EpochRecord)
    return whole.domain_id, whole.epoch_seq


def test_what_the_scan_keeps_does_not_grow_with_the_topic() -> None:
    """500 epochs of two domains, partition 2 a little behind, a look after each:
    the scan never holds more than the few markers partition 2 has not matched yet,
    of a baseline's many chunks only the two the cut reads, and of each domain's
    quiescence points the last and the last before its first baseline."""
    scan = _scan()
    most = 0
    for seq in range(1, 501):
        for domain in (DOMAIN, DOMAIN + 1):
            for p in (0, 1):
                _marker(scan, p, seq, domain)
            if seq > 3:
                _marker(scan, 2, seq - 3, domain)
        if seq % 50 == 0:
            for index in range(20):
                _chunk(scan, seq, index, index == 19, baseline_id=seq)
        cut = topic_frontier(scan).get(DOMAIN)
        assert seq < 5 or (cut is not None and cut.epoch_seq in (seq - 3, seq - 4))
        most = max(most, len(scan.markers))
        assert all(len(points) <= 2 for points in scan.points.values())
    assert scan.taken > 2_900 and most <= 2 * 2 * 4
    assert len(scan.chunks) == 2
    assert [e for e, _ in scan.points[DOMAIN]] == [48, 496]  # (even epochs are points)


class _Held:
    """A topic of three partitions served by a stand-in for ``topic_consumer``: each
    partition's messages ``(value, headers)`` from offset ``low[p]`` on."""

    def __init__(self, messages: dict[int, list[tuple[bytes, Any]]], low: list[int]) -> None:
        self.messages, self.low = messages, low
        self.assigned: list[int] = []

    def consumer(self, *args: Any, **kwargs: Any) -> Any:
        import contextlib

        held = self

        class Consumer:
            def __init__(self) -> None:
                self.at: dict[int, int] = {}

            def assign(self, parts: list[_TopicPartition]) -> None:
                self.at = {tp.partition: tp.offset for tp in parts}
                held.assigned = [self.at.get(p, -1) for p in range(PARTITIONS)]

            def pause(self, parts: list[_TopicPartition]) -> None:
                pass

            def consume(self, count: int, timeout: float) -> list[ConsumedMessage]:
                out = [ConsumedMessage(p, o, None, *held.messages[p][o])
                       for p, first in self.at.items()
                       for o in range(first, len(held.messages[p]))]
                self.at = {p: len(held.messages[p]) for p in self.at}
                return out

        ends = [len(held.messages[p]) for p in range(PARTITIONS)]
        return contextlib.nullcontext((_CK, Consumer(), list(self.low), ends))


def test_a_restarted_look_starts_at_the_saved_offsets(monkeypatch: pytest.MonkeyPatch) -> None:
    """A restarted query's look at the topic starts at its saved point's offsets
    (``marker_starts`` at the point's frontier), reads only from there and cuts where a
    look from the topic's start cuts; offsets the topic no longer holds (retention)
    start it at the first offset held, without the point (here: refused, the topic lost
    the domain's first epochs)."""
    import json

    import replay.spark._kafka_points as points
    from replay import Frontier, Position
    from replay.spark._kafka import NATIVE_MAGIC
    from replay.spark._stream import _PointsReader
    from replay.spark._topic_resume import marker_starts

    messages: dict[int, list[tuple[bytes, Any]]] = {p: [] for p in range(PARTITIONS)}
    for seq in range(1, 13):
        for p in range(PARTITIONS if seq <= 9 else 2):  # partition 2 is behind
            messages[p].append((NATIVE_MAGIC + b"an event", None))
            headers = [(HEADER_PARTITION, encode_epoch(_record(seq, p))),
                       (HEADER_WHOLE, encode_epoch(_record(seq)))]
            messages[p].append((encode_epoch(_record(seq, p)), headers))
    markers = [(p, o, dict(m[1])[HEADER_PARTITION], dict(m[1])[HEADER_WHOLE])
               for p in range(PARTITIONS) for o, m in enumerate(messages[p]) if m[1]]
    ends = [len(messages[p]) for p in range(PARTITIONS)]
    at = Frontier.of([Position(DOMAIN, 4, 40)])
    starts = marker_starts(markers, {DOMAIN: 4}, ends)
    topic = _Held(messages, [0, 0, 0])
    monkeypatch.setattr(points, "topic_consumer", topic.consumer)
    whole = TopicScan("kafka://127.0.0.1:1/t")
    whole.advance()
    assert topic.assigned == [0, 0, 0]
    source = _PointsReader({"uri": "kafka://127.0.0.1:1/t", "resume_offsets": json.dumps(
        starts), "resume_frontier": str(at)})  # as stream_changesets starts it
    offset = source.latestOffset()
    assert topic.assigned == starts and min(starts) > 0
    assert offset["frontier"] == str(topic_frontier(whole)) == str(Frontier.of(
        [Position(DOMAIN, 8, 80)]))
    assert source._topic is not None and source._topic.taken < whole.taken
    trimmed = _Held(messages, [starts[0] + 1, 0, 0])
    monkeypatch.setattr(points, "topic_consumer", trimmed.consumer)
    late = TopicScan("kafka://127.0.0.1:1/t")
    late.resume_from(starts, at)
    late.advance()
    assert trimmed.assigned == [starts[0] + 1, 0, 0]
    with pytest.raises(InconsistentLog, match="starts in the middle"):
        topic_frontier(late)
