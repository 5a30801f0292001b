"""Replay into Spark: the log as DataFrames, verified as the Python assembler verifies it.

Needs the extra ``cdc-agent[spark]`` (PySpark). May import ``replay``, ``sinks`` and
``sequencer``. Start with ``_replay.py`` (``LogReplay``: the checks as Spark aggregates),
then ``_decode.py`` (what runs in the executors) and ``_epochs.py`` (the driver's part).
``docs/spark.md`` has a worked example.
"""

from __future__ import annotations

try:
    import pyspark  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "replay.spark needs PySpark: install the extra with "
        "`python3 -m pip install 'cdc-agent[spark]'`") from exc

from typing import TYPE_CHECKING

from replay.spark._worker_imports import in_spark_worker, lazy_zip_invalidation

if in_spark_worker():  # executor-side code of this package runs there (mapInArrow)
    lazy_zip_invalidation()

from replay._position import Frontier, Position
from replay.spark._epochs import UnsupportedRecord
from replay.spark._output import applied_frontier, write_changesets, write_state
from replay.spark._replay import ChangeStyle, LogReplay
from replay.spark._settings import SESSION_SETTINGS
from replay.spark._state import to_state, wide
from replay.spark._stream import QuiescencePoints, stream_changesets

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "LogReplay",
    "QuiescencePoints",
    "SESSION_SETTINGS",
    "UnsupportedRecord",
    "applied_frontier",
    "changesets",
    "events",
    "snapshot",
    "stream_changesets",
    "to_state",
    "verify",
    "wide",
    "write_changesets",
    "write_state",
]

At = str | Position | Frontier | None


def events(spark: SparkSession, uri: str, **options: str) -> DataFrame:
    """Every event of the log at ``uri`` once, with metadata columns (``LogReplay.events``)."""
    return LogReplay(spark, uri, **options).events()  # type: ignore[arg-type]


def verify(spark: SparkSession, uri: str, **options: str) -> DataFrame:
    """Verify the whole log; return its per-epoch report or raise ``InconsistentLog``."""
    return LogReplay(spark, uri, **options).verify()  # type: ignore[arg-type]


def snapshot(spark: SparkSession, uri: str, at: At = None, **options: str) -> DataFrame:
    """The cells at the last quiescence point, or at the one position token ``at`` names."""
    return LogReplay(spark, uri, **options).snapshot(at)  # type: ignore[arg-type]


def changesets(spark: SparkSession, uri: str, start: At = None, end: At = None, *,
               style: ChangeStyle = "before_after", **options: str) -> DataFrame:
    """Net per-cell changes per quiescent interval after ``start`` up to ``end``
    (``style="delta"``: Delta Lake's update_preimage/update_postimage rows)."""
    return LogReplay(spark, uri, **options).changesets(  # type: ignore[arg-type]
        start, end, style=style)
