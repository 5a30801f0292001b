"""The sidecar's health probe (issue 11, item 2): the ``health`` request and
``cdc-agent health --socket PATH`` (exit 0 healthy, 1 with one line saying why)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent._cli_health import probe
from agent.sidecar import _protocol as p
from sinks import MemorySink, SinkError
from tests.agent._sidecar import Raw, Served, short_dir
from tests.agent.test_backpressure import StallingSink

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def folder() -> Iterator[Path]:
    with short_dir() as path:
        yield path


def _cli(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent.cli", "health", "--socket", str(path),
                           "--timeout", "10"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_a_healthy_sidecar_answers_with_its_figures(folder: Path) -> None:
    served = Served(folder / "s")
    raw = Raw(folder / "s", hello=False)  # a probe needs no hello
    batch_holder = Raw(folder / "s")
    batch_holder.open()
    reply = raw.call({"op": "health", "id": 1})
    assert reply["ok"] is True and reply["healthy"] is True and reply["id"] == 1
    assert reply["open_batches"] == 1 and reply["connections"] == 2
    assert reply["queue_depth"] >= 0 and reply["last_quiescence_age"] >= 0
    done = _cli(folder / "s")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("healthy ") and '"open_batches":1' in done.stdout
    raw.close()
    batch_holder.close()
    served.stop()


def test_a_sidecar_whose_sink_failed_is_unhealthy(folder: Path) -> None:
    class Broken(MemorySink):
        def write_events(self, batch: object) -> None:
            raise SinkError("the bucket is gone")

    served = Served(folder / "s", sink=Broken())
    raw = Raw(folder / "s")
    batch = raw.open()
    raw.call({"op": "close", "batch": batch, "events": [["t", 1, "a", {"absent": True}, 1]]})
    deadline = time.monotonic() + 30
    while (reply := raw.call({"op": "health"}))["ok"]:
        assert time.monotonic() < deadline, "the failure never showed"
        time.sleep(0.01)
    assert reply["error"] == p.UNHEALTHY and "the bucket is gone" in reply["message"]
    done = _cli(folder / "s")
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "shipping to the sink failed" in done.stderr
    raw.close()
    with pytest.raises(Exception, match="bucket is gone"):
        served.stop()


def test_a_sink_stuck_longer_than_the_backpressure_timeout_is_unhealthy(folder: Path) -> None:
    sink = StallingSink()
    served = Served(folder / "s", sink=sink, backpressure_timeout=0.2)
    raw = Raw(folder / "s")
    sink.stalled.set()
    batch = raw.open()
    raw.call({"op": "close", "batch": batch, "events": [["t", 1, "a", {"absent": True}, 1]]})
    deadline = time.monotonic() + 30
    while (reply := raw.call({"op": "health"}))["ok"]:
        assert time.monotonic() < deadline, "the stuck sink never showed"
        time.sleep(0.02)
    assert "refused records" in reply["message"]
    sink.stalled.clear()  # it recovers: healthy again
    while not (reply := raw.call({"op": "health"}))["ok"]:
        assert time.monotonic() < deadline + 30, "never healthy again"
        time.sleep(0.02)
    raw.close()
    served.stop()


def test_an_unreachable_or_stopping_sidecar_is_unhealthy(folder: Path) -> None:
    done = _cli(folder / "nothing-here")
    assert done.returncode == 1
    assert "cannot reach the sidecar" in done.stderr and done.stderr.count("\n") == 1
    served = Served(folder / "s", grace_period=30)
    holder = Raw(folder / "s")
    batch = holder.open()  # keeps shutdown in its grace period
    prober = Raw(folder / "s", hello=False)
    assert prober.call({"op": "health"})["ok"]  # accepted, and healthy until stop
    served.sidecar.stop()
    deadline = time.monotonic() + 30
    while (reply := prober.call({"op": "health"}))["ok"]:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert reply["message"] == "the sidecar is shutting down"
    healthy, why = probe(str(folder / "s"), timeout=2)  # a new probe is not accepted now
    assert not healthy and why
    holder.call({"op": "close", "batch": batch})
    holder.close()
    prober.close()
    served.stop()
