"""``LogReplay``: one wal3 log read into Spark, verified, and the views built on it.

The driver reads the manifest and the epoch records (few); the executors fetch and
decode the fragments and every check runs as a Spark aggregate:

1. duplicated deliveries are dropped by event identity (domain, batch, seq); two
   different copies of one segment (an altered duplicate) are refused;
2. each epoch's event count, per-table counts and setsum (the sum of its segments'
   setsum lanes, modulo the lane primes) must match its record;
3. each cell's events, per quiescent interval, must net out (as a Z-set: +new, -old) to
   nothing or to exactly ``+final -initial``, with ``initial`` the value the cell held
   (the previous interval's final, ABSENT at the start); an interval that nets to
   nothing must have replaced the value held.

Any failure raises ``InconsistentLog`` naming domain, epoch and cell before a state or
changeset of that interval (or a later one) is produced. Values stay tagged bytes
(``sinks.codec``) throughout, so NaN payloads, -0.0, bytes vs str and None vs ABSENT
survive, and nothing is ever grouped on a double.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Final, Literal

import numpy as np
import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from replay._errors import InconsistentLog
from replay._position import Frontier, Position
from replay.spark._baselines import (
    COVERS,
    BaselineTable,
    ChunkHeader,
    build_baselines,
    covering_chunks,
)
from replay.spark._cells import CELL_ROWS, KIND_CELL, KIND_COUNT, KIND_RESET, walk_cells
from replay.spark._checkpoint import Compacted, Resumed
from replay.spark._decode import (
    EVENT_ROWS,
    FRAGMENTS,
    KIND_BASELINE,
    KIND_EVENT,
    KIND_SEGMENT,
    event_rows,
    signed_bits,
)
from replay.spark._epoch_rows import (
    EPOCH_FIELDS,
    METADATA_ROWS,
    PLACED_EPOCHS,
    metadata_rows,
    place_epochs,
    record_rows,
    rows_to_records,
)
from replay.spark._epochs import (
    EpochColumns,
    EpochTable,
    build_epoch_table,
    read_metadata,
)
from replay.spark._errors import executor_errors
from replay.spark._frames import CELL, absent, as_unsigned, spark_schema, table_frame
from replay.spark._kafka import (
    KAFKA_SCHEME,
    SHARES,
    KafkaTopic,
    MarkerOffsets,
    kafka_metadata,
    kafka_rows,
    open_topic,
    share_columns,
    share_failures,
    vouched_epochs,
    vouched_shares,
)
from replay.spark._source import LogSource, list_fragments
from replay.spark._topic_resume import TopicResumed
from sequencer import EpochRecord
from sinks import SETSUM_PRIMES
from sinks.codec import decode_key

__all__ = ["ChangeStyle", "LogReplay", "Progress"]

_LANES: Final = [f"l{i}" for i in range(8)]
_IDENTITY: Final = ["domain", "batch", "seq"]

Progress = Callable[[str], None] | None
ChangeStyle = Literal["before_after", "delta"]

_POINTS: Final = pa.schema([
    pa.field("domain", pa.int64()), pa.field("q", pa.int64()),
    pa.field("_position", pa.string()), pa.field("_end_id", pa.decimal128(20, 0)),
])


# The failures of one interval in the Python Kafka consumer's order: two copies of a
# segment or a partition's share, then an epoch's record, then its cells. So a lost
# event is named by its epoch's count (the cause), not by the cell whose chain it broke
# (an effect, possibly in an earlier epoch of the interval).
RANK_SEGMENT: Final = 0
RANK_EPOCH: Final = 1
RANK_CELL: Final = 2


def first_failures(every: DataFrame) -> DataFrame:
    """Per (domain, forgiven): the first failure of the first interval that fails, by
    rank, then epoch, cell and message, so the same log always names the same failure
    (by interval and epoch alone, a tie went to whichever task answered first).
    Columns of ``every``: domain, forgiven, q, epoch, rank, table, row, column, message."""
    return every.groupBy("domain", "forgiven").agg(F.min_by(
        F.struct("epoch", "q", *CELL, "message"),
        F.struct("q", "rank", "epoch", *CELL, "message")).alias("f"))


def _frontier(at: str | Position | Frontier | None) -> Frontier | None:
    if at is None or isinstance(at, Frontier):
        return at
    if isinstance(at, Position):
        return Frontier.of([at])
    return Frontier.parse(at)


@dataclass(frozen=True)
class _Failure:
    domain_id: int
    epoch_seq: int
    q: int
    cell: tuple[str, object, str] | None
    message: str
    forgiven: bool = False  # a broken chain a baseline later covers (see check)

    def error(self) -> InconsistentLog:
        return InconsistentLog(self.message, domain_id=self.domain_id,
                               epoch_seq=self.epoch_seq, cell=self.cell)


class LogReplay:
    """A log opened for Spark: events, verification, snapshots and changesets.

    ``uri``: a wal3 log (``file:///dir``, ``s3://bucket/prefix``) or a Kafka topic
    written by ``KafkaSink`` (``kafka://host:port/topic``, in ``encoding`` ``native``
    or ``debezium``; read up to where its partitions ended when it was opened).

    ``resume``: start from a point a stream's previous micro-batch saved (its cells and
    the records from an offset, ``_stream``; a topic's, ``TopicResumed``: the messages
    from per-partition offsets, ``_topic_resume``) instead of the log's start. ``topic_end``:
    read a topic up to these offsets (per partition, a stream's) instead of its end now.

    Reading happens on first use and is cached in the session (``unpersist()`` frees
    it). The module functions ``events``, ``verify``, ``snapshot`` and ``changesets``
    open one of these; open it yourself to ask several questions of one log.
    """

    def __init__(self, spark: SparkSession, uri: str, *, prefix: str = "",
                 endpoint_url: str | None = None, progress: Progress = None,
                 encoding: str = "native", resume: Resumed | None = None,
                 topic_end: Sequence[int] | None = None) -> None:
        self.spark = spark
        self.uri = uri
        self._progress = progress
        self._persisted: list[DataFrame] = []
        self._markers: MarkerOffsets = {}
        self._compacted: Compacted | Resumed | None = None
        # (domain, epoch) -> offset of each quiescence point's record (pass 1; _stream)
        self.quiescent_offsets = EpochColumns.from_records([]).quiescent_offsets()
        # pass 1's epoch records as rows (``_epoch_rows.METADATA_ROWS``), for _expected
        self._epoch_rows: DataFrame | None = None
        self._shares: list[EpochRecord] = []  # a topic's partition markers (_kafka)
        # a topic's markers and chunk headers as pass 1 found them (_topic_resume)
        self.topic_metadata: tuple[list[tuple[int, int, bytes, bytes]],
                                   list[ChunkHeader]] = ([], [])
        self.source: LogSource | KafkaTopic
        if uri.startswith(KAFKA_SCHEME):
            if resume is not None:  # a topic stream's micro-batch, from its saved offsets
                if not isinstance(resume, TopicResumed):
                    raise ValueError("a topic resumes from a TopicResumed point only")
                self._compacted = resume
            self.source = open_topic(uri, encoding, end=topic_end,
                                     start=None if resume is None else resume.offsets)
            self._say(f"topic {self.source.topic!r}: {self.source.partitions} partitions, "
                      f"{self.source.messages()} messages to read ({encoding})")
            return
        if encoding != "native":
            raise ValueError(f"encoding={encoding!r} is for Kafka topics; {uri!r} is a "
                             "wal3 log")
        if resume is not None:  # a stream's micro-batch, where the previous one saved
            self.source = list_fragments(uri, prefix, endpoint_url, begin=resume.begin)
            self._compacted = resume
        else:
            self.source = list_fragments(uri, prefix, endpoint_url)
        if self.source.deltas:  # a collected log: start from its checkpoint (_checkpoint)
            self._compacted = Compacted(self.source.deltas)
            self._say(f"collected log: starting from its checkpoint and "
                      f"{len(self.source.deltas) - 1} stripe(s), records from offset "
                      f"{self.source.begin}")
        self._say(f"manifest lists {len(self.source.fragments)} fragments "
                  f"(records up to offset {self.source.next_offset})")

    def _say(self, text: str) -> None:
        if self._progress is not None:
            self._progress(text)

    # -- reading ------------------------------------------------------------------------

    @cached_property
    def _fragments(self) -> DataFrame:
        """One row per fragment to read, spread over a few partitions per core. Built in
        the JVM (a driver-side Arrow table, repartitioned): a Python RDD would take Python
        workers of its own, which re-read every zip archive on their path before each
        task (``_worker_imports``), ~40% of a core in a small log's replays (measured)."""
        assert isinstance(self.source, LogSource)
        names = list(self.source.fragments)
        slices = max(1, min(len(names), self.spark.sparkContext.defaultParallelism * 4))
        return table_frame(self.spark, FRAGMENTS, {"fragment": names}).repartition(slices)

    @cached_property
    def _metadata(self) -> tuple[EpochTable, BaselineTable]:
        """Pass 1: the epoch records (checked for tiling and gaps on the driver) and the
        baselines' chunk headers (checked for setsums, order and tiling)."""
        s = self.source
        if isinstance(s, KafkaTopic):
            with executor_errors():
                markers, chunks = kafka_metadata(self.spark, s)
            self.topic_metadata = (markers, chunks)
            records, self._markers = vouched_epochs(
                markers, s.partitions,
                None if self._compacted is None else self._compacted.starts())
            self._shares = vouched_shares(markers, records)
            columns = EpochColumns.from_records(records)
            self._epoch_rows = self.spark.createDataFrame(record_rows(records))
        else:
            columns, chunks = self._read_epochs(s)
        c = self._compacted
        table = (build_epoch_table(columns) if c is None
                 else build_epoch_table(columns, c.starts(), c.retained()))
        baselines = build_baselines(
            chunks, {d: points.seqs for d, points in table.intervals.items()})
        self._say(f"{sum(map(len, table.epochs.values()))} epochs in "
                  f"{len(table.epochs)} domain(s), "
                  f"{sum(map(len, table.intervals.values()))} quiescence points"
                  + (f", {len(baselines.accepted())} baseline chunk(s)" if baselines else ""))
        return table, baselines

    def _read_epochs(self, s: LogSource) -> tuple[EpochColumns, list[ChunkHeader]]:
        """Pass 1 over a wal3 log: its epoch records stay in Spark as rows (cached for
        ``_expected``); the driver collects, as Arrow columns, what it checks: ids,
        offsets and a 64-bit fingerprint of each record (two copies of one epoch must
        agree; a hash collision between two different copies is the only way past)."""
        rows = self._persist(self._fragments.mapInArrow(
            metadata_rows(s.uri, s.prefix, s.endpoint_url), spark_schema(METADATA_ROWS)))
        self._epoch_rows = rows.filter(F.col("domain").isNotNull())

        def describe(domain_id: int, epoch_seq: int) -> str:
            copies = rows.filter((F.col("domain") == F.lit(signed_bits(domain_id)))
                                 & (F.col("epoch") == F.lit(epoch_seq)))
            found = dict.fromkeys(rows_to_records(copies.toArrow().sort_by("offset")))
            return " and ".join(map(str, found))

        lean = rows.select("offset", "chunk", "problem", "domain", "epoch", "begin_id",
                           "end_id", "quiescent", F.xxhash64(*EPOCH_FIELDS).alias(
                               "fingerprint"))
        with executor_errors():
            table = lean.toArrow()
        columns, chunks = read_metadata(table, describe)
        self.quiescent_offsets = columns.quiescent_offsets()
        return columns, chunks

    @property
    def epochs(self) -> EpochTable:
        """The epoch records, checked for tiling and gaps on the driver (pass 1)."""
        return self._metadata[0]

    @property
    def baselines(self) -> BaselineTable:
        """The baselines' chunks (SNAPSHOT records) the replay applies (pass 1)."""
        return self._metadata[1]

    @cached_property
    def _rows(self) -> DataFrame:
        """Pass 2: every event and segment, placed in its epoch and interval (cached)."""
        s = self.source
        index = self.epochs.index(self.baselines.accepted())
        if isinstance(s, KafkaTopic):
            c = self._compacted
            events, with_segments = kafka_rows(
                self.spark, s, index, self._markers,
                None if c is None else {d: p.epoch_seq for d, p in c.starts().items()})
            return self._persist(with_segments(self._persist(events)))
        rows = self._fragments.mapInArrow(
            event_rows(s.uri, s.prefix, s.endpoint_url, index), spark_schema(EVENT_ROWS))
        return self._persist(rows)

    def _persist(self, frame: DataFrame) -> DataFrame:
        # DataFrame.cache()'s level. PySpark's MEMORY_AND_DISK is serialized: a block
        # spilled to disk is read back into memory in one allocation of its size, which
        # ran a 4M-event replay out of a 1g JVM heap (measured; the deserialized level
        # unrolls a block gradually, or reads it from disk).
        frame = frame.persist(StorageLevel.MEMORY_AND_DISK_DESER)
        self._persisted.append(frame)
        return frame

    def unpersist(self) -> None:
        for frame in self._persisted:
            frame.unpersist()
        self._persisted.clear()

    # -- events ---------------------------------------------------------------------------

    def events(self) -> DataFrame:
        """Every event once (duplicates dropped by identity), with metadata columns.

        ``_domain``; ``_batch_id`` (decimal(20,0): ids pass 2**63 in 2038); ``_seq``;
        ``_epoch`` (null in the log's unverified tail); ``_op`` (``c`` create: old is
        ABSENT, ``d`` delete: new is ABSENT, ``u`` update); ``table``, ``row`` (tagged
        key), ``column``, ``old``, ``new`` (tagged values, ``sinks.codec``); ``_offset``.
        """
        e = self._rows.filter(F.col("kind") == KIND_EVENT).dropDuplicates(_IDENTITY)
        op = (F.when(F.col("old") == absent(), F.lit("c"))
              .when(F.col("new") == absent(), F.lit("d")).otherwise(F.lit("u")))
        return e.select(
            F.col("domain").alias("_domain"), as_unsigned(F.col("batch")).alias("_batch_id"),
            F.col("seq").alias("_seq"), F.col("epoch").alias("_epoch"), op.alias("_op"),
            *CELL, "old", "new", F.col("offset").alias("_offset"))

    # -- verification -----------------------------------------------------------------------

    @cached_property
    def _expected(self) -> DataFrame:
        """Each epoch of a complete interval, as its record states it."""
        index = self.epochs.index()  # pass 1 first: it makes the rows
        rows = self._epoch_rows
        assert rows is not None
        if self.epochs.copies:  # identical copies (checked in pass 1): keep one
            rows = rows.dropDuplicates(["domain", "epoch"])
        placed = rows.mapInArrow(place_epochs(index), spark_schema(PLACED_EPOCHS))
        # Per-table counts are checked where the record has them (as the assembler
        # does); sorted, to compare with Spark's sorted array.
        tables = F.when((F.size("tables") > 0) & (F.col("events") != 0),
                        F.array_sort("tables"))
        return placed.select(
            "domain", "epoch", "q", as_unsigned(F.col("begin_id")).alias("begin_id"),
            as_unsigned(F.col("end_id")).alias("end_id"), "quiescent",
            F.col("events").alias("expected_events"), tables.alias("expected_tables"),
            F.lower(F.hex("setsum")).alias("setsum"), *(f"e{i}" for i in range(8)))

    @cached_property
    def _complete(self) -> DataFrame:
        """Events of complete intervals (duplicates included: the cell walk drops them)."""
        return self._rows.filter((F.col("kind") == KIND_EVENT) & F.col("q").isNotNull())

    @cached_property
    def _segments(self) -> DataFrame:
        s = self._rows.filter((F.col("kind") == KIND_SEGMENT) & F.col("q").isNotNull())
        return self._persist(s.groupBy(*_IDENTITY).agg(
            F.first("epoch").alias("epoch"), F.first("q").alias("q"),
            F.min("digest").alias("digest"), F.max("digest").alias("other"),
            *(F.first(c).alias(c) for c in _LANES)))

    @cached_property
    def report(self) -> DataFrame:
        """One row per epoch of a complete interval: what its record says, what the log
        holds (events, per table, setsum), and whether they agree."""
        per_table = self._walked.filter(F.col("kind") == KIND_COUNT).groupBy(
            "domain", "epoch", "table").agg(F.sum("events").alias("events"))
        found = per_table.groupBy("domain", "epoch").agg(
            F.sum("events").alias("events"),
            F.array_sort(F.collect_list(F.struct("table", "events"))).alias("tables"))
        sums = self._segments.groupBy("domain", "epoch").agg(
            *(F.sum(c).alias(c) for c in _LANES))
        report = (self._expected.join(found, ["domain", "epoch"], "left")
                  .join(sums, ["domain", "epoch"], "left")
                  .fillna(0, ["events", *_LANES]))
        # one parsed expression, not 40 column calls through py4j (a small log's replay
        # is mostly such calls)
        setsum_ok = F.expr(" AND ".join(f"pmod(l{i}, {prime}) = e{i}"
                                        for i, prime in enumerate(SETSUM_PRIMES)))
        tables_ok = F.col("expected_tables").isNull() | F.coalesce(
            F.col("expected_tables") == F.col("tables"), F.lit(False))
        return self._persist(report.select(
            F.col("domain").alias("_domain"), F.col("epoch").alias("_epoch"),
            F.col("q").alias("_interval"), "begin_id", "end_id", "quiescent",
            "expected_events", "events", "expected_tables", "tables", "setsum",
            (F.col("events") == F.col("expected_events")).alias("count_ok"),
            tables_ok.alias("tables_ok"), setsum_ok.alias("setsum_ok")))

    @cached_property
    def _resets(self) -> DataFrame | None:
        """Per (cell, chunk point): the value a baseline chunk sets (ABSENT where the
        chunk covers the cell's row without listing it); ``fq``: the point of the cell's
        chunk in its domain's first baseline (its events up to there are forgiven a
        broken chain: the store held values before the agent). None: no baselines."""
        state = None if self._compacted is None else self._compacted.resets(
            self.spark, self._complete.select("domain", *CELL).distinct())
        if not self.baselines:
            return state
        listed = (self._rows.filter(F.col("kind") == KIND_BASELINE)
                  .select("domain", F.col("q"), *CELL, F.col("new").alias("reset")))
        cells = (self._complete.select("domain", *CELL)
                 .unionByName(self._rows.filter(F.col("kind") == KIND_BASELINE)
                              .select("domain", *CELL)).distinct())
        rows = cells.select("domain", "table", "row").distinct()
        covers = rows.mapInArrow(covering_chunks(self.baselines), spark_schema(COVERS))
        implied = cells.join(covers, ["domain", "table", "row"]).select(
            "domain", F.col("cq").alias("q"), *CELL, absent().alias("reset"))
        resets = listed.unionByName(implied).groupBy("domain", "q", *CELL).agg(
            F.max("reset").alias("reset"))  # a listed value beats the implied ABSENT
        first = (covers.filter("first").join(cells, ["domain", "table", "row"])
                 .select("domain", *CELL, F.col("cq").alias("fq")))
        resets = resets.join(first, ["domain", *CELL], "left")
        return resets if state is None else resets.unionByName(state)

    @cached_property
    def _walked(self) -> DataFrame:
        """Each cell's events (and baseline resets) in one shuffle by cell, sorted by
        interval, walked in the executors (``_cells.walk_cells``): per (cell, interval)
        the checked net, and the kept events per (domain, epoch, table)."""
        nothing = {"binary": F.lit(None).cast("binary"), "bigint": F.lit(None).cast("bigint")}
        rows = self._complete.select(
            F.lit(KIND_EVENT).alias("kind"), "domain", "q", "epoch", *CELL, "batch", "seq",
            "old", "new", nothing["binary"].alias("reset"), nothing["bigint"].alias("fq"))
        resets = self._resets
        if resets is not None:
            rows = rows.unionByName(resets.select(
                F.lit(KIND_RESET).alias("kind"), "domain", "q",
                nothing["bigint"].alias("epoch"), *CELL, nothing["bigint"].alias("batch"),
                nothing["bigint"].alias("seq"), nothing["binary"].alias("old"),
                nothing["binary"].alias("new"), "reset", "fq"))
        ordered = rows.repartition(*CELL).sortWithinPartitions(
            *CELL, "q", "domain", "batch", "seq")  # resets (null batch) first
        return self._persist(ordered.mapInArrow(walk_cells, spark_schema(CELL_ROWS)))

    @cached_property
    def _cells(self) -> DataFrame:
        """Per (cell, interval): the Z-set's net (+new, -old) of its events, checked
        against the value held, then the baseline chunk placed at that point (if any)
        replacing the value. The net must be nothing or exactly +final -initial, with
        ``initial`` the value held (the last final before; ABSENT at the start); a net
        of nothing must have replaced the value held; a cell belongs to one domain.
        ``why`` names what failed; ``forgiven``: at or before the cell's chunk of its
        domain's first baseline."""
        return self._walked.filter(F.col("kind") == KIND_CELL).select(
            "domain", "q", "epoch", *CELL, "changed", "before", "after", "why", "forgiven")

    @cached_property
    def _share_failures(self) -> DataFrame:
        """A topic's partition shares of verified epochs that differ from their marker."""
        qs = {}
        for domain_id, index in self.epochs.index().domains.items():
            qs.update({(domain_id, int(e)): int(q) for e, q in zip(
                index.seqs.tolist(), index.q.tolist(), strict=True)})
        shares = [p for p in self._shares
                  if qs.get((p.domain_id, p.epoch_seq), -1) >= 0 and p.stream is not None]
        expected = table_frame(self.spark, SHARES, share_columns(
            shares, lambda d, e: qs[(d, e)]))
        return share_failures(self._rows.filter(F.col("kind") == KIND_EVENT), expected)

    @cached_property
    def _failures(self) -> dict[int, list[_Failure]]:
        """The first failure of each domain (by interval) that a baseline forgives and
        the first that it does not, found in one Spark job."""
        r = self.report
        epoch_bad = r.filter(
            ~F.col("count_ok") | ~F.col("tables_ok") | ~F.col("setsum_ok")).select(
            F.col("_domain").alias("domain"), F.col("_epoch").alias("epoch"),
            F.col("_interval").alias("q"),
            F.when(~F.col("count_ok"), F.concat(
                F.lit("the log holds "), F.col("events").cast("string"),
                F.lit(" events of this epoch, its record says "),
                F.col("expected_events").cast("string")))
            .when(~F.col("tables_ok"), F.concat(
                F.lit("per-table counts "), F.col("tables").cast("string"),
                F.lit(" differ from the record's "),
                F.col("expected_tables").cast("string")))
            .otherwise(F.concat(F.lit("setsum of the epoch's events differs from its "
                                      "record's "), F.col("setsum"),
                                F.lit(" (an event was altered, lost or foreign)")))
            .alias("message"))
        segment_bad = self._segments.filter(F.col("digest") != F.col("other")).select(
            "domain", "epoch", "q", F.lit(
                "two different copies of one segment (batch, seq) were delivered: an "
                "event was altered").alias("message"))
        if isinstance(self.source, KafkaTopic):  # each partition's share, as Python does
            segment_bad = segment_bad.unionByName(self._share_failures)
        no_cell = [F.lit(None).cast("string").alias("table"),
                   F.lit(None).cast("binary").alias("row"),
                   F.lit(None).cast("string").alias("column")]
        cells = self._cells.filter(F.col("why").isNotNull()).select(
            "domain", "epoch", "q", *CELL, "forgiven",
            F.concat(F.lit("cell state cannot be rebuilt: "), F.col("why")).alias("message"))
        every = (segment_bad.select("*", F.lit(RANK_SEGMENT).alias("rank"))
                 .unionByName(epoch_bad.select("*", F.lit(RANK_EPOCH).alias("rank")))
                 .select("domain", "epoch", "q", "rank", *no_cell,
                         F.lit(False).alias("forgiven"), "message")
                 .unionByName(cells.select("domain", "epoch", "q", F.lit(RANK_CELL).alias(
                     "rank"), *CELL, "forgiven", "message")))
        first = first_failures(every)
        failures: dict[int, list[_Failure]] = {}
        with executor_errors():
            found = first.collect()
        for row in found:
            f = row["f"]
            domain_id = int(row["domain"]) % (1 << 64)
            cell = None
            if f["table"] is not None:
                cell = (f["table"], decode_key(bytes(f["row"])), f["column"])
            failures.setdefault(domain_id, []).append(_Failure(
                domain_id, int(f["epoch"]), int(f["q"]), cell, str(f["message"]),
                bool(row["forgiven"])))
        self._say(f"verified: {len(failures)} domain(s) with an inconsistency")
        return failures

    def check(self, at: Frontier | None = None, since: Frontier | None = None) -> None:
        """Raise ``InconsistentLog`` if any interval up to ``at`` (all: None) fails.

        A reader that starts a domain from nothing (``since`` does not name it, or names
        a point where its state is whole) cannot check events on cells the store held
        before the agent started: a broken chain on a cell before its row's chunk of the
        domain's first baseline is forgiven once that baseline is whole at ``at``.
        """
        for domain_id, found in sorted(self._failures.items()):
            limit = None if at is None else at.get(domain_id)
            if at is not None and limit is None:
                continue
            whole = self.whole_from(domain_id)
            start = None if since is None else since.get(domain_id)
            first = self.baselines.first(domain_id)
            fresh = start is None or (whole is not None and 0 <= whole <= start.epoch_seq) or (
                first is not None and start.epoch_seq < first.start)
            for failure in sorted(found, key=lambda f: f.q):
                if limit is not None and failure.q > limit.epoch_seq:
                    continue
                if failure.forgiven and fresh and whole is not None and whole >= 0 and (
                        limit is None or limit.epoch_seq >= whole):
                    continue
                raise failure.error()

    def whole_from(self, domain_id: int) -> int | None:
        """The first quiescence point from which the domain's states are the store's
        when replayed from nothing: its first baseline's last chunk (or the next point).
        None: the domain has no baseline (whole from its start, as an empty store);
        -1: its first baseline is not complete in this log."""
        points = self.epochs.intervals.get(domain_id)
        return self.baselines.whole_from(
            domain_id, np.zeros(0, dtype=np.int64) if points is None else points.seqs)

    def _check_whole(self, frontier: Frontier) -> None:
        """Refuse a point inside a domain's first baseline: its state there is partial."""
        for p in frontier:
            first = self.baselines.first(p.domain_id)
            whole = self.whole_from(p.domain_id)
            if first is None or whole is None or p.epoch_seq < first.start:
                continue
            if whole < 0:
                raise ValueError(
                    f"quiescence point {p.epoch_seq} of domain {p.domain_id:016x} comes after "
                    f"the start of baseline {first.baseline_id:#x} (epoch {first.start}), "
                    "whose last chunk is not in this log yet: the state there is partial; "
                    f"ask for a point before epoch {first.start} or wait for the baseline")
            if p.epoch_seq < whole:
                raise ValueError(
                    f"quiescence point {p.epoch_seq} of domain {p.domain_id:016x} is inside "
                    f"baseline {first.baseline_id:#x} (epochs {first.start}..{whole}): a "
                    f"replay from nothing has a partial state there; ask for epoch {whole} "
                    "or later (or one before the baseline)")

    def verify(self) -> DataFrame:
        """Check the whole log; return the per-epoch report (raise ``InconsistentLog``)."""
        self.check()
        return self.report

    # -- results -----------------------------------------------------------------------------

    def frontier(self, at: str | Position | Frontier | None = None, *,
                 fill: bool = True) -> Frontier:
        """``at`` as a frontier of quiescence points of this log (default: the last ones).

        A domain that ``at`` does not name stays at its last quiescence point (``fill``;
        otherwise it is left out).
        """
        last = ({p.domain_id: p for p in self.epochs.last_positions()}
                if fill or at is None else {})
        wanted = _frontier(at)
        for p in wanted or ():
            if p.domain_id not in self.epochs.epochs:
                raise ValueError(f"position {p} names domain {p.domain_id:016x}, which this "
                                 f"log does not hold")
            if self._compacted is not None:
                self._compacted.check_point(p)
            last[p.domain_id] = self.epochs.position(p.domain_id, p.epoch_seq)
        return Frontier.of(last.values())

    def settle(self, end: Frontier) -> Frontier:
        """The furthest frontier up to ``end`` a stream can apply now.

        A domain inside a baseline that is not whole yet stops before it; a domain whose
        cell check breaks where no baseline of it is whole yet waits before that
        interval, as the Python assembler holds it, for at most ``HOLD_LIMIT_EPOCHS``
        epochs (then, and for a count or setsum failure, ``InconsistentLog``). A domain
        with no point to apply is left out.
        """
        from replay._baseline import HOLD_LIMIT_EPOCHS

        for p in end:  # the source saw its points: a log without them lost them
            if p.domain_id not in self.epochs.epochs:
                raise InconsistentLog(
                    f"quiescence point {p} was seen in the log, but its domain's epochs are "
                    "no longer there (removed by retention, or the log was replaced)",
                    domain_id=p.domain_id, epoch_seq=p.epoch_seq)
        out = []
        for p in self.frontier(end, fill=False):
            d = p.domain_id
            points = self.epochs.intervals[d]
            limit: int | None = p.epoch_seq
            first, whole = self.baselines.first(d), self.whole_from(d)
            if first is not None and whole is not None and (
                    whole < 0 or p.epoch_seq < whole) and p.epoch_seq >= first.start:
                limit = points.last_before(first.start)
            for failure in sorted(self._failures.get(d, []), key=lambda f: f.q):
                if limit is None or failure.q > limit:
                    break
                if failure.forgiven and whole is not None and 0 <= whole <= limit:
                    continue
                behind = self.epochs.epochs[d].last_seq() - failure.epoch_seq
                if failure.cell is None or behind > HOLD_LIMIT_EPOCHS:
                    raise failure.error()
                limit = points.last_before(failure.q)
            if limit is not None:
                out.append(self.epochs.position(d, limit))
        return Frontier.of(out)

    def _limits(self, frontier: Frontier, column: str = "q") -> Column:
        cond = F.lit(False)
        for p in frontier:
            cond = cond | ((F.col("domain") == F.lit(signed_bits(p.domain_id)))
                           & (F.col(column) <= F.lit(p.epoch_seq)))
        return cond

    def snapshot(self, at: str | Position | Frontier | None = None) -> DataFrame:
        """The cells at the quiescence points ``at`` (default: each domain's last).

        Columns: ``_domain``, ``_epoch`` (the quiescence point that last changed the
        cell), ``table``, ``row`` (tagged key), ``column``, ``value`` (tagged bytes).
        """
        frontier = self.frontier(at)
        self._check_whole(frontier)
        self.check(frontier)
        return self._state_at(frontier)

    def _state_at(self, frontier: Frontier) -> DataFrame:
        """The cells at ``frontier`` (its domains only), unchecked: callers check."""
        changed = self._cells.filter(F.col("changed") & self._limits(frontier))
        last = changed.groupBy("domain", *CELL).agg(
            F.max_by(F.struct("q", "after"), F.col("q")).alias("last"))
        return last.filter(F.col("last.after") != absent()).select(
            F.col("domain").alias("_domain"), F.col("last.q").alias("_epoch"), *CELL,
            F.col("last.after").alias("value"))

    def _points(self) -> DataFrame:
        cols: dict[str, list[object]] = {f.name: [] for f in _POINTS}
        for domain_id, points in self.epochs.intervals.items():
            for point in points:
                cols["domain"].append(signed_bits(domain_id))
                cols["q"].append(point.epoch_seq)
                cols["_position"].append(str(point))
                cols["_end_id"].append(point.end_id)
        return table_frame(self.spark, _POINTS, cols)

    def changesets(self, start: str | Position | Frontier | None = None,
                   end: str | Position | Frontier | None = None, *,
                   style: ChangeStyle = "before_after", exact: bool = False) -> DataFrame:
        """Net per-cell changes of each quiescent interval after ``start`` up to ``end``.

        One row per changed cell and interval, in the style of Delta Lake's change data
        feed: ``_position`` (the token once the interval is applied), ``_domain``,
        ``_epoch`` (its quiescence point), ``table``, ``row``, ``column``, then

        - ``style="before_after"`` (default): ``before``, ``after`` (tagged bytes;
          ABSENT is ``b""``) and ``_change_type`` ``insert``, ``update`` or ``delete``;
        - ``style="delta"``: ``value`` and ``_change_type`` as Delta Lake's change data
          feed has them: ``insert`` (the new value), ``delete`` (the value deleted), and
          an update as two rows, ``update_preimage`` (the old value) and
          ``update_postimage`` (the new one).

        A domain with a baseline replayed from nothing (``start`` does not name it)
        starts at the point its first baseline is whole (``whole_from``): its first
        changeset is that state, as inserts; the partial states before are not given.
        From a ``start`` before the baseline, the intervals up to that point become one
        changeset there. ``exact``: domains ``end`` does not name give no rows.
        """
        if style not in ("before_after", "delta"):
            raise ValueError(f"style {style!r}: use 'before_after' or 'delta'")
        until = self.frontier(end, fill=not exact)
        since = _frontier(start)
        if since is not None and self._compacted is not None:
            self.frontier(since, fill=False)  # refuse a point compacted away
        self._check_whole(until)
        if since is not None:
            self._check_whole(Frontier.of(
                [p for p in since if self.baselines.first(p.domain_id) is not None]))
        self.check(until, since)
        rows = self._cells.filter(F.col("changed") & self._limits(until)).select(
            "domain", "q", *CELL, "before", "after")
        for p in since or ():
            rows = rows.filter((F.col("domain") != F.lit(signed_bits(p.domain_id)))
                               | (F.col("q") > F.lit(p.epoch_seq)))
        for domain_id in self.baselines.baselines:
            whole = self.whole_from(domain_id)
            first = self.baselines.first(domain_id)
            limit = until.get(domain_id)
            begin = None if since is None else since.get(domain_id)
            if (whole is None or whole < 0 or first is None or limit is None
                    or limit.epoch_seq < whole
                    or (begin is not None and begin.epoch_seq >= first.start)):
                continue
            # From nothing, or from a point before the baseline: the partial intervals
            # up to the point the baseline is whole become one changeset there, from the
            # state held (none, or the state at `begin`) to the baseline's whole state.
            d = F.lit(signed_bits(domain_id))
            cell = ["domain", *CELL]
            to = self._state_at(Frontier.of([self.epochs.position(domain_id, whole)]))
            to = to.select(F.col("_domain").alias("domain"), *CELL,
                           F.col("value").alias("after"))
            if begin is None:
                held = to.select(*cell, absent().alias("before")).limit(0)
            else:
                held = self._state_at(Frontier.of([begin])).select(
                    F.col("_domain").alias("domain"), *CELL, F.col("value").alias("before"))
            diff = (held.join(to, cell, "full_outer")
                    .select(*cell, F.coalesce("before", absent()).alias("before"),
                            F.coalesce("after", absent()).alias("after"))
                    .filter(F.col("before") != F.col("after")))
            rows = rows.filter((F.col("domain") != d) | (F.col("q") > F.lit(whole)))
            rows = rows.unionByName(diff.select(
                "domain", F.lit(whole).cast("bigint").alias("q"), *CELL, "before", "after"))
        out = rows.join(F.broadcast(self._points()), ["domain", "q"]).select(
            "_position", F.col("domain").alias("_domain"), F.col("q").alias("_epoch"),
            *CELL, "before", "after")
        if style == "delta":
            return _delta_style(out)
        kind = (F.when(F.col("before") == absent(), F.lit("insert"))
                .when(F.col("after") == absent(), F.lit("delete"))
                .otherwise(F.lit("update")))
        return out.withColumn("_change_type", kind)


def _delta_style(rows: DataFrame) -> DataFrame:
    """before/after rows as Delta Lake's change data feed has them (one row per image)."""
    images = F.explode(F.array(
        F.struct(F.col("before").alias("value"),
                 F.when(F.col("after") == absent(), F.lit("delete"))
                 .otherwise(F.lit("update_preimage")).alias("_change_type")),
        F.struct(F.col("after").alias("value"),
                 F.when(F.col("before") == absent(), F.lit("insert"))
                 .otherwise(F.lit("update_postimage")).alias("_change_type"))))
    keep = ["_position", "_domain", "_epoch", *CELL]
    return (rows.select(*keep, images.alias("i"))
            .filter(F.col("i.value") != absent())  # an insert has no preimage, a delete
            .select(*keep, "i.value", "i._change_type"))  # no postimage

