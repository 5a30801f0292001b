"""Spark settings for a session that runs replays: each saves time or log noise and
changes no result. ``cdc-agent spark`` starts its session with them (a ``--conf``
wins); a session of your own takes them with
``SparkSession.builder.config(map=SESSION_SETTINGS)`` (docs/spark.md, "Session
settings")."""

from __future__ import annotations

from types import MappingProxyType
from typing import Final

__all__ = ["SESSION_SETTINGS"]

SESSION_SETTINGS: Final = MappingProxyType({
    # PySpark 4 records the Python call site of every column expression for the
    # "DataFrame context" of SQL errors: about seven JVM round trips per expression, and
    # a replay builds hundreds (measured: a small log's warm snapshot 1.25 s -> 1.05 s).
    # The call sites it records are this package's lines, not the user's. Read once per
    # process, at the first column expression: it must be set when the session starts.
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    # A replay caches what its passes share, and AQE leaves a cached plan's shuffles at
    # spark.sql.shuffle.partitions (200 by default: 200 tasks per shuffle, however
    # small the log) unless it may change that plan's partitioning. Measured:
    # `cdc-agent spark verify` of the demo's log (16k events) 60.3 s -> 34.1 s.
    "spark.sql.optimizer.canChangeCachedPlanOutputPartitioning": "true",
    # A replay's plans have more columns than the 25 Spark prints of a plan before it
    # warns that it cut the text (a WARN line in every run).
    "spark.sql.debug.maxToStringFields": "1000",
})
