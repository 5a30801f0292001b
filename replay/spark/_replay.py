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

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Final

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from replay._errors import InconsistentLog
from replay._position import Frontier, Position
from replay.spark._decode import (
    EVENT_ROWS,
    FRAGMENTS,
    KIND_EVENT,
    KIND_SEGMENT,
    METADATA_ROWS,
    event_rows,
    metadata_rows,
)
from replay.spark._epochs import EpochTable, build_epoch_table, decode_metadata
from replay.spark._errors import executor_errors
from replay.spark._frames import CELL, absent, as_unsigned, spark_schema, table_frame
from replay.spark._source import LogSource, list_fragments
from sinks import SETSUM_PRIMES
from sinks.codec import decode_key

__all__ = ["LogReplay", "Progress"]

_LANES: Final = [f"l{i}" for i in range(8)]
_IDENTITY: Final = ["domain", "batch", "seq"]

Progress = Callable[[str], None] | None

_EXPECTED: Final = pa.schema([
    pa.field("domain", pa.int64()), pa.field("epoch", pa.int64()), pa.field("q", pa.int64()),
    pa.field("begin_id", pa.decimal128(20, 0)), pa.field("end_id", pa.decimal128(20, 0)),
    pa.field("quiescent", pa.bool_()), pa.field("expected_events", pa.int64()),
    pa.field("expected_tables", pa.list_(pa.struct([
        pa.field("table", pa.string()), pa.field("events", pa.int64())]))),
    pa.field("setsum", pa.string()), *[pa.field(f"e{i}", pa.int64()) for i in range(8)],
])
_POINTS: Final = pa.schema([
    pa.field("domain", pa.int64()), pa.field("q", pa.int64()),
    pa.field("_position", pa.string()), pa.field("_end_id", pa.decimal128(20, 0)),
])


def _signed(value: int) -> int:
    """The int64 bit view of a uint64 (how ids travel in Spark columns)."""
    return value - (1 << 64) if value >= 1 << 63 else value


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

    def error(self) -> InconsistentLog:
        return InconsistentLog(self.message, domain_id=self.domain_id,
                               epoch_seq=self.epoch_seq, cell=self.cell)


class LogReplay:
    """A wal3 log opened for Spark: events, verification, snapshots and changesets.

    Reading happens on first use and is cached in the session (``unpersist()`` frees
    it). The module functions ``events``, ``verify``, ``snapshot`` and ``changesets``
    open one of these; open it yourself to ask several questions of one log.
    """

    def __init__(self, spark: SparkSession, uri: str, *, prefix: str = "",
                 endpoint_url: str | None = None, progress: Progress = None) -> None:
        self.spark = spark
        self.uri = uri
        self._progress = progress
        self.source: LogSource = list_fragments(uri, prefix, endpoint_url)
        self._say(f"manifest lists {len(self.source.fragments)} fragments "
                  f"(records up to offset {self.source.next_offset})")
        self._persisted: list[DataFrame] = []

    def _say(self, text: str) -> None:
        if self._progress is not None:
            self._progress(text)

    # -- reading ------------------------------------------------------------------------

    @cached_property
    def _fragments(self) -> DataFrame:
        names = list(self.source.fragments)
        slices = max(1, min(len(names), self.spark.sparkContext.defaultParallelism * 4))
        rdd = self.spark.sparkContext.parallelize([(n,) for n in names], slices)
        return self.spark.createDataFrame(rdd, spark_schema(FRAGMENTS))

    @cached_property
    def epochs(self) -> EpochTable:
        """Pass 1: the epoch records, checked for tiling and gaps on the driver."""
        s = self.source
        with executor_errors():
            rows = self._fragments.mapInArrow(
                metadata_rows(s.uri, s.prefix, s.endpoint_url), spark_schema(METADATA_ROWS)
            ).collect()
        table = build_epoch_table(decode_metadata(
            sorted((int(r["offset"]), bytes(r["body"])) for r in rows)))
        self._say(f"{sum(map(len, table.epochs.values()))} epochs in "
                  f"{len(table.epochs)} domain(s), "
                  f"{sum(map(len, table.intervals.values()))} quiescence points")
        return table

    @cached_property
    def _rows(self) -> DataFrame:
        """Pass 2: every event and segment, placed in its epoch and interval (cached)."""
        s = self.source
        index = self.epochs.index()
        rows = self._fragments.mapInArrow(
            event_rows(s.uri, s.prefix, s.endpoint_url, index), spark_schema(EVENT_ROWS))
        return self._persist(rows)

    def _persist(self, frame: DataFrame) -> DataFrame:
        frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
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
        cols: dict[str, list[object]] = {f.name: [] for f in _EXPECTED}
        index = self.epochs.index()
        for domain_id, epochs in self.epochs.epochs.items():
            qs = index.domains[domain_id].q.tolist()
            for record, q in zip(epochs, qs, strict=True):
                if q < 0:
                    continue  # the tail: not verified until its quiescence point comes
                lanes = _lanes(record.setsum)
                # Per-table counts are checked where the record has them (as the
                # assembler does); sorted, to compare with Spark's sorted array.
                tables = ([{"table": t, "events": n} for t, n in sorted(record.table_counts)]
                          if record.table_counts and record.event_count else None)
                for name, value in (("domain", _signed(domain_id)), ("epoch", record.epoch_seq),
                                    ("q", q), ("begin_id", record.begin_id),
                                    ("end_id", record.end_id), ("quiescent", record.quiescent),
                                    ("expected_events", record.event_count),
                                    ("expected_tables", tables), ("setsum", record.setsum),
                                    *((f"e{i}", lanes[i]) for i in range(8))):
                    cols[name].append(value)
        return table_frame(self.spark, _EXPECTED, cols)

    @cached_property
    def _deduped(self) -> DataFrame:
        """Events of complete intervals, once each, clustered by cell."""
        e = self._rows.filter((F.col("kind") == KIND_EVENT) & F.col("q").isNotNull())
        return e.repartition(*CELL).dropDuplicates([*CELL, *_IDENTITY])

    @cached_property
    def _segments(self) -> DataFrame:
        s = self._rows.filter((F.col("kind") == KIND_SEGMENT) & F.col("q").isNotNull())
        return s.groupBy(*_IDENTITY).agg(
            F.first("epoch").alias("epoch"), F.first("q").alias("q"),
            F.min("digest").alias("digest"), F.max("digest").alias("other"),
            *(F.first(c).alias(c) for c in _LANES))

    @cached_property
    def report(self) -> DataFrame:
        """One row per epoch of a complete interval: what its record says, what the log
        holds (events, per table, setsum), and whether they agree."""
        per_table = self._deduped.groupBy("domain", "epoch", "table").agg(
            F.count("*").alias("events"))
        found = per_table.groupBy("domain", "epoch").agg(
            F.sum("events").alias("events"),
            F.array_sort(F.collect_list(F.struct("table", "events"))).alias("tables"))
        sums = self._segments.groupBy("domain", "epoch").agg(
            *(F.sum(c).alias(c) for c in _LANES))
        report = (self._expected.join(found, ["domain", "epoch"], "left")
                  .join(sums, ["domain", "epoch"], "left")
                  .fillna(0, ["events", *_LANES]))
        setsum_ok = F.lit(True)
        for i, prime in enumerate(SETSUM_PRIMES):
            setsum_ok = setsum_ok & (F.pmod(F.col(f"l{i}"), F.lit(prime)) == F.col(f"e{i}"))
        tables_ok = F.col("expected_tables").isNull() | F.coalesce(
            F.col("expected_tables") == F.col("tables"), F.lit(False))
        return self._persist(report.select(
            F.col("domain").alias("_domain"), F.col("epoch").alias("_epoch"),
            F.col("q").alias("_interval"), "begin_id", "end_id", "quiescent",
            "expected_events", "events", "expected_tables", "tables", "setsum",
            (F.col("events") == F.col("expected_events")).alias("count_ok"),
            tables_ok.alias("tables_ok"), setsum_ok.alias("setsum_ok")))

    @cached_property
    def _cells(self) -> DataFrame:
        """Per (cell, interval): the Z-set's net, checked against the value held."""
        d = self._deduped
        z = d.select("domain", "q", "epoch", *CELL, F.explode(F.array(
            F.struct(F.col("new").alias("v"), F.lit(1).alias("w")),
            F.struct(F.col("old").alias("v"), F.lit(-1).alias("w")))).alias("z"))
        per_value = z.groupBy("domain", "q", *CELL, F.col("z.v").alias("v")).agg(
            F.sum("z.w").alias("net"),
            F.sum(F.when(F.col("z.w") < 0, 1).otherwise(0)).alias("olds"),
            F.min("epoch").alias("epoch"))
        group = per_value.groupBy("domain", "q", *CELL).agg(
            F.count(F.when(F.col("net") != 0, 1)).alias("nz"),
            F.sum(F.abs("net")).alias("absn"),
            F.max(F.when(F.col("net") > 0, F.col("v"))).alias("after"),
            F.max(F.when(F.col("net") < 0, F.col("v"))).alias("initial"),
            F.collect_list(F.when(F.col("olds") > 0, F.col("v"))).alias("replaced"),
            F.min("epoch").alias("epoch"))
        cell = Window.partitionBy(*CELL)
        before = cell.orderBy("q").rowsBetween(Window.unboundedPreceding, -1)
        held = F.coalesce(F.last("after", ignorenulls=True).over(before), absent())
        changed = (F.col("nz") == 2) & (F.col("absn") == 2)
        why = (F.when((F.col("nz") != 0) & ~changed,
                      F.lit("its events do not chain from the value held to one final value "
                            "(an event is missing or altered)"))
               .when(changed & (F.col("initial") != F.col("held")),
                     F.lit("its first event did not replace the value the cell held"))
               .when((F.col("nz") == 0) & ~F.array_contains("replaced", F.col("held")),
                     F.lit("its events never replaced the value held"))
               .when(F.min("domain").over(cell) != F.max("domain").over(cell),
                     F.lit("the cell is written by two domains; replay.spark needs each "
                           "cell owned by one domain")))
        checked = (group.withColumn("held", held)
                   .withColumn("changed", changed).withColumn("why", why)
                   .select("domain", "q", "epoch", *CELL, "changed",
                           F.col("held").alias("before"), "after", "why"))
        return self._persist(checked)

    @cached_property
    def _failures(self) -> dict[int, _Failure]:
        """The first failure of each domain (by interval), found in one Spark job."""
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
        no_cell = [F.lit(None).cast("string").alias("table"),
                   F.lit(None).cast("binary").alias("row"),
                   F.lit(None).cast("string").alias("column")]
        cells = self._cells.filter(F.col("why").isNotNull()).select(
            "domain", "epoch", "q", *CELL,
            F.concat(F.lit("cell state cannot be rebuilt: "), F.col("why")).alias("message"))
        every = (epoch_bad.unionByName(segment_bad)
                 .select("domain", "epoch", "q", *no_cell, "message")
                 .unionByName(cells.select("domain", "epoch", "q", *CELL, "message")))
        first = every.groupBy("domain").agg(F.min_by(
            F.struct("epoch", "q", *CELL, "message"), F.struct("q", "epoch")).alias("f"))
        failures = {}
        with executor_errors():
            found = first.collect()
        for row in found:
            f = row["f"]
            domain_id = int(row["domain"]) % (1 << 64)
            cell = None
            if f["table"] is not None:
                cell = (f["table"], decode_key(bytes(f["row"])), f["column"])
            failures[domain_id] = _Failure(domain_id, int(f["epoch"]), int(f["q"]), cell,
                                           str(f["message"]))
        self._say(f"verified: {len(failures)} domain(s) with an inconsistency")
        return failures

    def check(self, at: Frontier | None = None) -> None:
        """Raise ``InconsistentLog`` if any interval up to ``at`` (all: None) fails."""
        for domain_id, failure in sorted(self._failures.items()):
            limit = None if at is None else at.get(domain_id)
            if at is not None and limit is None:
                continue
            if limit is None or failure.q <= limit.epoch_seq:
                raise failure.error()

    def verify(self) -> DataFrame:
        """Check the whole log; return the per-epoch report (raise ``InconsistentLog``)."""
        self.check()
        return self.report

    # -- results -----------------------------------------------------------------------------

    def frontier(self, at: str | Position | Frontier | None = None) -> Frontier:
        """``at`` as a frontier of quiescence points of this log (default: the last ones).

        A domain that ``at`` does not name stays at its last quiescence point.
        """
        last = {p.domain_id: p for p in self.epochs.last_positions()}
        wanted = _frontier(at)
        for p in wanted or ():
            if p.domain_id not in self.epochs.epochs:
                raise ValueError(f"position {p} names domain {p.domain_id:016x}, which this "
                                 f"log does not hold")
            last[p.domain_id] = self.epochs.position(p.domain_id, p.epoch_seq)
        return Frontier.of(last.values())

    def _limits(self, frontier: Frontier, column: str = "q") -> Column:
        cond = F.lit(False)
        for p in frontier:
            cond = cond | ((F.col("domain") == F.lit(_signed(p.domain_id)))
                           & (F.col(column) <= F.lit(p.epoch_seq)))
        return cond

    def snapshot(self, at: str | Position | Frontier | None = None) -> DataFrame:
        """The cells at the quiescence points ``at`` (default: each domain's last).

        Columns: ``_domain``, ``_epoch`` (the quiescence point that last changed the
        cell), ``table``, ``row`` (tagged key), ``column``, ``value`` (tagged bytes).
        """
        frontier = self.frontier(at)
        self.check(frontier)
        changed = self._cells.filter(F.col("changed") & self._limits(frontier))
        last = changed.groupBy("domain", *CELL).agg(
            F.max_by(F.struct("q", "after"), F.col("q")).alias("last"))
        return last.filter(F.col("last.after") != absent()).select(
            F.col("domain").alias("_domain"), F.col("last.q").alias("_epoch"), *CELL,
            F.col("last.after").alias("value"))

    def _points(self) -> DataFrame:
        cols: dict[str, list[object]] = {f.name: [] for f in _POINTS}
        for domain_id, points in self.epochs.intervals.items():
            for record in points:
                cols["domain"].append(_signed(domain_id))
                cols["q"].append(record.epoch_seq)
                cols["_position"].append(str(Position(domain_id, record.epoch_seq,
                                                      record.end_id)))
                cols["_end_id"].append(record.end_id)
        return table_frame(self.spark, _POINTS, cols)

    def changesets(self, start: str | Position | Frontier | None = None,
                   end: str | Position | Frontier | None = None) -> DataFrame:
        """Net per-cell changes of each quiescent interval after ``start`` up to ``end``.

        One row per changed cell and interval, in the style of Delta Lake's change data
        feed: ``_position`` (the token once the interval is applied), ``_domain``,
        ``_epoch`` (its quiescence point), ``table``, ``row``, ``column``, ``before``,
        ``after`` (tagged bytes; ABSENT is ``b""``), ``_change_type`` (``insert``,
        ``update`` or ``delete``).
        """
        until = self.frontier(end)
        self.check(until)
        rows = self._cells.filter(F.col("changed") & self._limits(until))
        since = _frontier(start)
        for p in since or ():
            rows = rows.filter((F.col("domain") != F.lit(_signed(p.domain_id)))
                               | (F.col("q") > F.lit(p.epoch_seq)))
        kind = (F.when(F.col("before") == absent(), F.lit("insert"))
                .when(F.col("after") == absent(), F.lit("delete"))
                .otherwise(F.lit("update")))
        return rows.join(F.broadcast(self._points()), ["domain", "q"]).select(
            "_position", F.col("domain").alias("_domain"), F.col("q").alias("_epoch"),
            *CELL, "before", "after", kind.alias("_change_type"))


def _lanes(hexdigest: str) -> list[int]:
    import struct

    return list(struct.unpack("<8I", bytes.fromhex(hexdigest)))

