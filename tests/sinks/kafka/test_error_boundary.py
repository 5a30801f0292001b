"""Fault injection at the Kafka adapters' one error boundary, without a broker.

confluent-kafka's classes are replaced by fakes whose calls raise ``KafkaException``:
every call the producer, admin client and consumer make comes out as our error type,
its message names the adapter and the operation, and the vendor exception is chained.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, ClassVar

import confluent_kafka as ck
import pytest

from replay.kafka import KafkaConsistentConsumer
from sequencer import EpochRecord
from sinks import EventBatch
from sinks.kafka import (
    KafkaConfigError,
    KafkaDeliveryError,
    KafkaSink,
    KafkaSinkError,
    KafkaUnavailable,
)

TOPIC = "t"


def vendor_error(code: int = ck.KafkaError._TRANSPORT) -> ck.KafkaException:
    return ck.KafkaException(ck.KafkaError(code, "injected"))


def metadata(partitions: int = 2) -> Any:
    parts = {p: SimpleNamespace(leader=1) for p in range(partitions)}
    return SimpleNamespace(topics={TOPIC: SimpleNamespace(error=None, partitions=parts)})


class FakeClient:
    """A producer or consumer; ``fail`` names the methods that raise."""

    fail: ClassVar[dict[str, Callable[[], BaseException]]] = {}

    def __init__(self, settings: dict[str, Any]) -> None:
        if "__init__" in self.fail:
            raise self.fail["__init__"]()

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if name in self.fail:
                raise self.fail[name]()
            if name == "list_topics":
                return metadata()
            if name == "committed":
                return [ck.TopicPartition(TOPIC, p, -1001) for p in range(2)]
            if name in ("flush", "consume"):
                return 0 if name == "flush" else []
            return None
        return call

    def __len__(self) -> int:
        return 0


def inject(monkeypatch: pytest.MonkeyPatch, **fail: Callable[[], BaseException]) -> None:
    monkeypatch.setattr(FakeClient, "fail", fail)
    monkeypatch.setattr(ck, "Producer", FakeClient)
    monkeypatch.setattr(ck, "Consumer", FakeClient)


def check(info: pytest.ExceptionInfo[BaseException], kind: type[BaseException],
          *words: str) -> None:
    assert info.type is kind, info.value
    assert isinstance(info.value.__cause__, (ck.KafkaException, ValueError)), "not chained"
    for word in words:
        assert word in str(info.value), (word, str(info.value))


@pytest.mark.parametrize(("method", "kind", "words"), [
    ("__init__", KafkaConfigError, ("Kafka producer", "creating the producer")),
    ("list_topics", KafkaUnavailable, ("reading the metadata of topic 't'", "no Kafka broker")),
])
def test_producer_start_up_errors_are_mapped(monkeypatch: pytest.MonkeyPatch, method: str,
                                             kind: type[BaseException],
                                             words: tuple[str, ...]) -> None:
    """The producer's constructor and metadata call raise our errors, chained."""
    inject(monkeypatch, **{method: vendor_error})
    with pytest.raises(kind) as info:
        KafkaSink("x:1", TOPIC)
    check(info, kind, *words)


def test_a_refused_message_breaks_the_sink(monkeypatch: pytest.MonkeyPatch) -> None:
    """produce raising: KafkaDeliveryError naming the hand-over, and every later call fails."""
    inject(monkeypatch)
    sink = KafkaSink("x:1", TOPIC)
    monkeypatch.setattr(FakeClient, "fail", {"produce": vendor_error})
    from sequencer import ChangeEvent

    batch = EventBatch.from_events([ChangeEvent(1, 2, 0, "t", 1, "c", None, 5)])
    with pytest.raises(KafkaDeliveryError) as info:
        sink.write_events(batch)
    check(info, KafkaDeliveryError, "Kafka producer", "handing a message for topic 't'")
    monkeypatch.setattr(FakeClient, "fail", {})
    with pytest.raises(KafkaDeliveryError, match="did not keep 1 message"):
        sink.write_epoch(EpochRecord(1, 1, 0, 3, 1, True, (("t", 1),), "00" * 32))


def test_a_failed_flush_is_mapped(monkeypatch: pytest.MonkeyPatch) -> None:
    """flush raising: KafkaSinkError naming the flush, chained."""
    inject(monkeypatch)
    sink = KafkaSink("x:1", TOPIC)
    monkeypatch.setattr(FakeClient, "fail", {"flush": vendor_error})
    with pytest.raises(KafkaSinkError) as info:
        sink.flush()
    check(info, KafkaSinkError, "Kafka producer", "flushing the producer of topic 't'")


def test_admin_errors_are_mapped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Creating a missing topic: the admin client's failure is KafkaConfigError, chained;
    TOPIC_ALREADY_EXISTS is not a failure."""
    import confluent_kafka.admin as admin

    missing = SimpleNamespace(topics={})
    inject(monkeypatch)
    calls = iter([missing, missing, metadata(2), metadata(2)])
    monkeypatch.setattr(FakeClient, "__getattr__", _with_metadata(calls))
    codes = iter([ck.KafkaError.TOPIC_AUTHORIZATION_FAILED, ck.KafkaError.TOPIC_ALREADY_EXISTS])

    class Future:
        def result(self, timeout: float) -> None:
            raise vendor_error(next(codes))

    monkeypatch.setattr(admin, "AdminClient", lambda settings: SimpleNamespace(
        create_topics=lambda topics, request_timeout: {TOPIC: Future()}))
    with pytest.raises(KafkaConfigError) as info:
        KafkaSink("x:1", TOPIC, partitions=2)
    check(info, KafkaConfigError, "Kafka admin", "creating topic 't'")
    assert KafkaSink("x:1", TOPIC, partitions=2).partitions == 2  # already exists: fine


def _with_metadata(answers: Any) -> Any:
    def getattr_(self: FakeClient, name: str) -> Any:
        if name == "list_topics":
            return lambda *a, **k: next(answers)
        return lambda *a, **k: 0 if name == "flush" else None
    return getattr_


@pytest.mark.parametrize(("method", "make_error", "kind", "words"), [
    ("__init__", vendor_error, KafkaConfigError, ("Kafka consumer", "creating the consumer")),
    ("__init__", lambda: ValueError("group.id must be set"), KafkaConfigError,
     ("creating the consumer",)),
    ("list_topics", vendor_error, KafkaUnavailable, ("reading the metadata", "no Kafka broker")),
    ("committed", vendor_error, KafkaUnavailable, ("reading the committed offsets",)),
    ("assign", vendor_error, KafkaSinkError, ("assigning the partitions",)),
])
def test_consumer_start_up_errors_are_mapped(monkeypatch: pytest.MonkeyPatch, method: str,
                                             make_error: Callable[[], BaseException],
                                             kind: type[BaseException],
                                             words: tuple[str, ...]) -> None:
    """The consumer's constructor and start-up calls raise our errors, chained."""
    inject(monkeypatch, **{method: make_error})
    with pytest.raises(kind) as info:
        KafkaConsistentConsumer("x:1", TOPIC, group_id="g", startup_timeout=0.2)
    check(info, kind, *words)


def test_consumer_reads_are_mapped(monkeypatch: pytest.MonkeyPatch) -> None:
    """consume and get_watermark_offsets raise KafkaUnavailable; a failed commit is
    reported (False), not raised."""
    inject(monkeypatch)
    consumer = KafkaConsistentConsumer("x:1", TOPIC, group_id="g")
    monkeypatch.setattr(FakeClient, "fail", {"consume": vendor_error,
                                             "get_watermark_offsets": vendor_error})
    with pytest.raises(KafkaUnavailable) as info:
        consumer.poll(0.01)
    check(info, KafkaUnavailable, "Kafka consumer", "reading 't'")
    with pytest.raises(KafkaUnavailable) as info:
        consumer.end_offsets(0.01)
    check(info, KafkaUnavailable, "Kafka consumer", "reading the end of 't'")
