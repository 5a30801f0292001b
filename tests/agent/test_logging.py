"""Library events go through ``logging``, never stdout; the entry points render them as
JSON lines off a terminal (issue 11.5)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from agent._logging import configure_logging, say

ROOT = Path(__file__).parents[2]

EMBEDDING = """
import sys
{setup}
from agent import Agent, MemoryStore
from sinks.wal3 import open_log_sink

agent = Agent(MemoryStore(), open_log_sink(sys.argv[1]))
with agent.batch():
    agent.set("t", 1, "c", "v")
    print("application line 1")
agent.close()
print("application line 2")
"""


def embed(tmp_path: Path, setup: str = "") -> subprocess.CompletedProcess[str]:
    script = tmp_path / "app.py"
    script.write_text(EMBEDDING.format(setup=setup))
    return subprocess.run([sys.executable, str(script), (tmp_path / "log").as_uri()],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_an_embedding_programs_stdout_holds_only_its_own_output(tmp_path: Path) -> None:
    """The README example used to interleave `[info] cdc.agent_started` with the
    application's lines; now stdout is the application's alone."""
    run = embed(tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "application line 1\napplication line 2\n"
    assert "cdc.agent_started" not in run.stderr  # info: not shown unless asked for


def test_applications_route_library_events_with_logging(tmp_path: Path) -> None:
    """With the application's own logging set-up, the events arrive as records of the
    module's logger, with the event's fields on the record."""
    setup = """
import logging
class Show(logging.Handler):
    def emit(self, record):
        sys.stderr.write(f"{record.name}|{record.getMessage()}|{record.cdc_event['event']}\\n")
logging.getLogger("agent").addHandler(Show())
logging.getLogger("agent").setLevel(logging.INFO)
"""
    run = embed(tmp_path, setup)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "application line 1\napplication line 2\n"
    started = [line for line in run.stderr.splitlines() if "cdc.agent_started" in line]
    assert started and started[0].startswith("agent._agent|cdc.agent_started domain_id=")
    assert started[0].endswith("|cdc.agent_started")


def test_an_application_that_configures_structlog_keeps_its_configuration(
        tmp_path: Path) -> None:
    """The library points structlog at logging only if the application did not
    configure structlog first."""
    setup = """
import structlog
structlog.configure(processors=[lambda _l, _m, e: "MINE " + e["event"]],
                    logger_factory=structlog.PrintLoggerFactory(sys.stderr))
"""
    run = embed(tmp_path, setup)
    assert run.returncode == 0, run.stderr
    assert "MINE cdc.agent_started" in run.stderr


@pytest.fixture
def restore_logging() -> Iterator[None]:
    saved, root = structlog.get_config(), logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.configure(**saved)
    root.handlers[:], root.level = handlers, level


def test_entry_points_write_json_lines_off_a_terminal(
        restore_logging: None, capsys: pytest.CaptureFixture[str]) -> None:
    """Each event is one JSON object with event, level, timestamp and logger; URLs lose
    their credentials; info is shown only for the command line's own logger."""
    configure_logging(json_lines=True)
    structlog.get_logger("sinks.wal3._writer").warning(
        "wal3.slow", log="s3://AKIA:hunter2@bucket/x", attempts=3)
    structlog.get_logger("agent._agent").info("cdc.hidden")
    say("cdc.sidecar_ready", "listening")
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = [json.loads(line) for line in captured.err.splitlines()]
    assert [line["event"] for line in lines] == ["wal3.slow", "cdc.sidecar_ready"]
    assert lines[0]["level"] == "warning" and lines[0]["attempts"] == 3
    assert lines[0]["log"] == "s3://***@bucket/x" and "hunter2" not in captured.err
    assert lines[0]["logger"] == "sinks.wal3._writer" and lines[0]["timestamp"].endswith("Z")
    assert lines[1]["message"] == "listening"


def test_entry_points_write_readable_lines_on_a_terminal(
        restore_logging: None, capsys: pytest.CaptureFixture[str]) -> None:
    """On a terminal: one key=value line per event, not JSON; verbose shows info."""
    configure_logging(verbose=True, json_lines=False)
    try:
        raise OSError("disk on fire")
    except OSError:
        structlog.get_logger("agent._shipper").exception("cdc.shipping_failed", batch=7)
    structlog.get_logger("agent._agent").info("cdc.agent_started", domain_id="ab")
    err = capsys.readouterr().err
    assert "cdc.shipping_failed" in err and "batch=7" in err and "disk on fire" in err
    assert "cdc.agent_started" in err and "domain_id=ab" in err
    assert not err.lstrip().startswith("{")
