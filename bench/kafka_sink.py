"""Kafka sink and consumer throughput against a real single-node broker started here.

Run: ``python3 -m bench.kafka_sink [--events N] [--partitions P] [--runs R]``.

1. The sink: events/s through ``KafkaSink`` (encode, partition, tally, produce, flush)
   against a raw confluent-kafka producer, same settings, sending the very same encoded
   messages prepared beforehand (goal: ratio >= 0.8).
2. The consumer: messages/s from the topic to verified, consistent changesets with
   ``KafkaConsistentConsumer`` (poll, commit), against a raw consumer that only reads the
   same messages, for write batches of ``--batch-size`` and of 1 (goal: ratio >= 0.5).

The records are real: an Agent captures a workload of write batches first (not timed).
Each timed run writes to a fresh topic, after an untimed warm-up; sink and raw runs
alternate and the best of each is kept (the machine is shared and noisy). The broker
is the tests' (tests/services/kafka.py).
"""

from __future__ import annotations

import argparse
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from agent import Agent, MemoryStore
from bench._util import report
from sequencer import EpochRecord
from sinks import RecordingSink
from sinks.codec import EventBatch

_quiet = logging.getLogger("bench.kafka.librdkafka")
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False


def capture(events: int, batch_size: int) -> tuple[list[EventBatch | EpochRecord], int]:
    """Records of ``events`` cell writes in write batches of ``batch_size``."""
    recorder = RecordingSink()
    agent = Agent(MemoryStore(), recorder)
    written = 0
    row = 0
    while written < events:
        with agent.batch():
            for i in range(batch_size):
                agent.set("bench", row % 5000, f"c{i % 8}", row * 31 + i)
                row += 1
        written += batch_size
    agent.close()
    return recorder.items, written


def producer_settings(bootstrap: str) -> dict[str, Any]:
    """What KafkaSink configures, for the raw baseline."""
    return {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
            "linger.ms": 5, "delivery.report.only.error": True, "logger": _quiet}


def run_sink(broker: Any, items: list[EventBatch | EpochRecord], topic: str,
             partitions: int) -> float:
    from sinks.kafka import KafkaSink

    broker.create_topic(topic, partitions)
    sink = KafkaSink(broker.bootstrap, topic)
    started = time.perf_counter()
    for item in items:
        if isinstance(item, EventBatch):
            sink.write_events(item)
        else:
            sink.write_epoch(item)
    sink.flush()
    elapsed = time.perf_counter() - started
    sink.close()
    return elapsed


def run_raw(broker: Any, items: list[EventBatch | EpochRecord], topic: str,
            partitions: int) -> float:
    from confluent_kafka import Producer

    from sinks.kafka._builder import MessageBuilder

    builder = MessageBuilder(partitions)
    messages: list[tuple[bytes | None, bytes | None, int, Any]] = []
    for item in items:  # prepared beforehand: the baseline only sends
        if isinstance(item, EventBatch):
            keys, values, parts = builder.events(item)
            messages += [(k, v, p, None) for k, v, p in zip(keys, values, parts, strict=True)]
        else:
            messages += [(m.key, m.value, m.partition, m.headers)
                         for m in builder.epoch(item).markers]
    broker.create_topic(topic, partitions)
    producer = Producer(producer_settings(broker.bootstrap))
    producer.list_topics(topic, timeout=10)
    produce = producer.produce
    started = time.perf_counter()
    for key, value, part, headers in messages:
        while True:
            try:
                if headers is None:
                    produce(topic, value, key, part)
                else:
                    produce(topic, value, key, part, headers=headers)
                break
            except BufferError:
                producer.poll(0.01)
    producer.poll(0)
    producer.flush(120)
    return time.perf_counter() - started


def run_consumer(bootstrap: str, topic: str, group: str) -> tuple[float, int]:
    """Timed from the first poll (start-up, metadata and group look-ups excluded)."""
    from replay.kafka import KafkaConsistentConsumer

    with KafkaConsistentConsumer(bootstrap, topic, group_id=group) as consumer:
        end = consumer.end_offsets()
        started = time.perf_counter()
        events = 0
        while not consumer.reached(end):
            for changeset in consumer.poll(0.5):
                events += changeset.event_count
            consumer.commit()
        return time.perf_counter() - started, events


def bench_consumer(broker: Any, batch_size: int, events: int, partitions: int, runs: int,
                   unplanned: bool = False) -> None:
    """The consistent consumer against a raw one reading the very same topic: both as
    messages of the topic per second (the raw one only takes each message's value).
    With ``unplanned``, also the consumer feeding every poll message by message (no
    markers as columns: the path before issue 13's planned polls), alternated."""
    from unittest import mock

    import replay._kafka_log as kafka_log

    items, written = capture(events, batch_size)
    topic = f"consume-{batch_size}"
    run_sink(broker, items, topic, partitions)  # not timed: fills the topic
    messages = 0
    best_raw = best_consistent = best_unplanned = 0.0
    for run in range(runs):  # alternate, keep the best of each: the machine is shared
        raw_s, messages = run_raw_consumer(broker.bootstrap, topic, partitions)
        consistent_s, consumed = run_consumer(broker.bootstrap, topic, f"bench-{run}")
        assert consumed == written, (consumed, written)
        best_raw = max(best_raw, messages / raw_s)
        best_consistent = max(best_consistent, messages / consistent_s)
        if unplanned:
            with mock.patch.object(kafka_log, "plan_poll", lambda *_: None):
                seconds, consumed = run_consumer(broker.bootstrap, topic, f"bench-u{run}")
            assert consumed == written, (consumed, written)
            best_unplanned = max(best_unplanned, messages / seconds)
    print(f"consumer: {written:,} events in write batches of {batch_size}, "
          f"{messages:,} messages over {partitions} partitions")
    report(f"  consume_consistent, batches of {batch_size}", best_consistent,
           "raw consumer", best_raw, "messages/s", ">= 0.5")
    if unplanned:
        report(f"  same, polls fed message by message, batches of {batch_size}",
               best_unplanned, "raw consumer", best_raw, "messages/s", "before")


def run_raw_consumer(bootstrap: str, topic: str, partitions: int) -> tuple[float, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"raw-{topic}",
                         "enable.auto.commit": False, "logger": _quiet})
    ends = [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=15)[1]
            for p in range(partitions)]
    started = time.perf_counter()
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    total, goal = 0, sum(ends)
    while total < goal:
        for message in consumer.consume(10_000, timeout=0.5):
            if message.error() is None:
                message.value()
                total += 1
    elapsed = time.perf_counter() - started
    consumer.close()
    return elapsed, total


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--consumer-only", action="store_true",
                        help="skip the sink; only the consumer figures")
    parser.add_argument("--unplanned", action="store_true",
                        help="also time the consumer feeding polls message by message")
    args = parser.parse_args(argv)

    from tests.services.kafka import KafkaBroker

    workdir = Path(tempfile.mkdtemp(prefix="cdc-kafka-bench-"))
    started = time.perf_counter()
    broker = KafkaBroker(workdir, heap="1g")
    broker.start()
    print(f"broker: Kafka from {broker.libs} started in {time.perf_counter() - started:.1f}s")
    try:
        items, events = capture(args.events, args.batch_size)
        epochs = sum(isinstance(i, EpochRecord) for i in items)
        print(f"workload: {events:,} events in write batches of {args.batch_size}, "
              f"{epochs:,} epoch records, {args.partitions} partitions")
        run_raw(broker, items, "warm-up", args.partitions)  # the broker's JIT warms up
        if not args.consumer_only:
            sink_best = raw_best = 0.0
            for run in range(args.runs):  # interleaved, best of each: the machine is shared
                raw_best = max(raw_best, events / run_raw(broker, items, f"raw-{run}",
                                                           args.partitions))
                sink_best = max(sink_best, events / run_sink(broker, items, f"sink-{run}",
                                                             args.partitions))
            report("KafkaSink (native) write+flush", sink_best, "raw producer", raw_best,
                   "events/s", ">= 0.8")
        bench_consumer(broker, args.batch_size, args.events, args.partitions, args.runs,
                       args.unplanned)
        bench_consumer(broker, 1, args.events // 5, args.partitions, args.runs,
                       args.unplanned)
    finally:
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
