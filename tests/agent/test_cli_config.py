"""``demo`` and ``sidecar`` share their sink settings (issue 11.4): flags, keys, checks;
the demo refuses a log that is not empty; the sidecar warns when nothing lasts."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent._cli_sink import not_durable_reason, sink_config
from agent._config import load_config
from agent.cli import build_parser, main

ROOT = Path(__file__).parents[2]


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    import logging

    import structlog

    saved, root = structlog.get_config(), logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.configure(**saved)
    root.handlers[:], root.level = handlers, level


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env={**os.environ, **(env or {})})


def sink_options(command: str) -> dict[str, str | None]:
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
    return {a.dest: a.help for a in sub._actions if a.dest in ("config", "log", "endpoint_url")}


def test_demo_and_sidecar_take_the_same_sink_flags() -> None:
    """One definition of --config, --log and --endpoint-url for both commands."""
    assert sink_options("demo") == sink_options("sidecar")
    assert set(sink_options("demo")) == {"config", "log", "endpoint_url"}


@pytest.mark.parametrize("command", ["demo", "sidecar"])
def test_both_commands_reject_an_unknown_sink_key_the_same_way(
        command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`demo --config` used to ignore [sink] keys that `sidecar --config` rejected."""
    config = tmp_path / "c.toml"
    config.write_text(f"[sink]\nkind = 'wal3'\nuri = '{tmp_path / 'log'}'\ncolour = 'blue'\n")
    extra = ["--socket", str(tmp_path / "s")] if command == "sidecar" else ["--batches", "5"]
    assert main([command, "--config", str(config), *extra]) == 2
    err = capsys.readouterr().err
    assert f"{config}: [sink] colour is not an option of [sink] kind = 'wal3'" in err
    assert not (tmp_path / "log").exists()


def test_flags_override_environment_override_file(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """--log replaces the configured sink; a variable replaces the file's key."""
    config = tmp_path / "c.toml"
    config.write_text("[agent]\nmax_queue = 4\n[sink]\nkind = 'wal3'\nuri = 'from-file'\n")
    args = build_parser().parse_args(["demo", "--config", str(config)])
    assert sink_config(args, "demo").sink["uri"] == (tmp_path / "from-file").as_uri()
    monkeypatch.setenv("CDC_AGENT_SINK__URI", str(tmp_path / "from-env"))
    monkeypatch.setenv("CDC_AGENT_AGENT__MAX_QUEUE", "9")
    loaded = sink_config(args, "demo")
    assert loaded.sink["uri"] == (tmp_path / "from-env").as_uri()
    assert loaded.agent == {"max_queue": 9}
    args = build_parser().parse_args(["demo", "--config", str(config), "--log",
                                      str(tmp_path / "from-flag")])
    assert sink_config(args, "demo").sink == {"kind": "wal3",
                                              "uri": (tmp_path / "from-flag").as_uri()}
    monkeypatch.setenv("CDC_AGENT_SINK__KIND", "wal3")
    args = build_parser().parse_args(["sidecar", "--socket", "s", "--log", "memory://"])
    assert sink_config(args, "sidecar").sink == {"kind": "memory"}


def test_demo_twice_on_one_log_refuses_and_the_log_still_verifies(tmp_path: Path) -> None:
    """The second run says, in one line, that the log is not empty and what to do; the
    first run's log is untouched and verifies (it used to be corrupted for good)."""
    log = tmp_path / "log"
    first = cli("demo", "--threads", "2", "--batches", "40", "--log", str(log))
    assert first.returncode == 0, first.stderr
    second = cli("demo", "--threads", "2", "--batches", "40", "--log", f"file://{log}")
    assert second.returncode == 2
    assert second.stderr.count("\n") == 1 and "Traceback" not in second.stderr
    assert "already holds a log" in second.stderr and "new location" in second.stderr
    verify = cli("log", "verify", str(log))
    assert verify.returncode == 0, verify.stderr


def test_not_durable_reasons(tmp_path: Path) -> None:
    """Memory and temporary folders are named; a lasting folder is not."""
    def reason(text: str) -> str | None:
        config = load_config(None, environ={})
        config.sink = ({"kind": "memory"} if text == "memory" else
                       {"kind": "wal3", "uri": text})
        return not_durable_reason(config)

    assert "in memory" in (reason("memory") or "")
    assert "in memory" in (reason("memory://x") or "")
    assert "temporary folder" in (reason("file:///tmp/cdc-log") or "")
    assert "temporary folder" in (reason("file:///var/tmp/x") or "")
    assert reason("file:///var/lib/cdc-agent/log") is None
    assert reason("file:///tmpfoo/log") is None
    assert reason("s3://bucket/log") is None


@pytest.mark.parametrize("log", ["memory://", None])
def test_sidecar_warns_loudly_and_prints_only_json(tmp_path: Path, log: str | None) -> None:
    """In memory or a temporary folder (the default), a warning follows the banner; with
    stderr not a terminal, every line the sidecar prints is a JSON object."""
    socket_path = tmp_path / "s.sock"
    argv = [sys.executable, "-m", "agent.cli", "sidecar", "--socket", str(socket_path)]
    argv += ["--log", log] if log else []
    with subprocess.Popen(argv, cwd=ROOT, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stderr is not None and proc.stdout is not None
        first = proc.stderr.readline()
        proc.send_signal(signal.SIGTERM)  # the warning comes with the banner, before this
        rest = proc.stderr.read()
        out = proc.stdout.read()
        assert proc.wait(30) == 0
    lines = [json.loads(line) for line in [first, *rest.splitlines()]]
    banner, warning = lines[0], lines[1]
    assert banner["event"] == "cdc.sidecar_ready" and "listening on" in banner["message"]
    assert warning["event"] == "cdc.sidecar_log_not_durable"
    assert warning["level"] == "warning" and "WARNING" in warning["message"]
    assert all(line["event"] for line in lines)
    assert out == ""


def test_the_sidecar_is_quiet_about_a_lasting_log(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """No warning when the log is somewhere that lasts (the check is by folder)."""
    monkeypatch.setattr("agent._cli_sink._TEMPORARY_ROOTS", ())
    monkeypatch.setattr("tempfile.gettempdir", lambda: "/nonexistent-temp")
    config = load_config(None, environ={})
    config.sink = {"kind": "wal3", "uri": (tmp_path / "log").as_uri()}
    assert not_durable_reason(config) is None


def test_examples_never_run_the_demo_on_a_lasting_log() -> None:
    """Every `cdc-agent demo --config F` shown in config/, the README and docs/ names a
    file whose sink is in memory (the demo needs an empty log of its own)."""
    texts = [p.read_text() for p in [*(ROOT / "config").glob("*.toml"), ROOT / "README.md",
                                     *(ROOT / "docs").glob("*.md")]]
    shown = {m for text in texts for m in re.findall(r"cdc-agent demo --config (\S+)", text)}
    assert shown, "the examples should show the demo with a configuration file"
    for name in shown:
        config = load_config(ROOT / name, environ={})
        assert config.sink["kind"] == "memory", name
