"""The consistent Kafka consumer: confluent-kafka around ``KafkaLog`` (the pure part).

One consumer reads every partition of the topic (``assign``, not a group rebalance:
a consistent cut needs all partitions in one place); the group id only names where
offsets are committed. Offsets are committed by hand, only at quiescence points, with
the position token as the commit's metadata, so a restarted consumer resumes where the
last changeset it handed out ends, neither skipping nor repeating one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from typing import Any

import structlog

from replay._assembler import Assembler, Cell, Changeset
from replay._errors import InconsistentLog
from replay._kafka_log import KafkaLog
from replay._kafka_poll import Entry
from replay._position import Frontier, Position
from sequencer import Value
from sinks.codec import NATIVE_MAGIC as EVENT_MAGIC
from sinks.kafka import (
    KafkaConfigError,
    KafkaSinkError,
    KafkaUnavailable,
    confluent_kafka,
    kafka_error_code,
    kafka_errors,
    quiet_logger,
)

__all__ = ["KafkaConsistentConsumer", "aconsume_consistent", "consume_consistent"]

log = structlog.get_logger()
# librdkafka error codes meaning "the group coordinator is moving or loading": retry.
_COORDINATOR_ERRORS = frozenset({14, 15, 16})  # LOAD_IN_PROGRESS, NOT_AVAILABLE, NOT_COORDINATOR
# Messages asked of librdkafka at a time (a poll may take several chunks): see _read.
_CONSUME_CHUNK = 1000


class KafkaConsistentConsumer:
    """Reads a topic written by ``KafkaSink`` and hands out verified changesets.

    ``poll()`` returns the changesets that became consistent (cut at the minimum
    quiescence point across partitions); ``commit()`` records, for ``group_id``, the
    offsets and position after the last of them. Where reading starts: the group's
    committed offsets, else the beginning of each partition. What is already applied:
    ``position`` (a token of ``replay.Position``/``Frontier``), else the token committed
    with the offsets, else nothing (the topic must then start at its domains' first
    epochs). ``initial_state`` is the state the applied position stands for: with it,
    reading starts at the committed offsets; without it, the consumer rebuilds that
    state from the beginning of the topic and hands out only what comes after the
    position.

    ``max_waiting_epochs`` and ``max_waiting_events`` bound the epochs, and the events
    of them, held while some partitions wait for the others: beyond either, the
    partitions ahead are paused until the others caught up (0: no bound). See
    ``docs/kafka.md``.

    Raises ``InconsistentLog`` (from ``replay``) rather than hand out a wrong changeset,
    ``KafkaUnavailable`` if no broker answers within ``startup_timeout``, and
    ``KafkaConfigError`` for a missing topic or a wrong encoding.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        group_id: str,
        position: str | Position | Frontier | None = None,
        encoding: str = "native",
        initial_state: Mapping[Cell, Value] | None = None,
        config: Mapping[str, Any] | None = None,
        startup_timeout: float = 15.0,
        max_waiting_epochs: int = 20_000,
        max_waiting_events: int = 200_000,
    ) -> None:
        if encoding not in ("native", "debezium"):
            raise KafkaConfigError(
                f"unknown Kafka encoding {encoding!r}; choose one of native, debezium")
        ck = self._ck = confluent_kafka()
        self.topic = topic
        self.bootstrap = bootstrap
        self.group_id = group_id
        settings: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "group.id": group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "allow.auto.create.topics": False,
            "logger": quiet_logger(),
            "error_cb": self._on_error,
            "on_commit": self._on_commit,
        }
        settings.update(config or {})
        self._fatal: str | None = None
        self._failure: InconsistentLog | KafkaSinkError | None = None
        self.max_waiting_epochs = max_waiting_epochs
        self.max_waiting_events = max_waiting_events
        self._paused: list[int] = []
        with kafka_errors("consumer", f"creating the consumer of topic {topic!r} for group "
                          f"{group_id!r}", KafkaConfigError, "fix the consumer config",
                          also=(ValueError, TypeError)):
            self._consumer = ck.Consumer(settings)
        try:
            self._start(position, encoding, initial_state, startup_timeout)
        except BaseException:
            self._consumer.close()
            raise
        self._closed = False

    def _start(self, position: str | Position | Frontier | None, encoding: str,
               initial_state: Mapping[Cell, Value] | None, timeout: float) -> None:
        ck = self._ck
        with kafka_errors("consumer", f"reading the metadata of topic {self.topic!r}",
                          KafkaUnavailable, f"no Kafka broker at {self.bootstrap} answered "
                          f"within {timeout}s; check the bootstrap address and that the "
                          "broker runs"):
            metadata = self._consumer.list_topics(self.topic, timeout=timeout)
        meta = metadata.topics.get(self.topic)
        if meta is None or meta.error is not None or not meta.partitions:
            reason = meta.error.str() if meta is not None and meta.error else "no metadata"
            raise KafkaConfigError(
                f"Kafka topic {self.topic!r} does not exist on {self.bootstrap} ({reason}); "
                "check the topic name (the sink creates it when given partitions=N)")
        self.partitions = len(meta.partitions)
        wanted = [ck.TopicPartition(self.topic, p) for p in range(self.partitions)]
        deadline = time.monotonic() + timeout
        while True:  # the group coordinator may still be loading: retry what is retriable
            try:
                with kafka_errors("consumer", "reading the committed offsets of group "
                                  f"{self.group_id!r}", KafkaUnavailable,
                                  f"gave up within {timeout}s"):
                    committed = self._consumer.committed(
                        wanted, timeout=max(deadline - time.monotonic(), 0.5))
                break
            except KafkaUnavailable as exc:
                cause = exc.__cause__
                error = cause.args[0] if cause is not None and cause.args else None
                retriable = error is not None and hasattr(error, "retriable") and (
                    error.retriable() or kafka_error_code(cause) in _COORDINATOR_ERRORS)
                if not retriable or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        if position is None:
            tokens = {tp.metadata for tp in committed if tp.offset >= 0 and tp.metadata}
            if len(tokens) > 1:
                log.warning("kafka_commit_tokens_differ", group=self.group_id, tokens=tokens)
            position = furthest(tokens)
        # The assembler checks every chain of events against the state it holds, so a
        # resumed position needs the state it stands for. Without one, rebuild it: read
        # from the beginning and keep quiet up to the position.
        rebuild = position is not None and initial_state is None
        self._hide = _frontier(position) if position is not None and rebuild else None
        self.log = KafkaLog(self.partitions, encoding=encoding, bulk=True, assembler=Assembler(
            initial_state, position=None if rebuild else position))
        assignment = []
        for tp in committed:
            if tp.offset >= 0 and not rebuild:
                self.log.seek(tp.partition, tp.offset)
                assignment.append(ck.TopicPartition(self.topic, tp.partition, tp.offset))
            else:
                assignment.append(ck.TopicPartition(self.topic, tp.partition,
                                                    ck.OFFSET_BEGINNING))
        with kafka_errors("consumer", f"assigning the partitions of {self.topic!r}"):
            self._consumer.assign(assignment)
        log.info("kafka_consumer_started", topic=self.topic, group=self.group_id,
                 partitions=self.partitions, position=str(self.log.position))

    def _on_error(self, err: Any) -> None:
        if err.fatal():
            self._fatal = err.str()
        else:
            log.debug("kafka_transient_error", error=err.str(), bootstrap=self.bootstrap)

    @property
    def position(self) -> Frontier:
        """Everything up to this position was handed out as changesets."""
        return self.log.position

    def poll(self, timeout: float = 1.0, max_messages: int = 10_000) -> list[Changeset]:
        """Read what is available (waiting up to ``timeout``); return new changesets."""
        if self._failure is not None:
            raise self._failure  # the log broke there: nothing after it can be verified
        if self._fatal is not None:
            raise KafkaSinkError(f"the Kafka consumer hit a fatal error: {self._fatal}")
        out: list[Changeset] = []
        entries, failure = self._read(timeout, max_messages)
        try:
            out.extend(self.log.feed_poll(entries))
        except InconsistentLog as exc:
            failure = exc  # met before the fatal error, if any
        try:
            # Every interval complete so far, verified in one pass.
            out.extend(self.log.drain())
            failure = self.log.failure or failure  # met in the drain: it comes first
        except InconsistentLog as exc:
            failure = exc  # it comes before anything met while reading on
        if failure is not None:
            # Hand out the changesets verified before the damage; raise from the next poll
            # on (the consumer cannot move past it).
            self._failure = failure
            if not out:
                raise failure
        self._bound_skew()
        if self._hide is not None and out:
            out = self._drop_hidden(out)
        return out

    def _read(self, timeout: float, max_messages: int
              ) -> tuple[list[Entry], InconsistentLog | KafkaSinkError | None]:
        """Up to ``max_messages`` messages as ``KafkaLog.feed_poll`` takes them (an event
        message without its key and headers, which it does not need), and a fatal error
        met after them.

        librdkafka is asked for at most ``_CONSUME_CHUNK`` at a time (waiting up to
        ``timeout`` for the first ones only), each chunk's messages turned into plain
        tuples and dropped before the next: the entries hold only bytes, ints and
        tuples of them, which the garbage collector stops tracking, while ten thousand
        librdkafka messages alive at once were promoted to its oldest generation and
        woke a full pass over the process about once a poll."""
        with kafka_errors("consumer", f"reading {self.topic!r}", KafkaUnavailable,
                          "nothing was handed out; poll again"):
            messages = self._consumer.consume(min(max_messages, _CONSUME_CHUNK), timeout)
        magic = EVENT_MAGIC if self.log.encoding == "native" else None
        entries: list[Entry] = []
        taken = 0
        while True:
            taken += len(messages)
            for message in messages:
                err = message.error()
                if err is not None:
                    if err.code() == self._ck.KafkaError._PARTITION_EOF:
                        continue
                    if err.fatal():  # after the messages before it
                        return entries, KafkaSinkError(
                            f"reading {self.topic!r} failed: {err.str()}")
                    log.warning("kafka_consume_error", error=err.str())
                    continue
                value = message.value()
                if magic is not None and value is not None and value[:3] == magic:
                    entries.append((message.partition(), message.offset(), None, value, None))
                else:
                    headers = message.headers()
                    entries.append((message.partition(), message.offset(), message.key(),
                                    value, None if headers is None else tuple(headers)))
            wanted = min(max_messages - taken, _CONSUME_CHUNK)
            if len(messages) < _CONSUME_CHUNK or wanted <= 0:
                return entries, None
            messages = message = None  # freed before librdkafka makes the next chunk
            try:
                with kafka_errors("consumer", f"reading {self.topic!r}"):
                    messages = self._consumer.consume(wanted, 0)
            except KafkaSinkError as exc:
                # What was read is fed; the next poll meets the error again.
                log.warning("kafka_consume_error", error=str(exc))
                return entries, None

    def _bound_skew(self) -> None:
        """Pause the partitions that run ahead while too much waits for the others
        (librdkafka hands over one partition almost whole before the next), resume them
        once the others caught up: what the consumer holds stays bounded."""
        load = max(_share(self.log.waiting_epochs(), self.max_waiting_epochs),
                   _share(self.log.waiting_events(), self.max_waiting_events))
        if not load and not self._paused:
            return
        ck = self._ck
        paused = set(self._paused)
        target: set[int] = set()
        if load > 0.5:
            ahead = set(self.log.ahead())
            if len(ahead) < self.partitions:
                # Keep paused only what is still ahead (a partition paused half way may
                # be the one holding the cut back now); pause more past the bound.
                target = ahead if load > 1 else paused & ahead
        waiting = self.log.waiting_epochs()
        if target - paused:
            with kafka_errors("consumer", f"pausing partitions of {self.topic!r}"):
                self._consumer.pause([ck.TopicPartition(self.topic, p)
                                      for p in sorted(target - paused)])
            log.debug("kafka_partitions_paused", partitions=sorted(target - paused),
                      waiting_epochs=waiting)
        if paused - target:
            with kafka_errors("consumer", f"resuming partitions of {self.topic!r}"):
                self._consumer.resume([ck.TopicPartition(self.topic, p)
                                       for p in sorted(paused - target)])
            log.debug("kafka_partitions_resumed", partitions=sorted(paused - target),
                      waiting_epochs=waiting)
        self._paused = sorted(target)

    def _drop_hidden(self, changesets: list[Changeset]) -> list[Changeset]:
        """While rebuilding: drop changesets up to the position (and their commit points)."""
        assert self._hide is not None
        hidden = []
        for changeset in changesets:
            applied = self._hide.get(changeset.domain_id)
            if applied is not None and changeset.epoch_seq <= applied.epoch_seq:
                hidden.append(changeset)
        if hidden:
            self.log.commit_points.drop(hidden)
        return [c for c in changesets if all(c is not h for h in hidden)]

    def commit(self, through: Changeset | None = None) -> bool:
        """Commit the offsets and position after ``through`` (default: the last changeset
        handed out), which the application has applied.

        Step 1. Find the commit point of ``through`` (offsets per partition, token).
        Step 2. Commit those offsets with the position token as metadata, asynchronously
        (a broker outage must not stall reading; librdkafka sends commits in order and
        ``close()`` waits for those in flight). A failed commit is logged: the next one
        covers it, and a restart from an older commit re-reads, it does not skip.
        """
        # Step 1.
        points = self.log.commit_points
        if through is not None and not points.knows(through):
            return False  # unknown, or older than the points kept: committing could skip
        point = points.pop_through(through)
        if point is None or not point.offsets:
            return True
        ck = self._ck
        # Step 2.
        try:
            with kafka_errors("consumer", f"committing offsets of group {self.group_id!r}"):
                self._consumer.commit(offsets=[
                    ck.TopicPartition(self.topic, p, o, metadata=point.token)
                    for p, o in point.offsets.items()
                ], asynchronous=True)
        except KafkaSinkError as exc:  # not fatal: the next commit covers this one
            log.warning("kafka_commit_failed", error=str(exc), group=self.group_id)
            return False
        return True

    def _on_commit(self, err: Any, partitions: Any) -> None:
        if err is not None:
            log.warning("kafka_commit_failed", error=str(err), group=self.group_id)

    def end_offsets(self, timeout: float = 15.0) -> dict[int, int]:
        """The high watermark of every partition now."""
        ck = self._ck
        out = {}
        for p in range(self.partitions):
            with kafka_errors("consumer", f"reading the end of {self.topic!r}",
                              KafkaUnavailable):
                _low, high = self._consumer.get_watermark_offsets(
                    ck.TopicPartition(self.topic, p), timeout=timeout, cached=False)
            out[p] = high
        return out

    @property
    def failure(self) -> InconsistentLog | KafkaSinkError | None:
        """The fault met after the changesets the last poll returned: the next poll
        raises it."""
        return self._failure

    def reached(self, offsets: Mapping[int, int]) -> bool:
        """True once every partition was read up to ``offsets``."""
        read = self.log.read_offsets()
        return all(high <= 0 or read.get(p, 0) >= high for p, high in offsets.items())

    def close(self) -> None:
        """Leave without committing anything more. A second call does nothing."""
        if not self._closed:
            self._closed = True
            self._consumer.close()

    def __enter__(self) -> KafkaConsistentConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _share(held: int, bound: int) -> float:
    """How full a bound is (0: no bound)."""
    return held / bound if bound else 0.0


def furthest(tokens: Iterable[str]) -> Frontier | None:
    """The furthest of the position tokens committed with the partitions' offsets.

    Partitions committed by different commits (one failed half way) carry different
    tokens; each partition's offset is at or before where its own token stands, so the
    furthest position per domain is the one to resume from (re-read events of applied
    epochs are dropped as duplicates; an older position would apply some twice).
    A token that does not parse is refused with ``InvalidPosition``.
    """
    best: dict[int, Position] = {}
    for token in tokens:
        for position in Frontier.parse(token):
            held = best.get(position.domain_id)
            if held is None or position.epoch_seq > held.epoch_seq:
                best[position.domain_id] = position
    return Frontier(best) if best else None


def _frontier(position: str | Position | Frontier) -> Frontier:
    if isinstance(position, str):
        return Frontier.parse(position)
    if isinstance(position, Position):
        return Frontier.of([position])
    return position


def consume_consistent(
    bootstrap: str,
    topic: str,
    *,
    group_id: str,
    position: str | Position | Frontier | None = None,
    encoding: str = "native",
    until_end: bool = False,
    poll_timeout: float = 0.5,
    commit_every: int = 100,
    **options: Any,
) -> Iterator[Changeset]:
    """Yield a verified changeset per quiescence point, forever (or ``until_end``).

    Offsets (with the position token) are committed once the caller has taken a
    changeset and asks for the next one: after every ``commit_every`` changesets and
    whenever the consumer has to wait for more. A crash while applying one repeats it
    rather than losing it; store ``changeset.position`` with what you apply and pass it
    back as ``position`` for exactly-once. With ``until_end`` it stops once it has read
    up to where the partitions ended when it started. ``options`` go to ``KafkaConsistentConsumer``.
    """
    consumer = KafkaConsistentConsumer(bootstrap, topic, group_id=group_id,
                                       position=position, encoding=encoding, **options)
    try:
        end = consumer.end_offsets() if until_end else None
        while True:
            taken = 0
            for changeset in consumer.poll(poll_timeout):
                yield changeset
                taken += 1  # the caller is back: it applied the changeset
                if taken % commit_every == 0:
                    consumer.commit(changeset)
            if taken % commit_every:
                consumer.commit()
            # A fault held behind the last changesets is raised by the next poll.
            if end is not None and consumer.reached(end) and consumer.failure is None:
                return
    finally:
        consumer.close()


async def aconsume_consistent(
    bootstrap: str,
    topic: str,
    *,
    group_id: str,
    position: str | Position | Frontier | None = None,
    encoding: str = "native",
    until_end: bool = False,
    poll_timeout: float = 0.5,
    commit_every: int = 100,
    **options: Any,
) -> AsyncIterator[Changeset]:
    """``consume_consistent`` for asyncio: the blocking calls run in a worker thread."""
    consumer = await asyncio.to_thread(
        lambda: KafkaConsistentConsumer(bootstrap, topic, group_id=group_id,
                                        position=position, encoding=encoding, **options))
    try:
        end = await asyncio.to_thread(consumer.end_offsets) if until_end else None
        while True:
            taken = 0
            for changeset in await asyncio.to_thread(consumer.poll, poll_timeout):
                yield changeset
                taken += 1
                if taken % commit_every == 0:
                    await asyncio.to_thread(consumer.commit, changeset)
            if taken % commit_every:
                await asyncio.to_thread(consumer.commit)
            # A fault held behind the last changesets is raised by the next poll.
            if end is not None and consumer.reached(end) and consumer.failure is None:
                return
    finally:
        consumer.close()
