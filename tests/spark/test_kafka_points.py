"""The Kafka stream source's cut, without a broker: ``TopicScan`` fed messages as the
consumer hands them over (markers of three partitions, baseline chunks, a foreign
message); the frontier is each domain's last quiescence point whose marker every
partition holds, never inside a baseline that is not whole."""

from __future__ import annotations

from typing import Any

import pytest

from replay import InconsistentLog
from replay.spark._kafka_points import TopicScan
from replay.spark._stream import topic_frontier
from sequencer import EpochRecord
from sinks.codec import (
    HEADER_PARTITION,
    HEADER_WHOLE,
    SnapshotChunk,
    encode_epoch,
    encode_snapshot,
)

pytestmark = pytest.mark.spark

DOMAIN = 0xD0
PARTITIONS = 3


def _record(seq: int, stream: int | None = None) -> EpochRecord:
    # Empty epochs, 10 ids each; the even ones are quiescence points.
    return EpochRecord(DOMAIN, seq, (seq - 1) * 10, seq * 10, 0, seq % 2 == 0, stream=stream)


def _marker(scan: TopicScan, partition: int, seq: int) -> None:
    headers = [(HEADER_PARTITION, encode_epoch(_record(seq, partition))),
               (HEADER_WHOLE, encode_epoch(_record(seq)))]
    offset = scan.read[partition]
    scan._take(partition, offset, encode_epoch(_record(seq, partition)), headers)
    scan.read[partition] = offset + 1


def _chunk(scan: TopicScan, seq: int, index: int, last: bool) -> None:
    chunk = SnapshotChunk.build(DOMAIN, seq, seq * 10, 0xB0, index, last, None, None, [])
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

    class Message:
        def __init__(self, partition: int, offset: int) -> None:
            self._p, self._o = partition, offset

        def error(self) -> None:
            return None

        def partition(self) -> int:
            return self._p

        def offset(self) -> int:
            return self._o

        def value(self) -> bytes:
            return NATIVE_MAGIC + b"an event: skipped by its first bytes"

        def headers(self) -> None:
            return None

    class TopicPartition:
        def __init__(self, topic: str, partition: int, offset: int = -1) -> None:
            self.topic, self.partition, self.offset = topic, partition, offset

    class Consumer:
        def __init__(self) -> None:
            self.calls, self.paused, self.next = 0, set[int](), {0: 0, 1: 0}

        def assign(self, parts: list[TopicPartition]) -> None:
            pass

        def pause(self, parts: list[TopicPartition]) -> None:
            self.paused.update(tp.partition for tp in parts)

        def consume(self, count: int, timeout: float) -> list[Message]:
            self.calls += 1
            assert self.calls < 2000, "the look spun on messages past the ends"
            time.sleep(0.001)  # (a real consume waits for messages)
            out = []
            if self.next[0] < 3:  # partition 0: offsets 0..2 of its end 5, then nothing
                out.append(Message(0, self.next[0]))
                self.next[0] += 1
            out.append(Message(1, self.next[1]))  # partition 1: new messages, always
            self.next[1] += 1
            return out

        def position(self, parts: list[TopicPartition]) -> list[TopicPartition]:
            return [TopicPartition("t", tp.partition, 3) for tp in parts]

    class Ck:
        pass

    Ck.TopicPartition = TopicPartition  # type: ignore[attr-defined]
    consumer = Consumer()

    @contextlib.contextmanager
    def fake(*args: Any, **kwargs: Any) -> Any:
        yield Ck, consumer, [0, 0], [5, 2]

    monkeypatch.setattr(points, "topic_consumer", fake)
    scan = TopicScan("kafka://127.0.0.1:1/t")
    with pytest.raises(KafkaUnavailable, match="stalled"):
        scan.advance(timeout=0.3)
    assert scan.read == [3, 2] and 1 in consumer.paused
