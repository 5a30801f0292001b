"""`cdc-agent spark ...` and the worked example of docs/spark.md, on the shared session."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from agent.cli import main
from replay.spark import SESSION_SETTINGS, to_state
from sinks.wal3 import LogReader, encode_fragment
from tests.helpers import bits
from tests.spark._logs import Logged

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]
DOC = Path(__file__).resolve().parents[2] / "docs" / "spark.md"


def test_cli_snapshot_changesets_verify(spark: Any, small: Logged, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """snapshot writes the verified state once; changesets append; verify reports."""
    out = str(tmp_path / "state")
    assert main(["spark", "snapshot", small.uri, "--out", out]) == 0
    assert "written to" in capsys.readouterr().err
    assert main(["spark", "snapshot", small.uri, "--out", out]) == 0
    assert "already in" in capsys.readouterr().err
    assert bits(to_state(spark.read.parquet(out))) == small.final
    changes = str(tmp_path / "changes")
    assert main(["spark", "changesets", small.uri, "--out", changes]) == 0
    assert "changed cells appended" in capsys.readouterr().err
    assert spark.read.parquet(changes).count() > 0
    assert main(["spark", "verify", small.uri]) == 0
    assert "consistent" in capsys.readouterr().err


def test_cli_refuses_a_corrupt_log(spark: Any, small: Logged, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A fragment altered on disk: exit status 2 and the fragment named on stderr."""
    copy = tmp_path / "log"
    shutil.copytree(small.path, copy)
    fragment = LogReader(f"file://{copy}").scan()[0]
    records = LogReader(f"file://{copy}").fetch(fragment)
    data, _ = encode_fragment(records[0].offset, records[0].timestamp_us,
                              [r.body + b"x" for r in records])
    (copy / fragment.path).write_bytes(data)
    assert main(["spark", "verify", f"file://{copy}"]) == 2
    assert fragment.path.split("/")[-1] in capsys.readouterr().err


def test_cli_changesets_in_delta_style(spark: Any, small: Logged, tmp_path: Path) -> None:
    out = str(tmp_path / "delta-style")
    assert main(["spark", "changesets", small.uri, "--out", out, "--style", "delta"]) == 0
    kinds = {r[0] for r in spark.read.parquet(out).select("_change_type").distinct().collect()}
    assert kinds == {"insert", "delete", "update_preimage", "update_postimage"}


@pytest.mark.kafka
def test_every_example_of_the_doc_runs(spark: Any, kafka_bootstrap: str,
                                       capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """All Python blocks of docs/spark.md, pasted one after the other into one session:
    the worked example prints the state, the baseline example prints the store's cells,
    the stream writes a table, the Kafka example reads the topic it wrote."""
    monkeypatch.setenv("KAFKA_BOOTSTRAP", kafka_bootstrap)
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) >= 5
    namespace: dict[str, Any] = {}
    # The worked example builds its session with SESSION_SETTINGS: getOrCreate() sets
    # them on this shared session, whose own values the later tests rely on.
    kept = {key: spark.conf.get(key) for key in SESSION_SETTINGS}
    try:
        for i, block in enumerate(blocks):
            exec(compile(block, str(DOC), "exec"), namespace)
            if i == 0:  # the worked example, as pasted alone, prints the state
                first = capsys.readouterr().out
                assert "('users', 1, 'name'): 'Ada'" in first
                assert "('users', 2, 'name'): 'Grace'" in first
                assert "'score'" not in first.split("{", 1)[1].split("}", 1)[0]
    finally:  # the stream example leaves its query running: it would poll all session
        for query in spark.streams.active:
            query.stop()
        for key, value in kept.items():  # (a static one cannot have changed)
            if spark.conf.get(key) != value:
                spark.conf.set(key, value)
    out = capsys.readouterr().out
    assert "('users', 1, 'name'): 'Ada L.'" in out
    assert "('users', 2, 'name'): 'G. Hopper'" in out
    assert spark.read.parquet(namespace["path"] + "-stream").count() > 0
    assert "('orders', 42, 'status'): 'paid'" in out and "('stock', 'sku-7', 'count'): 11" in out
    streamed = spark.read.parquet(namespace["out"]).collect()  # the topic's stream
    assert sorted(r["_change_type"] for r in streamed) == ["insert"] * 3
