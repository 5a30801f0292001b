"""A Kafka topic written by ``sinks.kafka.KafkaSink`` as a source of ``LogReplay``.

Spark reads the topic with its Kafka connector (spark-sql-kafka) between offsets fixed
when the topic is opened, so both passes see the same messages however much is
appended meanwhile. Each message is sorted by SQL into an event (native or Debezium),
an epoch marker (both headers of ``sinks.codec``), a baseline chunk, or a foreign
message (refused). Then, as for a wal3 log:

1. pass 1 brings the markers (few: one per epoch and partition) and the chunks' headers
   to the driver, which checks each partition's markers as the Python consumer does
   (``replay.kafka.KafkaLog``): in each partition a domain's epochs follow one another
   from its first, each copy matches the whole record, the partitions agree on it and
   their counts add up to it. An epoch is verified once *every* partition vouched for
   it (the cut the Python consumer makes); later ones are the tail;
2. pass 2 decodes the events in the executors and places each in its epoch; an event
   after its partition's marker of that epoch is not part of it (the Python consumer
   counts it in a later epoch, which then fails; a copy of an event vouched for is a
   harmless duplicate). Kafka has one message per event, so the setsum's segments
   (``sinks.codec``) are rebuilt by a shuffle: events clustered by write batch, sorted
   by seq, hashed per segment in the executors; two different events with one identity
   make two different copies of the segment, which ``LogReplay`` refuses.

The checks on the result (counts, per-table counts, setsums per epoch, each cell's
chain) are ``LogReplay``'s, the same as for a wal3 log.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

import numpy as np
import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from replay._epoch_columns import segment_digests_at
from replay._errors import InconsistentLog
from replay._position import Position
from replay.spark._baselines import ChunkHeader, chunk_header
from replay.spark._decode import (
    EVENT_ROWS,
    KIND_EVENT,
    KIND_SEGMENT,
    EpochIndex,
    _chunk_cells,
    signed_bits,
)
from sequencer import EpochRecord
from sinks.codec import (
    EVENT_SCHEMA,
    HEADER_PARTITION,
    HEADER_READ,
    HEADER_SNAPSHOT,
    HEADER_WHOLE,
    MAGIC,
    NATIVE_MAGIC,
    SEGMENT_BITS,
    CodecError,
    SnapshotChunk,
    decode,
    decode_debezium_event,
    decode_native_event,
    encode_key,
    encode_value,
)

__all__ = [
    "KAFKA_SCHEME",
    "KafkaTopic",
    "MarkerOffsets",
    "SHARES",
    "TopicTrimmed",
    "kafka_metadata",
    "decode_chunk",
    "foreign_message",
    "kafka_rows",
    "message_kind",
    "open_topic",
    "parse_topic_uri",
    "share_columns",
    "share_failures",
    "topic_consumer",
    "vouched_epochs",
    "vouched_shares",
]

KAFKA_SCHEME: Final = "kafka://"
ENCODINGS: Final = ("native", "debezium")

# What a message is (decided once, in SQL, the same for both passes).
_EVENT: Final = "e"
_MARKER: Final = "m"
_CHUNK: Final = "c"
_READ: Final = "r"  # a Debezium op "r" row of a baseline cell: the chunk has it, skipped
_FOREIGN: Final = "x"

# (partition, domain) -> the offset of the partition's marker of each epoch (index
# epoch_seq - 1), for the epochs every partition vouched for.
MarkerOffsets = dict[tuple[int, int], np.ndarray]

# Pass 2's rows of a topic: ``EVENT_ROWS`` and the partition each event came from.
KAFKA_ROWS: Final = pa.schema([*EVENT_ROWS, pa.field("partition", pa.int32())])
_META: Final = pa.schema([
    pa.field("partition", pa.int32()), pa.field("offset", pa.int64()),
    pa.field("kind", pa.string()), pa.field("part", pa.binary()),
    pa.field("whole", pa.binary()), pa.field("chunk", pa.string()),
])
# A conflicting second copy of an event gives its segment a digest no real segment has.
_CONFLICT: Final = hashlib.sha3_256(b"cdc-agent: two different events, one identity").digest()


@dataclass(frozen=True, slots=True)
class KafkaTopic:
    """A topic as the executors read it: where, which encoding, and the offsets read
    (per partition, from its first message held to its end when the topic was opened)."""

    uri: str
    bootstrap: str
    topic: str
    encoding: str
    start: tuple[int, ...]
    end: tuple[int, ...]

    @property
    def partitions(self) -> int:
        return len(self.end)

    def messages(self) -> int:
        return sum(e - s for s, e in zip(self.start, self.end, strict=True))

    def frame(self, spark: SparkSession) -> DataFrame:
        """The messages between the fixed offsets, with the column ``kind``."""

        def offsets(values: tuple[int, ...]) -> str:
            return json.dumps({self.topic: {str(p): o for p, o in enumerate(values)}})

        raw = (spark.read.format("kafka")
               .option("kafka.bootstrap.servers", self.bootstrap)
               .option("assign", json.dumps({self.topic: list(range(self.partitions))}))
               .option("startingOffsets", offsets(self.start))
               .option("endingOffsets", offsets(self.end))
               .option("includeHeaders", "true")
               .option("failOnDataLoss", "true")
               .load())
        part, whole, snap = (_header(name) for name in (HEADER_PARTITION, HEADER_WHOLE,
                                                        HEADER_SNAPSHOT))
        head = F.substring("value", 1, 3)
        native = self.encoding == "native"
        # The order of KafkaLog.feed: an event's magic, a marker's two headers, a chunk,
        # a baseline cell's op "r" row (skipped), a Debezium event.
        kind = (F.when(head == F.lit(NATIVE_MAGIC), F.lit(_EVENT))
                .when(part.isNotNull() & whole.isNotNull(), F.lit(_MARKER))
                .when(snap.isNotNull() | (F.lit(native) & (head == F.lit(MAGIC))),
                      F.lit(_CHUNK))
                .when(F.exists("headers", lambda h: h["key"] == F.lit(HEADER_READ)),
                      F.lit(_READ))
                .when(F.lit(not native) & F.col("value").isNotNull(), F.lit(_EVENT))
                .otherwise(F.lit(_FOREIGN)))
        return raw.select(
            F.col("partition"), F.col("offset"), kind.alias("kind"), "value",
            part.alias("part"), whole.alias("whole"),
            F.coalesce(snap, F.col("value")).alias("snapshot"))


class TopicTrimmed(Exception):
    """The topic no longer holds offsets a stream's saved point starts at (retention or
    ``deleteRecords`` removed them): that point cannot be resumed from."""


def message_kind(value: bytes | None, headers: Sequence[tuple[str, bytes | None]] | None,
                 native: bool) -> str:
    """What a message is, decided as ``KafkaTopic.frame`` decides it in SQL (for the
    driver, which reads a stream's new messages with a consumer): ``_EVENT``,
    ``_MARKER``, ``_CHUNK``, ``_READ`` or ``_FOREIGN``."""
    first: dict[str, bytes | None] = {}
    for name, raw in headers or ():
        first.setdefault(name, raw)
    head = None if value is None else value[:3]
    if head == NATIVE_MAGIC:
        return _EVENT
    if first.get(HEADER_PARTITION) is not None and first.get(HEADER_WHOLE) is not None:
        return _MARKER
    if first.get(HEADER_SNAPSHOT) is not None or (native and head == MAGIC):
        return _CHUNK
    if HEADER_READ in first:
        return _READ
    return _EVENT if not native and value is not None else _FOREIGN


def foreign_message(topic: str, encoding: str, partition: int, offset: int) -> InconsistentLog:
    """The refusal of a message that is none of a cdc-agent topic's records."""
    return InconsistentLog(
        f"partition {partition} offset {offset} of topic {topic!r} holds a message that "
        f"is not a cdc-agent {encoding} record (is the encoding right?)")


def _header(name: str) -> Column:
    """The value of the first header called ``name`` (null if none)."""
    return F.get(F.filter("headers", lambda h: h["key"] == F.lit(name)), 0)["value"]


def parse_topic_uri(uri: str) -> tuple[str, str]:
    """``kafka://host:port[,host:port]/topic`` as (bootstrap servers, topic)."""
    parts = urlsplit(uri)
    topic = parts.path.lstrip("/")
    if parts.scheme != "kafka" or not parts.netloc or not topic or "/" in topic:
        raise ValueError(f"{uri!r} is not a Kafka topic URI: write "
                         "kafka://host:port/topic (several brokers: host:port,host:port)")
    return parts.netloc, topic


@contextmanager
def topic_consumer(bootstrap: str, topic: str, *, timeout: float = 15.0
                   ) -> Iterator[tuple[Any, Any, list[int], list[int]]]:
    """A consumer of ``topic`` (closed on exit) with each partition's offsets now:
    ``(confluent_kafka, consumer, first held, end)``. Refuses a missing topic."""
    from sinks.kafka import (
        KafkaConfigError,
        KafkaUnavailable,
        confluent_kafka,
        kafka_errors,
        quiet_logger,
    )

    ck = confluent_kafka()
    with kafka_errors("consumer", f"opening topic {topic!r}", KafkaConfigError,
                      also=(ValueError, TypeError)):
        consumer = ck.Consumer({"bootstrap.servers": bootstrap,
                                "group.id": "cdc-agent-spark", "enable.auto.commit": False,
                                "logger": quiet_logger()})
    try:
        with kafka_errors("consumer", f"reading the metadata of topic {topic!r}",
                          KafkaUnavailable, f"no Kafka broker at {bootstrap} answered "
                          f"within {timeout}s"):
            meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            raise KafkaConfigError(f"Kafka topic {topic!r} does not exist on {bootstrap}; "
                                   "check the URI's topic")
        start, end = [], []
        for p in range(len(meta.partitions)):
            with kafka_errors("consumer", f"reading the offsets of {topic!r} partition {p}",
                              KafkaUnavailable):
                low, high = consumer.get_watermark_offsets(
                    ck.TopicPartition(topic, p), timeout=timeout, cached=False)
            start.append(int(low))
            end.append(int(high))
        yield ck, consumer, start, end
    finally:
        consumer.close()


def open_topic(uri: str, encoding: str = "native", *, timeout: float = 15.0,
               end: Sequence[int] | None = None, start: Sequence[int] | None = None
               ) -> KafkaTopic:
    """Resolve ``kafka://host:port[,host:port]/topic``: its partitions and, for each,
    the offsets to read (first held, end now; or ``end``, offsets a stream saw, which
    the topic must still hold; from ``start``, a stream's saved point, instead of the
    first held: ``TopicTrimmed`` if the topic no longer holds it). Refuses an unknown
    encoding or topic."""
    if encoding not in ENCODINGS:
        raise ValueError(f"unknown Kafka encoding {encoding!r}; choose native or debezium")
    bootstrap, topic = parse_topic_uri(uri)
    with topic_consumer(bootstrap, topic, timeout=timeout) as (_ck, _consumer, held, high):
        pass
    if end is not None:
        if len(end) != len(high):
            raise ValueError(f"topic {topic!r} has {len(high)} partitions, the stream read "
                             f"{len(end)}: a topic's partition count must not change")
        for p, (first, stop, now) in enumerate(zip(held, end, high, strict=True)):
            if not first <= stop <= now:
                raise InconsistentLog(
                    f"partition {p} of topic {topic!r} no longer holds offsets {first}..{stop} "
                    f"the stream read (it now holds {first}..{now}): retention or a "
                    "recreated topic")
        high = list(end)
    if start is not None:
        if len(start) != len(high):
            raise TopicTrimmed(f"the saved point has {len(start)} partitions, topic "
                               f"{topic!r} has {len(high)}")
        for p, (first, begin, stop) in enumerate(zip(held, start, high, strict=True)):
            if not first <= begin <= stop:
                raise TopicTrimmed(
                    f"partition {p} of topic {topic!r} holds offsets {first}..{stop - 1}, "
                    f"the saved point starts at offset {begin}")
        held = list(start)
    return KafkaTopic(uri, bootstrap, topic, encoding, tuple(held), tuple(high))


# -- pass 1: markers and chunk headers to the driver ------------------------------------------


def _metadata_rows(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Executor side: markers as their two headers, chunks as their headers (their cells
    stay here), foreign messages as themselves (the driver refuses them)."""
    for batch in batches:
        rows = batch.to_pylist()
        chunks: list[str | None] = []
        for row in rows:
            header = None
            if row["kind"] == _CHUNK:
                chunk = decode_chunk(row["partition"], row["offset"], row["snapshot"])
                header = chunk_header(chunk)
            chunks.append(header)
        yield pa.RecordBatch.from_arrays([
            *(batch.column(f.name).cast(f.type) for f in list(_META)[:5]),
            pa.array(chunks, pa.string()),
        ], schema=_META)


def decode_chunk(partition: int, offset: int, body: bytes) -> SnapshotChunk:
    try:
        record = decode(body)
    except CodecError as exc:
        raise CodecError(f"partition {partition} offset {offset} holds a corrupt snapshot "
                         f"message: {exc}") from exc
    if not isinstance(record, SnapshotChunk):
        raise CodecError(f"partition {partition} offset {offset} holds a "
                         f"{type(record).__name__} where a snapshot chunk belongs")
    return record


def kafka_metadata(spark: SparkSession, topic: KafkaTopic
                   ) -> tuple[list[tuple[int, int, bytes, bytes]], list[ChunkHeader]]:
    """Pass 1: every marker ``(partition, offset, partition record, whole record)`` in
    each partition's order, and every chunk's header. A foreign message is refused."""
    frame = topic.frame(spark).filter(F.col("kind").isin(_MARKER, _CHUNK, _FOREIGN))
    from pyspark.sql.pandas.types import from_arrow_schema

    rows = frame.select("partition", "offset", "kind", "part", "whole", "snapshot"
                        ).mapInArrow(_metadata_rows, from_arrow_schema(_META)).collect()
    markers, chunks = [], []
    for row in sorted(rows, key=lambda r: (r["partition"], r["offset"])):
        if row["kind"] == _FOREIGN:
            raise foreign_message(topic.topic, topic.encoding, row["partition"], row["offset"])
        if row["kind"] == _MARKER:
            markers.append((int(row["partition"]), int(row["offset"]), bytes(row["part"]),
                            bytes(row["whole"])))
        else:
            chunks.append(ChunkHeader.parse(row["chunk"]))
    return markers, chunks


def _epoch_record(raw: bytes, where: str) -> EpochRecord:
    try:
        record = decode(raw)
    except CodecError as exc:
        raise InconsistentLog(f"{where}: a corrupt epoch marker: {exc}") from exc
    if not isinstance(record, EpochRecord):
        raise InconsistentLog(f"{where}: an epoch marker header holds a "
                              f"{type(record).__name__}, not an epoch record")
    return record


def vouched_epochs(markers: Iterable[tuple[int, int, bytes, bytes]], partitions: int,
                   starts: Mapping[int, Position] | None = None
                   ) -> tuple[list[EpochRecord], MarkerOffsets]:
    """The driver's checks of the markers (in each partition's order), as
    ``KafkaLog`` makes them; returns each domain's epochs that every partition vouched
    for (whole records, from its first on) and where each partition's marker is.

    ``starts``: a resumed stream's saved frontier; a domain named there begins after
    its point (earlier markers are old copies, skipped), and its lanes' marker offsets
    begin at the epoch after it (``_event_batch``'s ``bases``)."""
    starts = starts or {}
    nxt: dict[tuple[int, int], int] = {}  # (partition, domain) -> the epoch due next
    offsets: dict[tuple[int, int], list[int]] = {}
    wholes: dict[tuple[int, int], EpochRecord] = {}
    vouched: dict[tuple[int, int], int] = {}  # (domain, epoch) -> partitions
    counted: dict[tuple[int, int], int] = {}
    decoded: dict[bytes, EpochRecord] = {}
    for partition, offset, raw_part, raw_whole in markers:
        where = f"partition {partition} offset {offset}"
        part = _epoch_record(raw_part, where)
        whole = decoded.get(raw_whole) or decoded.setdefault(
            raw_whole, _epoch_record(raw_whole, where))
        domain, seq = whole.domain_id, whole.epoch_seq
        if (part.domain_id, part.epoch_seq, part.begin_id, part.end_id, part.quiescent) != (
                domain, seq, whole.begin_id, whole.end_id, whole.quiescent) \
                or part.stream != partition:
            raise InconsistentLog(f"{where}: an epoch marker for stream {part.stream} does "
                                  "not match its epoch", domain_id=domain, epoch_seq=seq)
        lane = (partition, domain)
        due = nxt.get(lane)
        if due is None and domain in starts:
            due = starts[domain].epoch_seq + 1
        if due is None:
            if whole.begin_id != 0:
                raise InconsistentLog(
                    f"partition {partition} starts in the middle of the domain (epoch {seq}): "
                    "the earlier records are gone (retention?); replay.spark reads a topic "
                    "from each domain's first epoch", domain_id=domain, epoch_seq=seq)
            due = seq
        if seq < due:
            continue  # this partition already vouched for it: a duplicate
        if seq != due:
            raise InconsistentLog(
                f"partition {partition} skips from epoch {due - 1} to epoch {seq}: epoch "
                "markers (and their events) are missing", domain_id=domain, epoch_seq=due)
        nxt[lane] = seq + 1
        offsets.setdefault(lane, []).append(offset)
        known = wholes.setdefault((domain, seq), whole)
        if known != whole:
            raise InconsistentLog(f"partitions disagree on the record of epoch {seq}: "
                                  f"{known} and {whole}", domain_id=domain, epoch_seq=seq)
        vouched[(domain, seq)] = vouched.get((domain, seq), 0) + 1
        counted[(domain, seq)] = counted.get((domain, seq), 0) + part.event_count
    records: list[EpochRecord] = []
    firsts = sorted({(d, s) for (d, s), w in wholes.items()
                     if w.begin_id == 0 and d not in starts}
                    | {(d, p.epoch_seq + 1) for d, p in starts.items()})
    for domain, seq in firsts:
        while vouched.get((domain, seq)) == partitions:
            whole = wholes[(domain, seq)]
            if counted[(domain, seq)] != whole.event_count:
                raise InconsistentLog(
                    f"the partitions hold {counted[(domain, seq)]} events of this epoch, "
                    f"its record says {whole.event_count}", domain_id=domain, epoch_seq=seq)
            records.append(whole)
            seq += 1
    return records, {lane: np.array(o, dtype=np.int64) for lane, o in offsets.items()}


# -- pass 2: events and segments in the executors -----------------------------------------


def _decode_events(rows: list[dict[str, Any]], encoding: str) -> list[tuple[Any, ...]]:
    """(partition, offset, domain, batch, seq, table, row, column, old, new) per event."""
    out = []
    for r in rows:
        value = r["value"]
        where = f"partition {r['partition']} offset {r['offset']}"
        try:
            if value[:3] == NATIVE_MAGIC:
                e = decode_native_event(value)
                out.append((r["partition"], r["offset"], *e))
            else:
                c = decode_debezium_event(value)
                out.append((r["partition"], r["offset"], c.domain_id, c.batch_id, c.seq,
                            c.table, encode_key(c.row), c.column, encode_value(c.old),
                            encode_value(c.new)))
        except CodecError as exc:
            raise CodecError(f"{where} holds a corrupt {encoding} event message: "
                             f"{exc}") from exc
    return out


def _event_batch(events: list[tuple[Any, ...]], index: EpochIndex, markers: MarkerOffsets,
                 bases: Mapping[int, int] | None = None) -> pa.RecordBatch | None:
    """EVENT_ROWS of decoded events, placed in their epochs; an event after its
    partition's marker of that epoch is left out (see the module's comment). ``bases``:
    per domain, the epoch before its lanes' first marker (a resumed stream's point)."""
    bases = bases or {}
    n = len(events)
    partition = np.array([e[0] for e in events], dtype=np.int64)
    offset = np.array([e[1] for e in events], dtype=np.int64)
    domains = np.array([e[2] for e in events], dtype=np.uint64)
    batches = np.array([e[3] for e in events], dtype=np.uint64)
    epoch = np.full(n, -1, dtype=np.int64)
    q = np.full(n, -1, dtype=np.int64)
    for domain_id in np.unique(domains).tolist():
        mask = domains == domain_id
        epoch[mask], q[mask] = index.locate(int(domain_id), batches[mask])
    keep = np.ones(n, dtype=bool)
    for (p, d), marks in markers.items():
        base = bases.get(d, 0)
        lane = (partition == p) & (domains == np.uint64(d)) & (epoch > base)
        if lane.any():
            nth = epoch[lane] - base  # 1 for the lane's first marker
            at = np.minimum(nth, len(marks)) - 1
            keep[np.flatnonzero(lane)] = (nth > len(marks)) | (offset[lane] < marks[at])
    if not keep.all():
        events = [e for e, k in zip(events, keep.tolist(), strict=True) if k]
        epoch, q, offset, partition = epoch[keep], q[keep], offset[keep], partition[keep]
        domains, batches = domains[keep], batches[keep]
        n = len(events)
    if not n:
        return None
    nothing_bin = pa.nulls(n, pa.binary())
    nothing_int = pa.nulls(n, pa.int64())
    return pa.RecordBatch.from_arrays([
        pa.array([KIND_EVENT] * n, pa.string()),
        pa.array(domains.view(np.int64)), pa.array(batches.view(np.int64)),
        pa.array([e[4] for e in events], pa.int64()),
        pa.array(epoch, pa.int64(), mask=epoch < 0), pa.array(q, pa.int64(), mask=q < 0),
        pa.array([e[5] for e in events], pa.string()),
        pa.array([e[6] for e in events], pa.binary()),
        pa.array([e[7] for e in events], pa.string()),
        pa.array([e[8] for e in events], pa.binary()),
        pa.array([e[9] for e in events], pa.binary()),
        pa.array(offset), nothing_bin, *([nothing_int] * 8),
        pa.array(partition.astype(np.int32)),
    ], schema=KAFKA_ROWS)


def _event_rows(encoding: str, index: EpochIndex, markers: MarkerOffsets,
                bases: Mapping[int, int] | None = None
                ) -> Callable[[Iterable[pa.RecordBatch]], Iterable[pa.RecordBatch]]:
    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            rows = batch.to_pylist()
            events = [r for r in rows if r["kind"] == _EVENT]
            if events:
                found = _event_batch(_decode_events(events, encoding), index, markers,
                                     bases)
                if found is not None:
                    yield found
            for r in rows:
                if r["kind"] == _CHUNK:
                    chunk = decode_chunk(r["partition"], r["offset"], r["snapshot"])
                    if (chunk.domain_id, chunk.baseline_id, chunk.index) in index.chunks:
                        cells = _chunk_cells(chunk, r["offset"])
                        yield pa.RecordBatch.from_arrays(
                            [*cells.columns, pa.nulls(cells.num_rows, pa.int32())],
                            schema=KAFKA_ROWS)

    return run


def _segment_batch(data: pa.Table) -> pa.RecordBatch:
    """Segment rows (kind ``s``) of events sorted by (domain, batch, seq), holding whole
    segments: repeated identities dropped, a conflicting copy marked."""
    domain = data.column("domain").to_numpy()
    batch = data.column("batch").to_numpy()
    seq = data.column("seq").to_numpy()
    same = np.concatenate(([False], (domain[1:] == domain[:-1]) & (batch[1:] == batch[:-1])
                           & (seq[1:] == seq[:-1])))
    conflicts: set[tuple[int, int, int]] = set()
    if same.any():
        content = ["table", "row", "column", "old", "new"]
        for i in np.flatnonzero(same).tolist():
            a = [data.column(c)[i].as_py() for c in content]
            b = [data.column(c)[i - 1].as_py() for c in content]
            if a != b:
                conflicts.add((int(domain[i]), int(batch[i]), int(seq[i]) >> SEGMENT_BITS))
        data = data.filter(pa.array(~same))
        domain, batch, seq = domain[~same], batch[~same], seq[~same]
    events = pa.RecordBatch.from_arrays([
        pa.array(domain.view(np.uint64)), pa.array(batch.view(np.uint64)),
        pa.array(seq.astype(np.uint32)),
        *(data.column(c).combine_chunks().cast(EVENT_SCHEMA.field(c).type)
          for c in ("table", "row", "column", "old", "new")),
    ], schema=EVENT_SCHEMA)
    starts, digests = segment_digests_at(events)
    m = len(starts)
    found = np.frombuffer(digests, dtype=np.uint8).reshape(m, 32)
    seg_domain, seg_batch = domain[starts], batch[starts]
    seg_seq = seq[starts] >> SEGMENT_BITS
    digest_list = [bytes(row) for row in found]
    epoch = data.column("epoch").to_numpy(zero_copy_only=False)[starts]
    q = data.column("q").to_numpy(zero_copy_only=False)[starts]
    offset = data.column("offset").to_numpy()[starts]
    extra = [k for k in range(m)
             if (int(seg_domain[k]), int(seg_batch[k]), int(seg_seq[k])) in conflicts]
    take = np.concatenate((np.arange(m), np.array(extra, dtype=np.int64)))
    digest_list += [_CONFLICT] * len(extra)
    lanes = np.frombuffer(b"".join(digest_list), dtype="<u4").reshape(len(take), 8)
    total = len(take)
    nothing_str = pa.nulls(total, pa.string())
    nothing_bin = pa.nulls(total, pa.binary())
    return pa.RecordBatch.from_arrays([
        pa.array([KIND_SEGMENT] * total, pa.string()),
        pa.array(seg_domain[take]), pa.array(seg_batch[take]),
        pa.array(seg_seq[take].astype(np.int64)),
        pa.array(epoch[take].astype(np.int64)), pa.array(q[take].astype(np.int64)),
        nothing_str, nothing_bin, nothing_str, nothing_bin, nothing_bin,
        pa.array(offset[take]), pa.array(digest_list, pa.binary()),
        *(pa.array(lanes[:, i].astype(np.int64)) for i in range(8)),
    ], schema=EVENT_ROWS)


def _segment_rows(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Executor side: events arrive clustered by (domain, batch) and sorted by seq; one
    row per segment (``_segment_batch``)."""
    return _whole_segments(batches, ("domain", "batch"), _segment_batch)


def _whole_segments(batches: Iterable[pa.RecordBatch], keys: tuple[str, ...],
                    make: Callable[[pa.Table], pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``make`` applied to runs of whole segments: rows clustered by ``keys`` and sorted
    by seq, a segment being one value of ``keys`` and of ``seq >> SEGMENT_BITS``. A
    segment may straddle two Arrow batches, so the last one waits for the next batch."""
    carry: pa.Table | None = None
    for batch in batches:
        table = pa.Table.from_batches([batch])
        if carry is not None:
            table = pa.concat_tables([carry, table])
        if not table.num_rows:
            continue
        columns = [table.column(c).to_numpy() for c in keys]
        columns.append(table.column("seq").to_numpy() >> SEGMENT_BITS)
        change = np.zeros(table.num_rows - 1, dtype=bool)
        for column in columns:
            change |= column[1:] != column[:-1]
        cuts = np.flatnonzero(change) + 1
        cut = int(cuts[-1]) if len(cuts) else 0
        carry = table.slice(cut)
        if cut:
            yield make(table.slice(0, cut))
    if carry is not None and carry.num_rows:
        yield make(carry)


def kafka_rows(spark: SparkSession, topic: KafkaTopic, index: EpochIndex,
               markers: MarkerOffsets, bases: Mapping[int, int] | None = None
               ) -> tuple[DataFrame, Callable[[DataFrame], DataFrame]]:
    """Pass 2: the events and accepted chunks' cells as EVENT_ROWS, and the function
    that adds their segments (to call once the events are persisted). ``bases``: see
    ``vouched_epochs``'s ``starts``."""
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = from_arrow_schema(EVENT_ROWS)
    frame = topic.frame(spark).filter(F.col("kind").isin(_EVENT, _CHUNK)).select(
        "partition", "offset", "kind", "value", "snapshot")
    rows = frame.mapInArrow(_event_rows(topic.encoding, index, markers, bases),
                            from_arrow_schema(KAFKA_ROWS))

    def with_segments(events: DataFrame) -> DataFrame:
        placed = events.filter((F.col("kind") == F.lit(KIND_EVENT)) & F.col("q").isNotNull())
        segments = (placed.repartition("domain", "batch")
                    .sortWithinPartitions("domain", "batch", "seq")
                    .mapInArrow(_segment_rows, schema))
        return events.unionByName(segments, allowMissingColumns=True)

    return rows, with_segments


# -- each partition's share of each epoch (its marker's own count, tables, setsum) ---------

# One row per partition and verified epoch: what that partition's marker says.
SHARES: Final = pa.schema([
    pa.field("partition", pa.int32()), pa.field("domain", pa.int64()),
    pa.field("epoch", pa.int64()), pa.field("q", pa.int64()),
    pa.field("expected_events", pa.int64()),
    pa.field("expected_tables", pa.list_(pa.struct([
        pa.field("table", pa.string()), pa.field("events", pa.int64())]))),
    pa.field("setsum", pa.string()), *[pa.field(f"e{i}", pa.int64()) for i in range(8)],
])
_SHARE_LANES: Final = pa.schema([
    pa.field("partition", pa.int32()), pa.field("domain", pa.int64()),
    pa.field("epoch", pa.int64()), *[pa.field(f"l{i}", pa.int64()) for i in range(8)],
])


def vouched_shares(markers: Iterable[tuple[int, int, bytes, bytes]],
                   records: Iterable[EpochRecord]) -> list[EpochRecord]:
    """Each partition's marker record (its share: count, per-table counts, setsum) of
    every verified epoch, the first copy in the partition's order."""
    wanted = {(r.domain_id, r.epoch_seq) for r in records}
    shares: dict[tuple[int, int, int], EpochRecord] = {}
    for partition, offset, raw_part, _whole in markers:
        part = _epoch_record(raw_part, f"partition {partition} offset {offset}")
        if (part.domain_id, part.epoch_seq) in wanted:
            shares.setdefault((partition, part.domain_id, part.epoch_seq), part)
    return list(shares.values())



def share_columns(shares: Iterable[EpochRecord], q_of: Callable[[int, int], int]
                  ) -> dict[str, list[object]]:
    """``SHARES`` columns (``q_of(domain, epoch)``: the interval the epoch closes in)."""
    import struct

    cols: dict[str, list[object]] = {f.name: [] for f in SHARES}
    for part in shares:
        lanes = struct.unpack("<8I", bytes.fromhex(part.setsum) if part.setsum else bytes(32))
        for name, value in (
                ("partition", part.stream), ("domain", signed_bits(part.domain_id)),
                ("epoch", part.epoch_seq), ("q", q_of(part.domain_id, part.epoch_seq)),
                ("expected_events", part.event_count),
                ("expected_tables", [{"table": t, "events": n}
                                     for t, n in sorted(part.table_counts)]),
                ("setsum", part.setsum), *((f"e{i}", lanes[i]) for i in range(8))):
            cols[name].append(value)
    return cols


def _share_lanes(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Executor side: events sorted by (partition, domain, batch, seq) and clustered by
    (partition, domain, batch); one row per segment of a partition (as the sink hashes
    a partition's share: ``sinks.kafka._tally``) with its digest's lanes."""
    return _whole_segments(batches, ("partition", "domain", "batch"), _share_batch)


def _share_batch(data: pa.Table) -> pa.RecordBatch:
    partition = data.column("partition").to_numpy()
    runs = np.flatnonzero(partition[1:] != partition[:-1]) + 1
    bounds = np.concatenate(([0], runs, [len(partition)])).tolist()
    out: dict[str, list[Any]] = {f.name: [] for f in _SHARE_LANES}
    for lo, hi in itertools.pairwise(bounds):
        part = data.slice(lo, hi - lo)
        domain = part.column("domain").to_numpy()
        events = pa.RecordBatch.from_arrays([
            pa.array(domain.view(np.uint64)),
            pa.array(part.column("batch").to_numpy().view(np.uint64)),
            pa.array(part.column("seq").to_numpy().astype(np.uint32)),
            *(part.column(c).combine_chunks().cast(EVENT_SCHEMA.field(c).type)
              for c in ("table", "row", "column", "old", "new")),
        ], schema=EVENT_SCHEMA)
        starts, digests = segment_digests_at(events)
        lanes = np.frombuffer(digests, dtype="<u4").reshape(len(starts), 8)
        epoch = part.column("epoch").to_numpy(zero_copy_only=False)[starts]
        out["partition"] += [int(partition[lo])] * len(starts)
        out["domain"] += domain[starts].tolist()
        out["epoch"] += epoch.astype(np.int64).tolist()
        for i in range(8):
            out[f"l{i}"] += lanes[:, i].astype(np.int64).tolist()
    return pa.RecordBatch.from_pydict(out, schema=_SHARE_LANES)


def share_failures(events: DataFrame, expected: DataFrame) -> DataFrame:
    """(``domain``, ``epoch``, ``q``, ``message``) of every partition's share of a
    verified epoch whose events (``events``: KIND_EVENT rows with ``partition``, placed,
    kept before the partition's marker) differ from its marker in count, per-table
    counts or setsum, as the Python consumer checks each partition (all aggregates)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from sinks import SETSUM_PRIMES

    mine = (events.filter(F.col("epoch").isNotNull())
            .dropDuplicates(["partition", "domain", "batch", "seq"]))
    per_table = mine.groupBy("partition", "domain", "epoch", "table").agg(
        F.count("*").alias("events"))
    found = per_table.groupBy("partition", "domain", "epoch").agg(
        F.sum("events").alias("events"),
        F.array_sort(F.collect_list(F.struct("table", "events"))).alias("tables"))
    lanes = [f"l{i}" for i in range(8)]
    sums = (mine.select("partition", "domain", "batch", "seq", "epoch", "table", "row",
                        "column", "old", "new")
            .repartition("partition", "domain", "batch")
            .sortWithinPartitions("partition", "domain", "batch", "seq")
            .mapInArrow(_share_lanes, from_arrow_schema(_SHARE_LANES))
            .groupBy("partition", "domain", "epoch").agg(*(F.sum(c).alias(c) for c in lanes)))
    keys = ["partition", "domain", "epoch"]
    joined = (expected.join(found, keys, "left").join(sums, keys, "left")
              .fillna(0, ["events", *lanes]))
    setsum_ok = F.lit(True)
    for i, prime in enumerate(SETSUM_PRIMES):
        setsum_ok = setsum_ok & (F.pmod(F.col(f"l{i}"), F.lit(prime)) == F.col(f"e{i}"))
    tables = F.coalesce(F.col("tables"), F.array().cast(expected.schema["expected_tables"]
                                                         .dataType))
    where = F.concat(F.lit("partition "), F.col("partition").cast("string"), F.lit(": "))
    message = (
        F.when(F.col("events") != F.col("expected_events"), F.concat(
            where, F.lit("it holds "), F.col("events").cast("string"),
            F.lit(" events of this epoch before its marker, the marker says "),
            F.col("expected_events").cast("string")))
        .when(tables != F.col("expected_tables"), F.concat(
            where, F.lit("per-table counts "), tables.cast("string"),
            F.lit(" differ from the marker's "), F.col("expected_tables").cast("string")))
        .when(~setsum_ok, F.concat(
            where, F.lit("setsum of its events of this epoch differs from its marker's "),
            F.col("setsum"), F.lit(" (the marker or an event was altered)"))))
    return joined.select("domain", "epoch", "q", message.alias("message")).filter(
        F.col("message").isNotNull())
