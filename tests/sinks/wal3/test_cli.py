"""``cdc-agent log inspect|scrub|verify|gc`` on a real local-filesystem log."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from agent import Agent, MemoryStore
from agent._workload import Workload
from agent.cli import main
from sinks.wal3 import CursorStore, LogReader, open_log_sink


@pytest.fixture(autouse=True)
def _reset_logging() -> Iterator[None]:
    yield
    structlog.reset_defaults()


@pytest.fixture
def log_uri(tmp_path: Path) -> str:
    uri = f"file://{tmp_path / 'log'}"
    sink = open_log_sink(uri)
    agent = Agent(MemoryStore(), sink)
    for seed in range(3):  # flushed in between: several fragments
        Workload(threads=2, batches=15, seed=seed).run(agent)
        agent.flush()
    agent.close()
    return uri


def test_inspect_scrub_verify_on_a_sound_log(log_uri: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """All three succeed (exit 0) and report what they read."""
    assert main(["log", "inspect", log_uri, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["oldest_offset"] == 1 and info["next_offset"] > 1
    assert info["manifest_problems"] == [] and not info["sealed"]
    assert main(["log", "scrub", log_uri]) == 0
    captured = capsys.readouterr()
    assert "OK: every setsum balances" in captured.out and "scrubbing" in captured.err
    assert main(["log", "verify", log_uri]) == 0
    out = capsys.readouterr().out
    assert "changesets" in out and "OK: scrub clean" in out


def test_scrub_and_verify_fail_on_a_damaged_log(log_uri: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A fragment overwritten with another's bytes: exit status 1 and the problem named."""
    fragments = sorted((tmp_path / "log" / "log").rglob("*.parquet"))
    assert len(fragments) >= 2
    fragments[-1].write_bytes(fragments[0].read_bytes())
    assert main(["log", "scrub", log_uri]) == 1
    assert fragments[-1].name in capsys.readouterr().err
    assert main(["log", "verify", log_uri]) == 1


def test_gc_then_inspect(log_uri: str, capsys: pytest.CaptureFixture[str]) -> None:
    """gc collects below the cursor; inspect then shows the new oldest offset."""
    last = LogReader(log_uri).scan(1)[-1].start
    assert last > 1
    CursorStore(log_uri).init("consumer", last)
    assert main(["log", "gc", log_uri]) == 0
    assert "objects deleted" in capsys.readouterr().out
    assert main(["log", "inspect", log_uri, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["oldest_offset"] == last
    assert info["cursors"] == {"consumer": last}
    assert main(["log", "scrub", log_uri]) == 0


def test_missing_log_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A URI with no log behind it: exit status 2 and a message saying so."""
    assert main(["log", "inspect", f"file://{tmp_path / 'nothing'}"]) == 2
    assert "nothing does not exist" in capsys.readouterr().err
    (tmp_path / "afile").write_bytes(b"")
    assert main(["log", "verify", f"file://{tmp_path / 'afile'}"]) == 2
    assert "afile is not a directory" in capsys.readouterr().err
    for action in ("gc", "checkpoint", "compact"):  # the state commands say it alike
        assert main(["log", action, f"file://{tmp_path / 'nothing'}"]) == 2
        assert "nothing does not exist" in capsys.readouterr().err
    assert not (tmp_path / "nothing").exists()
    (tmp_path / "empty").mkdir()
    assert main(["log", "scrub", f"file://{tmp_path / 'empty'}"]) == 2
    assert "initialize the log first" in capsys.readouterr().err


@pytest.mark.parametrize("cursor", [
    b'{"position":{"offset":99999999999},"epoch_us":1,"writer":"w"}',
    b'{"position":{"offset":-1},"epoch_us":1,"writer":"w"}',
])
def test_gc_with_a_cursor_outside_the_log_fails_and_keeps_everything(
        log_uri: str, tmp_path: Path, cursor: bytes,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A cursor past the end or negative: one line naming it, exit 1, nothing deleted."""
    files = sorted(p for p in (tmp_path / "log").rglob("*") if p.is_file())
    (tmp_path / "log" / "cursor").mkdir(exist_ok=True)
    (tmp_path / "log" / "cursor" / "bad.json").write_bytes(cursor)
    assert main(["log", "gc", log_uri]) == 1
    err = capsys.readouterr().err
    assert "cursor" in err and "bad" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    (tmp_path / "log" / "cursor" / "bad.json").unlink()
    assert sorted(p for p in (tmp_path / "log").rglob("*") if p.is_file()) == files
    assert main(["log", "scrub", log_uri]) == 0


def test_gc_then_verify_starts_from_the_checkpoint(
        log_uri: str, capsys: pytest.CaptureFixture[str]) -> None:
    """gc writes a checkpoint at the cursor before it frees the fragments below it: verify
    then replays from that checkpoint (before checkpoints: "epoch 1 never arrived")."""
    fragments = LogReader(log_uri).scan(1)
    cursor = fragments[len(fragments) // 2].start + 1  # inside a fragment, mid-interval
    CursorStore(log_uri).init("consumer", cursor)
    assert main(["log", "gc", log_uri]) == 0
    out = capsys.readouterr().out
    assert f"checkpoint        offset {cursor}" in out and "objects deleted" in out
    assert LogReader(log_uri).manifest().oldest_offset > 1
    assert main(["log", "scrub", log_uri]) == 0
    assert "checkpoint        offset" in capsys.readouterr().out
    assert main(["log", "verify", log_uri]) == 0
    assert "OK: scrub clean" in capsys.readouterr().out


def test_checkpoint_and_compact_commands(log_uri: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """checkpoint writes one at --at; compact keeps a point per cursor; verify passes."""
    end = LogReader(log_uri).manifest().next_offset
    assert main(["log", "checkpoint", log_uri, "--at", str(end // 2)]) == 0
    assert f"retained points   [{end // 2}]" in capsys.readouterr().out
    for i, point in enumerate((end // 3, end // 2, end - 1)):
        CursorStore(log_uri).init(f"reader{i}", point)
    assert main(["log", "compact", log_uri]) == 0
    out = capsys.readouterr().out
    assert f"retained points   [{end // 3}, {end // 2}, {end - 1}]" in out
    assert main(["log", "inspect", log_uri, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["state"]["retained_points"] == [end // 3, end // 2, end - 1]
    assert info["oldest_offset"] <= end - 1
    assert main(["log", "verify", log_uri]) == 0
    assert main(["log", "checkpoint", log_uri, "--at", str(end + 5)]) == 1
    assert "outside" in capsys.readouterr().err
