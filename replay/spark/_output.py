"""Writing a consistent table out (Parquet, Delta Lake), idempotently by position.

Each written row carries the quiescence point it belongs to (``_domain``, ``_epoch``),
so the table itself says how far it got; a rerun or a resumed job starts after that
and never applies an interval twice.

- ``write_changesets`` appends the changesets after what the table holds. Delta Lake:
  one atomic commit per run. Parquet: one ``run=<n>`` folder per run, written by Spark's
  committer (``_SUCCESS`` last); a folder without ``_SUCCESS`` (a run that crashed) is
  removed before the next run reads how far the table got.
- ``write_state`` replaces the table by the state at a frontier, with that frontier in
  the column ``_frontier``; the same frontier again writes nothing. Delta Lake replaces
  atomically; Parquet overwrites (readers may see the swap: use Delta for that).
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from replay._position import Frontier, Position
from replay.spark._replay import ChangeStyle, LogReplay
from replay.spark._source import LogSource

__all__ = ["Format", "applied_frontier", "write_changesets", "write_state"]

Format = Literal["delta", "parquet"]
_SUCCESS: Final = "_SUCCESS"


def _fs(spark: SparkSession, path: str) -> tuple[Any, Any]:
    jvm: Any = spark.sparkContext._jvm  # Hadoop's FileSystem has no Python API
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    return hadoop_path.getFileSystem(conf), hadoop_path


def _exists(spark: SparkSession, path: str) -> bool:
    fs, p = _fs(spark, path)
    return bool(fs.exists(p))


def _check_format(format: str) -> None:
    if format not in ("delta", "parquet"):
        raise ValueError(f"format {format!r}: write Delta Lake ('delta') or Parquet ('parquet')")


def _drop_incomplete_runs(spark: SparkSession, path: str) -> int:
    """Remove ``run=<n>`` folders of a Parquet table that lack ``_SUCCESS``; the count."""
    fs, root = _fs(spark, path)
    if not fs.exists(root):
        return 0
    dropped = 0
    for status in fs.listStatus(root):
        child = status.getPath()
        if (status.isDirectory() and child.getName().startswith("run=")
                and not fs.exists(child.suffix("/" + _SUCCESS))):
            fs.delete(child, True)
            dropped += 1
    return dropped


def _read(spark: SparkSession, path: str, format: Format) -> DataFrame | None:
    if format == "delta":
        if not _exists(spark, path.rstrip("/") + "/_delta_log"):
            return None
        return spark.read.format("delta").load(path)
    _drop_incomplete_runs(spark, path)
    fs, root = _fs(spark, path)
    if not fs.exists(root) or not any(
            s.getPath().getName().startswith("run=") for s in fs.listStatus(root)):
        return None
    return spark.read.parquet(path)


def applied_frontier(spark: SparkSession, path: str, format: Format = "delta",
                     replay: LogReplay | None = None) -> Frontier:
    """How far the changeset table at ``path`` got: each domain's last written point."""
    _check_format(format)
    table = _read(spark, path, format)
    if table is None:
        return Frontier({})
    rows = table.groupBy("_domain").agg(F.max("_epoch").alias("q")).collect()
    positions = []
    for row in rows:
        domain_id, q = int(row["_domain"]) % (1 << 64), int(row["q"])
        if replay is None:
            positions.append(Position(domain_id, q, 0))
            continue
        try:
            positions.append(replay.epochs.position(domain_id, q))
        except ValueError:
            if not isinstance(replay.source, LogSource) or not replay.source.deltas:
                raise
            raise ValueError(
                f"the changeset table at {path} ends at epoch {q} of domain "
                f"{domain_id:016x}, a point `cdc-agent log gc` compacted away: the log no "
                "longer holds what came after it. If you know the table is further on (the "
                "intervals after its last rows changed nothing), pass since= the frontier it "
                "is at; otherwise rebuild it from the log's checkpoint") from None
    return Frontier.of(positions)


def write_changesets(replay: LogReplay, path: str, *, format: Format = "delta",
                     end: str | Position | Frontier | None = None,
                     style: ChangeStyle = "before_after", exact: bool = False,
                     since: Frontier | None = None) -> int:
    """Append the changesets after what the table at ``path`` holds, up to ``end``
    (``style``, ``exact``: see ``LogReplay.changesets``; keep one style per table).
    ``since``: where the table is, when the caller knows it better than the table's
    last rows say (a stream resumed at the frontier its last micro-batch wrote up to).

    Returns the number of rows written (0 when the table is already there).
    """
    _check_format(format)
    spark = replay.spark
    # Step 1. Where the table is: its last quiescence point per domain.
    start = since if since is not None else applied_frontier(spark, path, format, replay)
    # Step 2. What comes after (verified; raises InconsistentLog before writing).
    rows = replay.changesets(start if len(start.positions) else None, end, style=style,
                              exact=exact)
    count = rows.count()
    if not count:
        return 0
    # Step 3. One atomic commit (Delta) or one run folder, _SUCCESS last (Parquet).
    if format == "delta":
        rows.write.format("delta").mode("append").save(path)
    else:
        fs, root = _fs(spark, path)
        runs = [s.getPath().getName() for s in fs.listStatus(root)] if fs.exists(root) else []
        n = 1 + max((int(r.split("=", 1)[1]) for r in runs if r.startswith("run=")),
                    default=0)
        rows.write.mode("overwrite").parquet(f"{path.rstrip('/')}/run={n:08d}")
    return count


def write_state(replay: LogReplay, path: str, *, format: Format = "delta",
                at: str | Position | Frontier | None = None) -> bool:
    """Replace the table at ``path`` by the state at ``at`` (default: the last points).

    Returns False when the table already holds that state (nothing written).
    """
    _check_format(format)
    spark = replay.spark
    frontier = str(replay.frontier(at))
    if format == "delta":
        exists = _exists(spark, path.rstrip("/") + "/_delta_log")
    else:
        exists = _exists(spark, path.rstrip("/") + "/" + _SUCCESS)
    if exists:
        held = spark.read.format(format).load(path).select("_frontier").limit(1).collect()
        if held and held[0][0] == frontier:
            return False
    state = replay.snapshot(frontier).withColumn("_frontier", F.lit(frontier))
    state.write.format(format).mode("overwrite").option("overwriteSchema", "true").save(path)
    return True
