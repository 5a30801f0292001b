"""A wal3 log on S3 (the moto server), replayed in Spark: the executors fetch the
fragments the manifest lists through the project's S3 store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from replay.spark import LogReplay, to_state
from tests.helpers import bits
from tests.spark._logs import write_log

pytestmark = [
    pytest.mark.spark,
    pytest.mark.s3,
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


def test_log_on_s3_replays_like_the_python_assembler(spark: Any, s3_endpoint: str,
                                                     s3_bucket: str, tmp_path: Path) -> None:
    """Final state and every changeset equal the Python assembler's on the same S3 log."""
    uri = f"s3://{s3_bucket}/cdc"
    logged = write_log(tmp_path, domains=2, threads=2, batches=25, rows=20, seed=4, uri=uri,
                       endpoint_url=s3_endpoint)
    python = logged.python_snapshots(endpoint_url=s3_endpoint)
    replay = LogReplay(spark, uri, endpoint_url=s3_endpoint)
    assert bits(to_state(replay.snapshot())) == bits(python[-1].state) == logged.final
    assert replay.changesets().select("_domain", "_epoch").distinct().count() == len(
        [s for s in python if s.changeset.changes])
    replay.unpersist()
