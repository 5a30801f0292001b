"""A collected or compacted wal3 log in Spark: start from its checkpoint and stripes.

``cdc-agent log gc`` / ``log compact`` (``docs/state.md``) replace the records below
the newest retained point by a checkpoint (every cell at the oldest retained point) and
stripes (the net change of each cell between two retained points). ``_source`` loads
them on the driver through ``sinks.wal3`` (each object checked against its SHA-256 name
and index entry, the state setsum carried from the checkpoint through every stripe)
and reads the log's records only from the newest retained point on, plus the records
the last object carries (intervals still open there).

Spark replays the objects as it replays a baseline chunk: each row is a *reset* of its
cell at the retained point's quiescence point of the domain that owns the cell; the
cell's later events chain from it. So the states at every retained point and after the
newest one are the Python reader's (``read_log`` + ``Assembler``), bit for bit. A row
names its domain where the stripe does (version 2, or the one domain a version-1
stripe moved); a checkpoint's cell goes to the domain whose events later write it,
else to the last domain of the checkpoint's frontier (as the Python checkpoint
changeset hands every cell out with that domain).

A quiescence point the objects replaced and that is not a retained point is refused
with a ``ValueError`` naming the nearest retained points: no reader gets a state the
log can no longer prove.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Final

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from replay._position import Frontier, Position
from replay.spark._decode import signed_bits
from replay.spark._epochs import UnsupportedRecord
from replay.spark._frames import CELL, table_frame
from sinks.wal3 import StateDelta, split_key

__all__ = ["Compacted", "Resumed"]

_ROWS: Final = pa.schema([
    pa.field("k", pa.int64()), pa.field("row_domain", pa.int64()),
    pa.field("fallback", pa.int64()), pa.field("table", pa.string()),
    pa.field("row", pa.binary()), pa.field("column", pa.string()),
    pa.field("reset", pa.binary()),
])
_POINTS: Final = pa.schema([
    pa.field("k", pa.int64()), pa.field("domain", pa.int64()), pa.field("q", pa.int64()),
])



def _frontier(token: str) -> dict[int, Position]:
    return {p.domain_id: p for p in Frontier.parse(token)} if token else {}


@dataclass(frozen=True)
class Compacted:
    """The checkpoint and stripes of a collected log, as Spark replays them."""

    deltas: tuple[StateDelta, ...]
    frontiers: tuple[dict[int, Position], ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "frontiers", tuple(_frontier(d.after) for d in self.deltas))
        for delta in self.deltas:
            tracks = json.loads(delta.baseline)["tracks"] if delta.baseline else []
            if delta.carry or tracks:
                raise UnsupportedRecord(
                    f"the {delta.kind} ending at offset {delta.hi} stands inside a baseline "
                    "snapshot still being applied there: replay.spark cannot start from such "
                    "a retained point yet; read the log with replay.read_log (Python), or "
                    "move the cursors past the baseline's last chunk and compact again")

    @property
    def begin(self) -> int:
        """The newest retained point: the log's records are read from here."""
        return self.deltas[-1].hi

    def starts(self) -> dict[int, Position]:
        """Where each domain's epochs resume after the newest retained point."""
        return self.frontiers[-1]

    def retained(self) -> dict[int, list[Position]]:
        """Each domain's quiescence points the objects stand for, in order (they are
        never verified, only named by positions)."""
        out: dict[int, list[Position]] = {}
        for frontier in self.frontiers:
            for d, p in frontier.items():
                points = out.setdefault(d, [])
                if not points or points[-1].epoch_seq != p.epoch_seq:
                    points.append(Position(d, p.epoch_seq, p.end_id))
        return out

    def check_point(self, p: Position) -> None:
        """Refuse a quiescence point the objects replaced that is not a retained one."""
        retained = [r.epoch_seq for r in self.retained().get(p.domain_id, [])]
        if not retained or p.epoch_seq > retained[-1] or p.epoch_seq in retained:
            return
        d = p.domain_id
        below = [s for s in retained if s < p.epoch_seq]
        above = [s for s in retained if s > p.epoch_seq]
        tokens = {r.epoch_seq: str(Position(d, r.epoch_seq, r.end_id))
                  for r in self.retained()[d]}
        near = []
        if below:
            near.append(f"the nearest retained point before it is {tokens[below[-1]]}")
        else:
            near.append(f"it is before the oldest retained point, {tokens[above[0]]} (the "
                        "log was collected below it)")
        if below and above:
            near.append(f"the nearest after it is {tokens[above[0]]}")
        raise ValueError(
            f"quiescence point {p.epoch_seq} of domain {d:016x} was compacted or collected "
            f"and is not a retained point of this log: {'; '.join(near)}; ask for a retained "
            f"point ({', '.join(tokens.values())}) or one after the last of them")

    def resets(self, spark: SparkSession, owners: DataFrame) -> DataFrame:
        """Every object's cells as resets: ``domain``, ``q``, cell, ``reset`` (tagged
        value, ABSENT for a cell a stripe removed), ``fq`` (null: nothing forgiven).

        ``owners``: (``domain``, cell) of the events that write each cell after."""
        rows: dict[str, list[object]] = {f.name: [] for f in _ROWS}
        points: dict[str, list[object]] = {f.name: [] for f in _POINTS}
        previous: dict[int, Position] = {}
        for k, (delta, after) in enumerate(zip(self.deltas, self.frontiers, strict=True)):
            for d, p in after.items():
                points["k"].append(k)
                points["domain"].append(signed_bits(d))
                points["q"].append(p.epoch_seq)
            moved = [d for d, p in after.items() if previous.get(d) != p]
            single = moved[0] if delta.kind == "stripe" and len(moved) == 1 else None
            fallback = signed_bits(max(after)) if after else 0
            for i, (key, value) in enumerate(zip(delta.keys, delta.values, strict=True)):
                table, row, column = split_key(key)
                domain = delta.domains[i] if delta.domains else single
                for name, item in (("k", k), ("row_domain", None if domain is None
                                              else signed_bits(domain)),
                                   ("fallback", fallback), ("table", table), ("row", row),
                                   ("column", column), ("reset", value)):
                    rows[name].append(item)
            previous = after
        cells = table_frame(spark, _ROWS, rows)
        owner = (owners.select("domain", *CELL)
                 .unionByName(cells.filter(F.col("row_domain").isNotNull())
                              .select(F.col("row_domain").alias("domain"), *CELL))
                 .groupBy(*CELL).agg(F.min("domain").alias("owner")))
        placed = cells.join(owner, list(CELL), "left").select(
            "k", F.coalesce("row_domain", "owner", "fallback").alias("domain"), *CELL, "reset")
        return placed.join(F.broadcast(table_frame(spark, _POINTS, points)),
                           ["k", "domain"]).select(
            "domain", "q", *CELL, "reset", F.lit(None).cast("bigint").alias("fq"))


@dataclass(frozen=True)
class Resumed:
    """A stream's micro-batch resumed where its previous one saved (``_stream``): the
    cells at ``frontier`` (a Parquet table at ``cells``: ``_domain``, cell, ``value``)
    and the log's records from offset ``begin`` on (every record of an interval after
    the frontier is there; earlier events there are late copies, not placed)."""

    frontier: dict[int, Position]
    begin: int
    cells: str

    def starts(self) -> dict[int, Position]:
        return self.frontier

    def retained(self) -> dict[int, list[Position]]:
        return {d: [Position(d, p.epoch_seq, p.end_id)]
                for d, p in self.frontier.items()}

    def check_point(self, p: Position) -> None:
        start = self.frontier.get(p.domain_id)
        if start is not None and p.epoch_seq < start.epoch_seq:
            raise ValueError(
                f"quiescence point {p.epoch_seq} of domain {p.domain_id:016x} comes before "
                f"{start}, where this replay resumed: open the log without resuming")

    def resets(self, spark: SparkSession, owners: DataFrame) -> DataFrame:
        points: dict[str, list[object]] = {"k": [], "domain": [], "q": []}
        for d, p in self.frontier.items():
            for name, value in (("k", 0), ("domain", signed_bits(d)), ("q", p.epoch_seq)):
                points[name].append(value)
        cells = spark.read.parquet(self.cells).select(
            F.col("_domain").alias("domain"), *CELL, F.col("value").alias("reset"))
        return cells.join(F.broadcast(table_frame(spark, _POINTS, points)), "domain").select(
            "domain", "q", *CELL, "reset", F.lit(None).cast("bigint").alias("fq"))
