"""The sidecar with client processes: several at once, one SIGKILLed mid-batch, and the
``cdc-agent sidecar`` command shut down by SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent import MemoryStore
from agent.sidecar import SidecarClient
from agent.sidecar._protocol import decode_value
from replay import Assembler
from tests.agent._sidecar import Served, short_dir
from tests.helpers import bits

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def folder() -> Iterator[Path]:
    with short_dir() as path:
        yield path


def _worker(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.agent._sidecar_worker", *args],
                            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)


def _state(line: str) -> dict[Any, bytes]:
    return bits({(t, r, c): decode_value(v) for t, r, c, v in json.loads(line)})


def _rows_of(state: dict[Any, bytes], name: str) -> dict[Any, bytes]:
    return {cell: v for cell, v in state.items() if str(cell[1]).startswith(f"{name}-")}


def test_client_processes_each_find_their_writes_in_the_log(folder: Path) -> None:
    """Three client processes (two threads each) write their own rows through one
    sidecar; the log replays consistently and holds each process's final state."""
    served = Served(folder / "s")
    workers = {name: _worker("write", str(folder / "s"), name, "150", str(seed))
               for seed, name in enumerate(["p0", "p1", "p2"])}
    states = {}
    for name, proc in workers.items():
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        states[name] = _state(out)
    served.stop()
    snapshots = served.replay()  # raises InconsistentLog if the log is not consistent
    final = bits(snapshots[-1].state)
    for name, state in states.items():
        assert state, f"worker {name} wrote nothing"
        assert _rows_of(final, name) == state
    assert len(final) == sum(len(s) for s in states.values())
    batches = {e.batch_id for e in served.sink.events}
    assert len(batches) > 300  # the workers' batches all reached the log


def test_a_client_killed_mid_batch_leaves_a_consistent_log(folder: Path) -> None:
    """SIGKILL a client holding an open batch: the sidecar closes it, its reported
    events replay, and other clients keep capturing."""
    served = Served(folder / "s")
    victim = _worker("hang", str(folder / "s"), "v")
    assert victim.stdout is not None
    reported = _state(victim.stdout.readline())
    served.quiesced.clear()
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(30)
    assert victim.stdin is not None and victim.stdout is not None
    victim.stdin.close()
    victim.stdout.close()
    assert served.quiesced.wait(30), "the killed client's batch was never closed"
    with SidecarClient(str(folder / "s"), MemoryStore()) as client:
        client.set("t", "after-0", "a", "still capturing")
    served.stop()
    [snap, later] = served.replay()
    assert bits(snap.state) == reported
    assert _rows_of(bits(later.state), "after") == bits({("t", "after-0", "a"):
                                                          "still capturing"})


def test_cli_serves_and_shuts_down_on_sigterm(folder: Path) -> None:
    """`cdc-agent sidecar` serves clients into a wal3 log; SIGTERM stops it with exit 0,
    the socket file removed, and the log replays to the store's state."""
    from sinks.wal3 import read_log

    socket_path, log_uri = folder / "s", f"file://{folder}/log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.cli", "sidecar", "--socket", str(socket_path),
         "--log", log_uri], cwd=ROOT, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        text=True)
    try:
        assert proc.stderr is not None
        banner = proc.stderr.readline()
        assert "listening on" in banner, banner
        store = MemoryStore()
        with SidecarClient(str(socket_path), store) as client:
            with client.batch():
                client.update("t", [1, 2], {"a": 1.5, "b": b"\x00"})
                client.delete("t", 2, "b")
            client.set("t", 3, "a", None)
            # A second sidecar (configured by a file) on the same socket refuses to start.
            config = folder / "agent.toml"
            config.write_text("[agent]\nmax_queue = 8\n[sink]\nkind = \"memory\"\n")
            second = subprocess.run(
                [sys.executable, "-m", "agent.cli", "sidecar", "--socket", str(socket_path),
                 "--config", str(config)], cwd=ROOT, capture_output=True, text=True,
                timeout=120)
            assert second.returncode == 2 and "already listens" in second.stderr
            client.ping()  # the first one still serves
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        rest = proc.stderr.read()
        assert "stopped after 2 batches, 6 events" in rest, rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
    assert not socket_path.exists()
    snapshots = list(Assembler().replay(read_log(log_uri)))
    assert bits(snapshots[-1].state) == bits(store.snapshot())


@pytest.mark.parametrize(("extra", "message"), [
    (["--config", "/nonexistent/cdc.toml"], "cannot read configuration"),
    (["--log", "ftp://host/log"], "unsupported --log URI"),
    (["--grace", "-1"], "--grace"),
])
def test_cli_refuses_bad_options_clearly(folder: Path, extra: list[str], message: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A bad configuration, log URI or grace period exits with status 2 and says why."""
    import structlog

    from agent.cli import main

    saved = structlog.get_config()  # the command configures logging for the process
    try:
        assert main(["sidecar", "--socket", str(folder / "s"), *extra]) == 2
    finally:
        structlog.configure(**saved)
    assert message in capsys.readouterr().err
    assert not (folder / "s").exists()
