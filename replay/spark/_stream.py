"""Streaming: micro-batches that end only at quiescence points, offsets Spark checkpoints.

Two parts:

- ``QuiescencePoints``, a PySpark Python data source (``spark.readStream.format(
  "cdc_agent_points")``): its offsets are frontiers of quiescence points of a wal3 log
  (one position token per domain, ``replay.Position``), found by reading the log's new
  fragments in the driver's Python data source process (only epoch records and
  snapshot chunk headers are decoded). A domain's offset never enters a baseline that
  is not whole yet (its states there are partial). Each micro-batch's rows are the end
  frontier, one row per domain: a consistent cut.
- ``stream_changesets`` runs a query over it whose ``foreachBatch`` appends the
  verified changesets up to that frontier to a table (``write_changesets``: after what
  the table already holds). Spark checkpoints the offsets; a micro-batch rerun after a
  crash writes nothing twice, because the table itself says how far it got. So a
  restarted query neither skips nor repeats an interval.

Each micro-batch reads only what is new. After writing up to frontier ``W`` it saves,
under the query's checkpoint folder (``cdc_agent_resume/<batch id>/``), the cells at
``W`` (Parquet) and the offset from which every record of a later interval is in the
log (the lowest offset of an event after ``W`` or of ``W``'s quiescence record), with
its ``meta`` written last. The next micro-batch (or a restarted query) resumes from it
(``replay.spark._checkpoint.Resumed``): those cells stand at ``W``, only the records
from that offset are read and verified. It resumes only if the table holds nothing
after ``W`` (a micro-batch that wrote but crashed before saving leaves rows after the
saved ``W``): otherwise, and for a log with baselines or a collected log, it replays
the log from the start, as before.

A Kafka topic written by ``KafkaSink`` (``kafka://host:port/topic``) streams the same
way, but Kafka's offsets are per partition and an epoch spans every partition, so the
source's offsets are again frontiers, of the quiescence points every partition vouched
for (``replay.spark._kafka_points.TopicScan`` reads the new messages' markers in the
driver), with the partition ends it had read (``"ends"``). Each micro-batch replays the
topic up to those ends (``LogReplay(topic_end=...)``) and writes up to its settled
frontier after what the table holds. It resumes too: the saved point's offsets are per
partition (``replay.spark._topic_resume``), and a point the topic no longer holds
(retention), of another topic or of another version falls back to a replay from the
topic's start, which the progress message says.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import LongType, StringType, StructField, StructType

from replay._position import Frontier, Position
from replay.spark._baselines import points_a_cut_needs
from replay.spark._decode import signed_bits
from replay.spark._kafka import KAFKA_SCHEME, parse_topic_uri
from replay.spark._kafka_points import TopicScan

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from replay.spark._checkpoint import Resumed
    from replay.spark._output import Format
    from replay.spark._replay import ChangeStyle, LogReplay

__all__ = ["POINTS_SCHEMA", "QuiescencePoints", "SavedPoint", "load_resume",
           "newest_saved_point", "save_resume", "stream_changesets"]

SOURCE_NAME: Final = "cdc_agent_points"
POINTS_SCHEMA: Final = StructType([
    StructField("_domain", LongType()), StructField("_epoch", LongType()),
    StructField("_position", StringType()),
    StructField("_ends", StringType()),  # a topic's partition ends (JSON); null: wal3
])
_KINDS_EPOCH: Final = (0x02, 0x04)  # sinks.codec: EPOCH (one record), EPOCHS (a run)
_KIND_SNAPSHOT: Final = 0x03
RESUME_FOLDER: Final = "cdc_agent_resume"
_KEEP_SAVED: Final = 2  # saved points kept (the newest, and the one before)


@dataclass
class _Scan:
    """What the log said so far: quiescence points and first baselines, per domain."""

    through: int = 0  # records below this offset are read
    points: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # (seq, end_id)
    first: dict[int, int] = field(default_factory=dict)  # domain -> its first baseline id
    start: dict[int, int] = field(default_factory=dict)  # ... its chunk 0's point
    end: dict[int, int] = field(default_factory=dict)  # ... its last chunk's point

    def point(self, domain_id: int, epoch_seq: int, end_id: int) -> None:
        """A quiescence point found (a later one than the domain's last, or ignored).
        Only the points the cut can use stay: what is kept does not grow with the log."""
        points = self.points.setdefault(domain_id, [])
        if not points or points[-1][0] < epoch_seq:
            points.append((epoch_seq, end_id))
            if len(points) > 2:
                self.points[domain_id] = points_a_cut_needs(points, self.start.get(domain_id))

    def chunk(self, domain_id: int, baseline_id: int, epoch_seq: int, last: bool) -> None:
        """A baseline chunk's header found (in the log's order)."""
        d = domain_id
        if d not in self.first:
            self.first[d], self.start[d] = baseline_id, epoch_seq
        if baseline_id == self.first[d] and last:
            self.end[d] = epoch_seq

    def frontier(self) -> Frontier:
        """Each domain's last quiescence point outside a baseline that is not whole."""
        positions = []
        for domain_id, points in self.points.items():
            ok = points
            if domain_id in self.start:
                start, end = self.start[domain_id], self.end.get(domain_id)
                whole = [p for p in points if end is not None and p[0] >= end]
                ok = whole or [p for p in points if p[0] < start]
            if ok:
                seq, end_id = ok[-1]
                positions.append(Position(domain_id, seq, end_id))
        return Frontier.of(positions)


def _scan(reader: Any, scan: _Scan) -> None:
    """Read the records after ``scan.through`` (whole fragments), updating ``scan``."""
    from sequencer import EpochRecord
    from sinks.codec import SnapshotChunk, decode, records

    manifest = reader.manifest()
    for fragment in reader.scan(manifest=manifest):
        if fragment.limit <= scan.through:
            continue
        for record in reader.fetch(fragment):
            body = record.body
            if record.offset < scan.through or len(body) < 5:
                continue
            if body[4] in _KINDS_EPOCH:
                for epoch in records(decode(body)):  # an EPOCHS run holds many
                    if isinstance(epoch, EpochRecord) and epoch.quiescent:
                        scan.point(epoch.domain_id, epoch.epoch_seq, epoch.end_id)
            elif body[4] == _KIND_SNAPSHOT:
                chunk = decode(body)
                assert isinstance(chunk, SnapshotChunk)
                scan.chunk(chunk.domain_id, chunk.baseline_id, chunk.epoch_seq, chunk.last)
        scan.through = max(scan.through, fragment.limit)


def topic_frontier(topic: TopicScan) -> Frontier:
    """The frontier of a topic's quiescence points every partition vouched for, kept
    out of baselines that are not whole (``_Scan.frontier``)."""
    scan = _Scan()
    for c in topic.chunks:
        scan.chunk(c.domain_id, c.baseline_id, c.epoch_seq, c.last)
    for domain_id, points in topic.quiescence_points().items():
        for epoch_seq, end_id in points:  # (the few the cut can use: points_a_cut_needs)
            scan.point(domain_id, epoch_seq, end_id)
    return scan.frontier()


class _Partition(InputPartition):
    def __init__(self, frontier: str, ends: str | None = None) -> None:
        super().__init__(frontier)
        self.frontier = frontier
        self.ends = ends


class _PointsReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        self._options = options
        self._scan = _Scan()
        self._topic: TopicScan | None = None  # a kafka:// topic's scan
        self._last: dict[str, Any] | None = None  # the last offset handed out (a topic)

    def __getstate__(self) -> dict[str, Any]:
        # Spark pickles the reader to run ``read`` in a worker: only the options go.
        return {"_options": self._options, "_scan": _Scan(), "_topic": None, "_last": None}

    def _reader(self) -> Any:
        from sinks.wal3 import LogReader

        options = self._options
        return LogReader(options["uri"], options.get("prefix", ""),
                         endpoint_url=options.get("endpoint_url") or None)

    def initialOffset(self) -> dict[str, Any]:
        return {"frontier": ""}

    def latestOffset(self) -> dict[str, Any]:
        options = self._options
        if options["uri"].startswith(KAFKA_SCHEME):
            return self._topic_offset()
        _scan(self._reader(), self._scan)
        return {"frontier": str(self._scan.frontier())}

    def _topic_offset(self) -> dict[str, Any]:
        """A topic's offset: the frontier, and each partition's end when it was first
        reached (the micro-batch reads up to there), unchanged while the frontier is."""
        if self._topic is None:
            self._topic = TopicScan(self._options["uri"],
                                    self._options.get("encoding") or "native")
            if self._options.get("resume_offsets"):  # a restarted query's saved point
                self._topic.resume_from(json.loads(self._options["resume_offsets"]),
                                        Frontier.parse(self._options["resume_frontier"]))
        ends = self._topic.advance()
        frontier = str(topic_frontier(self._topic))
        if self._last is None or self._last["frontier"] != frontier:
            self._last = {"frontier": frontier, "ends": list(ends)}
        return self._last

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        ends = end.get("ends")
        return [_Partition(end["frontier"], None if ends is None else json.dumps(ends))]

    def read(self, partition: InputPartition) -> Iterator[tuple[int, int, str, str | None]]:
        text = partition.frontier  # type: ignore[attr-defined]
        ends = getattr(partition, "ends", None)
        for p in Frontier.parse(text) if text else ():
            yield signed_bits(p.domain_id), p.epoch_seq, str(p), ends

    def commit(self, end: dict[str, Any]) -> None:
        pass


class QuiescencePoints(DataSource):
    """``spark.readStream.format("cdc_agent_points").option("uri", ...)``: a stream
    whose micro-batches end at quiescence points of a wal3 log (options ``uri``,
    ``prefix``, ``endpoint_url``) or of a Kafka topic written by ``KafkaSink`` (``uri``
    ``kafka://host:port/topic``, ``encoding``). Register it with
    ``spark.dataSource.register``."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return POINTS_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        if "uri" not in self.options:
            raise ValueError(f"{SOURCE_NAME}: give the log with .option('uri', ...)")
        return _PointsReader(dict(self.options))


def points_stream(spark: SparkSession, uri: str, *, prefix: str = "",
                  endpoint_url: str | None = None, encoding: str = "native",
                  resume: tuple[Frontier, list[int]] | None = None) -> DataFrame:
    """The streaming DataFrame of quiescence-point frontiers of the log at ``uri``;
    ``resume``: a topic's saved point (frontier, offsets) its look starts at."""
    spark.dataSource.register(QuiescencePoints)
    reader = (spark.readStream.format(SOURCE_NAME).option("uri", uri).option("prefix", prefix)
              .option("encoding", encoding))
    if endpoint_url:
        reader = reader.option("endpoint_url", endpoint_url)
    if resume is not None:
        reader = (reader.option("resume_frontier", str(resume[0]))
                  .option("resume_offsets", json.dumps(resume[1])))
    return reader.load()


def stream_changesets(spark: SparkSession, uri: str, path: str, *, checkpoint: str,
                      format: Format = "delta", style: ChangeStyle = "before_after",
                      prefix: str = "", endpoint_url: str | None = None,
                      encoding: str = "native", interval: str = "10 seconds",
                      on_batch: Callable[[int, int], None] | None = None,
                      progress: Callable[[str], None] | None = None,
                      once: bool = False) -> StreamingQuery:
    """Start a query that keeps the changeset table at ``path`` up to date with the log.

    Each micro-batch ends at a frontier of quiescence points (offsets checkpointed in
    ``checkpoint``) and appends the verified changesets up to it (``write_changesets``).
    ``on_batch(batch_id, rows)`` is called after each micro-batch is written;
    ``progress(text)`` hears where each micro-batch starts (resumed or from scratch).
    ``once``: apply what the log holds when the query starts, then stop (Spark's
    ``availableNow`` trigger: the query ends even while writers go on writing).
    Raises (in the query) ``InconsistentLog`` as the batch replay does; a domain whose
    cell check breaks before its baseline arrived waits for it (``LogReplay.settle``).
    """
    from replay.spark._kafka import TopicTrimmed
    from replay.spark._output import applied_frontier, write_changesets
    from replay.spark._replay import LogReplay
    from replay.spark._topic_resume import (
        load_topic_resume,
        save_topic_resume,
        saved_topic_offsets,
    )
    from sinks.wal3 import GarbageCollected

    topic = uri.startswith(KAFKA_SCHEME)
    if topic:
        TopicScan(uri, encoding)  # refuse a bad URI or encoding now, not in the query
    elif encoding != "native":
        raise ValueError(f"encoding={encoding!r} is for Kafka topics; {uri!r} is a wal3 log")

    def each(batch: DataFrame, batch_id: int) -> None:
        rows = batch.collect()
        end = Frontier.of([Position.parse(r["_position"]) for r in rows])
        if not len(end.positions):
            return
        why = ""
        resume: Resumed | None
        if topic:  # up to the ends the source saw, from the saved offsets if they fit
            ends = None if rows[0]["_ends"] is None else json.loads(rows[0]["_ends"])
            resume, why = load_topic_resume(spark, saved, applied_frontier(
                spark, path, format), parse_topic_uri(uri)[1], encoding)
            # Where the table is (as for a wal3 log below), even if not resumed.
            since = None if resume is None else Frontier.of(resume.frontier.values())
            try:
                replay = LogReplay(spark, uri, encoding=encoding, topic_end=ends,
                                   resume=resume)
            except TopicTrimmed as exc:  # retention removed messages the point needs
                resume, why = None, str(exc)
                replay = LogReplay(spark, uri, encoding=encoding, topic_end=ends)
        else:
            resume = load_resume(spark, saved, applied_frontier(spark, path, format))
            # Where the table is: the saved frontier counts the intervals that wrote no
            # row (the table's rows cannot show them, and a collected log lost them).
            since = None if resume is None else Frontier.of(resume.frontier.values())
            try:
                replay = LogReplay(spark, uri, prefix=prefix, endpoint_url=endpoint_url,
                                   resume=resume)
            except GarbageCollected:  # collected past the saved point (cdc-agent log gc)
                resume = None  # from the start, which on a collected log is its checkpoint
                replay = LogReplay(spark, uri, prefix=prefix, endpoint_url=endpoint_url)
        if progress is not None:
            progress(f"micro-batch {batch_id}: " + _where(replay, resume, why))
        try:
            until = replay.settle(end)
            written = write_changesets(
                replay, path, format=format, style=style, end=until, exact=True,
                since=since)
            if topic:
                save_topic_resume(replay, saved, batch_id, until)
            else:
                save_resume(replay, saved, batch_id, until)
        finally:
            replay.unpersist()
        if on_batch is not None:
            on_batch(batch_id, written)

    saved = checkpoint.rstrip("/") + "/" + RESUME_FOLDER
    seed = None
    if topic:  # a restarted query's source looks at the topic from the saved offsets on
        seed = saved_topic_offsets(spark, saved, parse_topic_uri(uri)[1], encoding)
    return (points_stream(spark, uri, prefix=prefix, endpoint_url=endpoint_url,
                          encoding=encoding, resume=seed)
            .writeStream.foreachBatch(each).option("checkpointLocation", checkpoint)
            .trigger(**({"availableNow": True} if once else {"processingTime": interval}))
            .start())


def _where(replay: LogReplay, resume: Resumed | None, why: str) -> str:
    """Where a micro-batch starts, for its progress message."""
    from replay.spark._kafka import KafkaTopic
    from replay.spark._topic_resume import TopicResumed

    source = replay.source
    if isinstance(source, KafkaTopic):
        span = (f"{source.messages()} messages, offsets {list(source.start)} up to "
                f"{list(source.end)}")
        if isinstance(resume, TopicResumed):
            return f"resumed at {Frontier.of(resume.frontier.values())}, the topic's {span}"
        return f"the topic from its start up to offsets {list(source.end)} ({span})" + (
            f"; not resumed: {why}" if why else "")
    if resume is None:
        return "from the start of the log"
    return (f"resumed at {Frontier.of(resume.frontier.values())}, records from offset "
            f"{resume.begin}")


# -- resuming a micro-batch where the previous one saved ----------------------------------

def save_resume(replay: LogReplay, folder: str, batch_id: int, until: Frontier) -> bool:
    """Save where a replay that wrote up to ``until`` can be resumed (see the module's
    docstring); False when it cannot be: a domain left out of ``until``, baselines, a
    collected log (those replay from the start)."""
    from pyspark.sql import functions as F

    from replay.spark._checkpoint import Resumed
    from replay.spark._decode import KIND_EVENT, KIND_SEGMENT
    from replay.spark._source import LogSource
    from replay.spark._topic_resume import pending_events

    source = replay.source
    resumed = replay._compacted if isinstance(replay._compacted, Resumed) else None
    if (not isinstance(source, LogSource) or source.deltas or replay.baselines
            or {p.domain_id for p in until} != set(replay.epochs.epochs)):
        return False
    starts = []
    for p in until:
        offset = replay.quiescent_offsets.get((p.domain_id, p.epoch_seq))
        if offset is None:  # the point it resumed at: nothing of the domain came since
            if resumed is None or resumed.frontier.get(p.domain_id) != p:
                return False
            offset = resumed.begin
        starts.append(offset)
    # A domain not in ``until`` has no epoch record yet (a new agent: its first batch
    # may ship segments, or its events fragment land before its epochs): all of it.
    rows = replay._rows.filter(F.col("kind").isin(KIND_EVENT, KIND_SEGMENT)
                               & pending_events(until))
    first = rows.agg(F.min("offset")).collect()[0][0]
    begin = min([*starts, *([] if first is None else [int(first)])])
    write_saved_point(replay, folder, batch_id, until, [(str(until), begin)],
                      "frontier string, begin long")
    return True


def write_saved_point(replay: LogReplay, folder: str, batch_id: int, until: Frontier,
                      meta: list[tuple[object, ...]], schema: str) -> None:
    """Write a saved point: the cells at ``until``, then its ``meta`` row (last: the
    point is saved once that is), keeping the newest ``_KEEP_SAVED`` points."""
    from replay.spark._frames import CELL
    from replay.spark._output import _fs

    spark = replay.spark
    here = f"{folder}/{batch_id:012d}"
    replay._state_at(until).select("_domain", *CELL, "value").write.mode(
        "overwrite").parquet(here + "/cells")
    spark.createDataFrame(meta, schema).write.mode("overwrite").parquet(here + "/meta")
    fs, root = _fs(spark, folder)
    names = sorted(s.getPath().getName() for s in fs.listStatus(root))
    for name in names[:-_KEEP_SAVED]:
        fs.delete(root.suffix("/" + name), True)


@dataclass(frozen=True)
class SavedPoint:
    """A saved point under a stream's checkpoint: its folder's name and path, and its
    ``meta`` row (``frontier``, then what its writer added: ``begin`` or ``offsets``)."""

    name: str
    path: str
    meta: dict[str, Any]

    def frontier(self) -> dict[int, Position]:
        return {p.domain_id: p for p in Frontier.parse(self.meta["frontier"])}

    def fits(self, applied: Frontier) -> bool:
        """True when the changeset table (at ``applied``: each domain's last written
        point) holds nothing after this point (else a micro-batch wrote after it and
        crashed before saving: the rows after it would be written twice)."""
        frontier = self.frontier()
        return all(p.domain_id in frontier and p.epoch_seq <= frontier[p.domain_id].epoch_seq
                   for p in applied)


def newest_saved_point(spark: SparkSession, folder: str) -> SavedPoint | None:
    """The newest point saved whole under ``folder`` (one whose save was cut short,
    without ``meta/_SUCCESS``, is passed over: the one before may still fit)."""
    from replay.spark._output import _exists, _fs

    fs, root = _fs(spark, folder)
    if not fs.exists(root):
        return None
    names = sorted((s.getPath().getName() for s in fs.listStatus(root)), reverse=True)
    for name in names:
        here = f"{folder}/{name}"
        if _exists(spark, here + "/meta/_SUCCESS"):
            row = spark.read.parquet(here + "/meta").collect()[0]
            return SavedPoint(name, here, row.asDict())
    return None


def load_resume(spark: SparkSession, folder: str, applied: Frontier) -> Resumed | None:
    """The newest saved point, if the changeset table (at ``applied``: each domain's
    last written point) holds nothing after it; else None (replay from the start)."""
    from replay.spark._checkpoint import Resumed

    point = newest_saved_point(spark, folder)
    if point is None or "begin" not in point.meta:
        return None  # nothing saved, or not a wal3 point (a topic's): from the start
    if not point.fits(applied):
        return None
    return Resumed(point.frontier(), int(point.meta["begin"]), point.path + "/cells")
