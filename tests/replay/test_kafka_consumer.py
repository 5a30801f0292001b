"""The consistent consumer's own logic without a broker: which committed token it resumes
from, and a poll that meets a damaged epoch after good ones."""

from __future__ import annotations

import random
from typing import Any

import pytest

from replay import Frontier, InconsistentLog, Position, _kafka_consumer
from replay._kafka_consumer import KafkaConsistentConsumer, furthest
from replay.kafka import KafkaLog, aconsume_consistent, consume_consistent
from sinks.codec import decode_native_event as decode_event
from tests.helpers import ConsumedMessage
from tests.sinks.kafka._simulate import Run, captured_run, simulate_topic


def test_resume_picks_the_furthest_token_not_the_longest() -> None:
    """Tokens of two commits: the furthest position wins, whatever the text lengths
    (a '+seen' suffix makes an older token longer; issue 10 item 12)."""
    older = Frontier.of([Position(0xA, 5, 0x500, seen=0xFFFF_FFFF)])
    newer = Frontier.of([Position(0xA, 9, 0x900)])
    assert len(str(older)) > len(str(newer))
    assert furthest([str(older), str(newer)]) == newer
    assert furthest([str(newer), str(older)]) == newer
    assert furthest([]) is None
    two = furthest(["a:3:30,b:7:70", "a:4:40,b:6:60"])
    assert two is not None
    assert [(p.domain_id, p.epoch_seq) for p in two] == [(0xA, 4), (0xB, 7)]


class _FakeConsumer:
    def __init__(self, messages: list[ConsumedMessage]) -> None:
        self.messages = messages

    def consume(self, limit: int, timeout: float) -> list[ConsumedMessage]:
        taken, self.messages = self.messages[:limit], self.messages[limit:]
        return taken


def _consumer(messages: list[ConsumedMessage], partitions: int) -> KafkaConsistentConsumer:
    """A consumer around a fake librdkafka consumer that hands out ``messages``."""
    consumer = object.__new__(KafkaConsistentConsumer)
    consumer._consumer = _FakeConsumer(messages)  # type: ignore[assignment]
    consumer._fatal = None
    consumer._failure = None
    consumer._hide = None
    consumer.topic = "t"
    consumer.log = KafkaLog(partitions, bulk=True)
    consumer.max_waiting_epochs = 0
    consumer.max_waiting_events = 0
    consumer._paused = []
    return consumer


@pytest.fixture(scope="module")
def run() -> Run:
    return captured_run(seed=21, threads=2, batches=60)


def _damaged(run: Run) -> list[ConsumedMessage]:
    """The run's topic (2 partitions, in order) with an event late in partition 0
    altered: its epoch's setsum no longer matches."""
    topic = simulate_topic(run.items, 2, "native")
    messages = [ConsumedMessage(p, i, k, v, h) for p, msgs in enumerate(topic)
                for i, (k, v, h) in enumerate(msgs)]
    random.Random(3).shuffle(messages)
    messages.sort(key=lambda m: (m.offset_ * 2 + m.partition_))  # both partitions in order
    events = [m for m in messages if m.partition_ == 0 and m.headers_ is None
              and len(decode_event(m.value_ or b"").new) > 2]
    victim = events[-3]
    value = victim.value_ or b""
    victim.value_ = value[:-1] + bytes([value[-1] ^ 1])
    return messages


def test_a_poll_that_meets_damage_hands_out_the_good_changesets_first(run: Run) -> None:
    """One poll reads past good epochs into an altered event: it returns the changesets
    before the damage; the next poll raises InconsistentLog (issue 10 item 8)."""
    messages = _damaged(run)
    clean = KafkaLog(2)
    want = []
    for m in messages:
        try:
            want += clean.feed(m.partition_, m.offset_, m.key_, m.value_, m.headers_)
        except InconsistentLog:
            break
    assert want, "epochs before the damage complete"
    consumer = _consumer(messages, 2)
    got = consumer.poll(0, max_messages=len(messages))
    assert [(c.epoch_seq, c._changes) for c in got] == [(c.epoch_seq, c._changes) for c in want]
    with pytest.raises(InconsistentLog, match="setsum"):
        consumer.poll(0)
    with pytest.raises(InconsistentLog, match="setsum"):
        consumer.poll(0)  # stays failed: nothing after the damage can be verified


def _consumer_to_the_end(messages: list[ConsumedMessage], monkeypatch: pytest.MonkeyPatch
                         ) -> KafkaConsistentConsumer:
    """``consume_consistent``'s consumer: the fake one, with the topic's end offsets."""
    consumer = _consumer(messages, 2)
    ends = {p: 1 + max(m.offset_ for m in messages if m.partition_ == p) for p in (0, 1)}
    monkeypatch.setattr(consumer, "end_offsets", lambda: ends)
    monkeypatch.setattr(consumer, "commit", lambda *_: None)
    monkeypatch.setattr(consumer, "close", lambda: None)
    monkeypatch.setattr(_kafka_consumer, "KafkaConsistentConsumer", lambda *_, **__: consumer)
    return consumer


def test_until_end_raises_a_fault_met_after_the_last_changesets(
        run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    """The poll that reads the end of the topic meets the damage after good changesets:
    ``until_end`` must not stop as if the topic were clean (it used to)."""
    _consumer_to_the_end(_damaged(run), monkeypatch)
    got = []
    with pytest.raises(InconsistentLog, match="setsum"):
        for changeset in consume_consistent("b", "t", group_id="g", until_end=True):
            got.append(changeset)
    assert got, "the changesets before the damage are handed out first"


async def test_async_until_end_raises_a_fault_met_after_the_last_changesets(
        run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    _consumer_to_the_end(_damaged(run), monkeypatch)
    got = []
    with pytest.raises(InconsistentLog, match="setsum"):
        async for changeset in aconsume_consistent("b", "t", group_id="g", until_end=True):
            got.append(changeset)
    assert got


class _PausingConsumer(_FakeConsumer):
    """Hands out messages of unpaused partitions only, like librdkafka after pause()."""

    def __init__(self, messages: list[ConsumedMessage]) -> None:
        super().__init__(messages)
        self.paused: set[int] = set()
        self.calls: list[tuple[str, list[int]]] = []

    def consume(self, limit: int, timeout: float) -> list[ConsumedMessage]:
        taken = [m for m in self.messages if m.partition_ not in self.paused][:limit]
        ids = {id(m) for m in taken}
        self.messages = [m for m in self.messages if id(m) not in ids]
        return taken

    def pause(self, partitions: list[Any]) -> None:
        self.paused |= {tp.partition for tp in partitions}
        self.calls.append(("pause", sorted(tp.partition for tp in partitions)))

    def resume(self, partitions: list[Any]) -> None:
        self.paused -= {tp.partition for tp in partitions}
        self.calls.append(("resume", sorted(tp.partition for tp in partitions)))


def _partition_0_first(run: Run
                       ) -> tuple[KafkaConsistentConsumer, _PausingConsumer, list[ConsumedMessage]]:
    """A consumer whose librdkafka hands over all of partition 0 first, and pauses."""
    import confluent_kafka

    topic = simulate_topic(run.items, 2, "native")
    messages = [ConsumedMessage(p, i, k, v, h) for p, msgs in enumerate(topic)
                for i, (k, v, h) in enumerate(msgs)]
    consumer = _consumer(messages, 2)
    fake = _PausingConsumer(messages)
    consumer._consumer = fake  # type: ignore[assignment]
    consumer._ck = confluent_kafka
    consumer.partitions = 2
    return consumer, fake, list(messages)


def test_partitions_far_ahead_are_paused_until_the_others_catch_up(run: Run) -> None:
    """librdkafka hands partition 0 over whole first: once too many epochs wait, it is
    paused; partition 1 catches up, partition 0 resumes; every changeset comes out."""
    consumer, fake, messages = _partition_0_first(run)
    consumer.max_waiting_epochs = 20
    got = []
    most_waiting = 0
    for _ in range(10_000):
        got += consumer.poll(0, max_messages=7)
        most_waiting = max(most_waiting, consumer.log.waiting_epochs())
        if not fake.messages:
            break
    got += consumer.poll(0)
    assert fake.calls[0] == ("pause", [0]) and ("resume", [0]) in fake.calls
    assert most_waiting <= 20 + 7  # one poll's worth beyond the bound
    want = KafkaLog(2)
    expected = [c for m in messages
                for c in want.feed(m.partition_, m.offset_, m.key_, m.value_, m.headers_)]
    assert [(c.epoch_seq, c._changes) for c in got] == [
        (c.epoch_seq, c._changes) for c in expected]


def test_a_paused_partition_is_resumed_once_it_holds_the_cut_back(run: Run) -> None:
    """Partitions 0 and 1 paused ahead of 2; partition 2 then passes 1 while 0 is still
    far ahead: now 1 holds the cut back and must be resumed (kept paused, the consumer
    would wait for ever with more than the bound waiting)."""
    import confluent_kafka

    topic = simulate_topic(run.items, 3, "native")
    cut0, cut1 = len(topic[0]) * 3 // 5, len(topic[1]) // 5
    order = [(0, 0, cut0), (1, 0, cut1), (2, 0, len(topic[2])), (1, cut1, len(topic[1])),
             (0, cut0, len(topic[0]))]
    messages = [ConsumedMessage(p, i, *topic[p][i])
                for p, lo, hi in order for i in range(lo, hi)]
    consumer = _consumer(messages, 3)
    fake = consumer._consumer = _PausingConsumer(messages)  # type: ignore[assignment]
    consumer._ck = confluent_kafka
    consumer.partitions = 3
    consumer.max_waiting_epochs = 10
    got = []
    for _ in range(10_000):
        got += consumer.poll(0, max_messages=200)
        if not fake.messages:
            break
    got += consumer.poll(0)
    assert not fake.messages, "a paused partition was never resumed"
    assert any(call == "pause" for call, _ in fake.calls)
    assert len(got) == len(run.at_quiescence)


def test_a_bound_on_waiting_events_pauses_too(run: Run) -> None:
    """With no bound on epochs, a bound on the events they hold pauses the partition
    ahead as well (what is held is what costs memory); every changeset comes out."""
    consumer, fake, messages = _partition_0_first(run)
    consumer.max_waiting_events = 30
    got = []
    most = 0
    for _ in range(10_000):
        got += consumer.poll(0, max_messages=7)
        most = max(most, consumer.log.waiting_events())
        if not fake.messages:
            break
    got += consumer.poll(0)
    assert fake.calls[0] == ("pause", [0]) and ("resume", [0]) in fake.calls
    # A poll's markers may vouch for events read before: a few epochs beyond the bound,
    # against everything of partition 0 waiting without it.
    assert most <= 2 * 30 < sum(m.headers_ is None for m in messages if m.partition_ == 0)
    assert len(got) == len(run.at_quiescence)


class _Chunks(_FakeConsumer):
    """Records what each consume call asked for; fails once when told to."""

    def __init__(self, messages: list[ConsumedMessage]) -> None:
        super().__init__(messages)
        self.calls: list[tuple[int, float, int]] = []  # (limit, timeout, handed over)
        self.fail_at: int | None = None  # the call that raises

    def consume(self, limit: int, timeout: float) -> list[ConsumedMessage]:
        if self.fail_at == len(self.calls):
            import confluent_kafka

            self.calls.append((limit, timeout, 0))
            raise confluent_kafka.KafkaException("broker transport failure")
        taken = super().consume(limit, timeout)
        self.calls.append((limit, timeout, len(taken)))
        return taken


def _changes(changesets: list[Any]) -> list[Any]:
    return [(c.epoch_seq, c._changes) for c in changesets]


def test_a_poll_reads_librdkafka_in_chunks_up_to_its_limit(
        run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    """A poll asks librdkafka for chunks (waiting only for the first), up to its
    ``max_messages``, and hands out what one read of them all would; a chunk that fails
    after others keeps what was read (the next poll meets the error again)."""
    topic = simulate_topic(run.items, 2, "native")
    messages = [ConsumedMessage(p, i, k, v, h) for p, msgs in enumerate(topic)
                for i, (k, v, h) in enumerate(msgs)]
    messages.sort(key=lambda m: (m.offset_ * 2 + m.partition_))
    whole = _consumer(list(messages), 2)
    want = whole.poll(0, max_messages=len(messages))
    monkeypatch.setattr(_kafka_consumer, "_CONSUME_CHUNK", 7)
    consumer = _consumer([], 2)
    fake = consumer._consumer = _Chunks(list(messages))  # type: ignore[assignment]
    got = []
    for i in range(len(messages)):
        fake.calls.clear()
        got += consumer.poll(0.25, max_messages=50)
        assert sum(n for _l, _t, n in fake.calls) == min(50, len(messages) - 50 * i)
        assert [(limit, timeout) for limit, timeout, _n in fake.calls][:1] == [(7, 0.25)]
        assert all(limit <= 7 and timeout == 0 for limit, timeout, _n in fake.calls[1:])
        if not fake.messages:
            break
    assert _changes(got) == _changes(want)
    # A later chunk fails: the chunks before it are fed, nothing is raised or lost.
    consumer = _consumer([], 2)
    fake = consumer._consumer = _Chunks(list(messages))  # type: ignore[assignment]
    fake.fail_at = 3
    got = consumer.poll(0, max_messages=len(messages))
    assert sum(n for _l, _t, n in fake.calls) == 21
    got += consumer.poll(0, max_messages=len(messages))
    assert _changes(got) == _changes(want)
