"""One SparkSession (local mode) for the whole test session.

PySpark comes from PyPI (extra ``cdc-agent[spark]``); the connector jars (Delta Lake,
the Kafka source) come from ``scripts/install-spark.sh`` into ``.cache/spark/jars`` (the
fixture runs that script if they are missing). Workers run this interpreter
(``PYSPARK_PYTHON``) and bind to loopback; the UI is off and shuffles use few
partitions, so the session starts in seconds and small jobs stay small.

Fixtures:

- ``spark`` (session): the running ``SparkSession``, with Delta Lake enabled.

The benchmark (``bench/spark_replay.py``) starts sessions with ``start_session``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

__all__ = ["COALESCE_CACHED", "JARS", "ensure_installed", "spark", "start_session"]

# Whether AQE may coalesce the shuffles of cached plans (replay.spark.SESSION_SETTINGS).
COALESCE_CACHED = "spark.sql.optimizer.canChangeCachedPlanOutputPartitioning"

ROOT = Path(__file__).resolve().parents[2]
JARS = ROOT / ".cache" / "spark" / "jars"
INSTALL = ROOT / "scripts" / "install-spark.sh"


def ensure_installed() -> list[Path]:
    """The connector jars, running the install script once if they are missing."""
    if not any(JARS.glob("delta-spark_*.jar")):
        subprocess.run(["bash", str(INSTALL)], check=True, stdin=subprocess.DEVNULL,
                       env={**os.environ, "CI": "true"}, timeout=900)
    return sorted(JARS.glob("*.jar"))


def start_session(master: str = "local[2]", *, shuffle_partitions: int = 4,
                  app: str = "cdc-agent-tests", **conf: Any) -> Any:
    """A local SparkSession with the connector jars, Delta Lake's catalog and the
    settings ``cdc-agent spark`` starts its own with (``replay.spark.SESSION_SETTINGS``;
    ``conf`` wins)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from replay.spark import SESSION_SETTINGS

    builder = (
        SparkSession.builder.master(master).appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.jars", ",".join(str(j) for j in ensure_installed()))
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog",
                "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.driver.extraJavaOptions", "-Dlog4j2.level=ERROR")
    )
    for key, value in {**SESSION_SETTINGS, **conf}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The test session's SparkSession (local[2]); stopped at the end of the session.

    Python workers inherit the environment the JVM started with, so the S3 server's fake
    credentials are set before it starts (tests never talk to real AWS).
    """
    from tests.services.s3 import FAKE_CREDENTIALS

    patch = pytest.MonkeyPatch()
    for name, value in FAKE_CREDENTIALS.items():
        patch.setenv(name, value)
    # Delta rebuilds a table's state in 50 partitions by default: 50 tasks for every
    # read of a test's few-file table; 2 (one per core) give the same state. Shuffles in
    # 2 partitions too: still more than one (a group split across partitions is caught),
    # and a replay of a test's small log runs ~30% faster than with 4 (fewer tasks).
    # The tests run hundreds of replays with the same plans: a larger code cache keeps
    # their generated classes compiled (100 by default, fewer than a few replays' worth;
    # measured: a small log's warm replay ~10% faster). Codegen itself stays on.
    # AQE may not coalesce the shuffles of what a replay caches (SESSION_SETTINGS lets
    # it): they keep their 2 partitions, so a cell split across partitions would show;
    # tests/spark/test_settings.py replays with coalescing on.
    session = start_session(shuffle_partitions=2,
                            **{"spark.databricks.delta.snapshotPartitions": "2",
                               "spark.sql.codegen.cache.maxEntries": "1000",
                               COALESCE_CACHED: "false"})
    try:
        yield session
    finally:
        session.stop()
        patch.undo()
