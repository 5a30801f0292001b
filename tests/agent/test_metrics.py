"""Prometheus metrics (issue 11, item 1): scraped over HTTP from a running sidecar, read
through the registry by an embedding application, and counted off the writers' path."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from agent import (
    Agent,
    CaptureMetrics,
    MemoryStore,
    kafka_consumer_lag,
    serve_metrics,
    wal3_cursor_lag,
)
from agent.sidecar import SidecarClient
from sinks import MemorySink, SinkError
from tests.agent._sidecar import short_dir
from tests.agent.test_backpressure import StallingSink

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def folder() -> Iterator[Path]:
    with short_dir() as path:
        yield path


def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_running_sidecar_serves_its_metrics_over_http(folder: Path) -> None:
    socket_path, uri = folder / "s", f"file://{folder}/log"
    proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "sidecar", "--socket",
                             str(socket_path), "--log", uri, "--metrics-port", "0"],
                            cwd=ROOT, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            text=True)
    try:
        assert proc.stderr is not None
        banner = proc.stderr.readline()
        found = re.search(r"metrics at (http://127\.0\.0\.1:\d+/metrics)", banner)
        assert found, banner
        url = found.group(1)
        with SidecarClient(str(socket_path), MemoryStore()) as client:
            for i in range(3):
                with client.batch():
                    client.set("t", i, "a", i)
                    client.set("t", i, "b", "x")
            client.flush()
            metrics = _scrape(url)
        assert metrics["cdc_batches_shipped_total", ()] == 3
        assert metrics["cdc_events_shipped_total", ()] == 6
        assert metrics["cdc_epochs_shipped_total", ()] >= 3
        assert metrics["cdc_shipping_queue_depth", ()] == 0
        assert metrics["cdc_shipping_backlogged", ()] == 0
        assert 0 <= metrics["cdc_last_quiescence_age_seconds", ()] < 60
        # A wal3 log takes each shipment (events, then epoch records) in one call.
        assert metrics["cdc_sink_call_seconds_count", (("call", "write_shipment"),)] >= 1
        assert metrics["cdc_sink_call_seconds_count", (("call", "flush"),)] >= 1
        assert metrics["cdc_sink_call_seconds_sum", (("call", "write_shipment"),)] > 0
    finally:
        proc.terminate()
        assert proc.wait(60) == 0
        if proc.stderr is not None:
            proc.stderr.close()


def test_metrics_listen_on_loopback_by_default_and_a_busy_port_is_refused(
        folder: Path) -> None:
    metrics = CaptureMetrics()
    server = serve_metrics(metrics, 0)
    try:
        assert server.address == "127.0.0.1"
        proc = subprocess.run([sys.executable, "-m", "agent.cli", "sidecar", "--socket",
                               str(folder / "s"), "--log", "memory://", "--metrics-port",
                               str(server.port)], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
    finally:
        server.stop()
    assert proc.returncode == 2, proc.stderr
    assert f"cannot serve metrics on 127.0.0.1:{server.port}" in proc.stderr
    assert "Traceback" not in proc.stderr


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    assert value is not None, name
    return value


def test_an_embedding_application_reads_the_registry_it_passed_in() -> None:
    registry = CollectorRegistry()
    metrics = CaptureMetrics(registry)
    store = MemoryStore()
    first = Agent(store, MemorySink(), metrics=metrics)
    second = Agent(MemoryStore(), MemorySink(), metrics=metrics)  # counts add up
    with first.batch():
        for i in range(10):
            first.set("t", i, "a", i)
    second.set("t", 1, "a", 1)
    first.flush()
    second.flush()
    assert _value(registry, "cdc_batches_shipped_total") == 2
    assert _value(registry, "cdc_events_shipped_total") == 11
    assert _value(registry, "cdc_epochs_shipped_total") >= 2
    assert _value(registry, "cdc_sink_call_seconds_count", call="write_events") >= 2
    first._snapshot_progress("accounts", 500, expected=1200)
    first._snapshot_progress("accounts", 700, done=True)
    assert _value(registry, "cdc_snapshot_rows_total", table="accounts") == 1200
    assert _value(registry, "cdc_snapshot_rows_expected", table="accounts") == 1200
    assert _value(registry, "cdc_snapshot_done", table="accounts") == 1
    first.close()
    second.close()


def test_agent_snapshot_progress_is_counted() -> None:
    metrics = CaptureMetrics()
    store = MemoryStore()
    agent = Agent(store, MemorySink(), metrics=metrics)
    for i in range(25):
        agent.set("t", i, "a", i)
    steps: list[Any] = []
    agent.snapshot(chunk_rows=10, progress=steps.append)
    assert steps, "the caller's progress callback is still called"
    assert _value(metrics.registry, "cdc_snapshot_cells_total") == 25
    assert _value(metrics.registry, "cdc_snapshot_chunks_total") == len(steps) >= 3
    assert _value(metrics.registry, "cdc_snapshot_running") == 0
    agent.close()


def test_sink_errors_are_counted_by_kind() -> None:
    metrics = CaptureMetrics()
    sink = StallingSink()
    agent = Agent(MemoryStore(), sink, metrics=metrics)
    sink.stalled.set()
    agent.set("t", 1, "a", 1)
    deadline = time.monotonic() + 30
    while not metrics.registry.get_sample_value("cdc_sink_errors_total", {"kind": "retried"}):
        assert time.monotonic() < deadline, "no retried sink error counted"
        time.sleep(0.01)  # the shipper meets the stalled sink and retries
    sink.stalled.clear()
    agent.flush()
    agent.close()

    class Broken(MemorySink):
        def write_events(self, batch: Any) -> None:
            raise SinkError("gone")

    broken = Agent(MemoryStore(), Broken(), metrics=metrics)
    broken.set("t", 1, "a", 1)
    with pytest.raises(Exception, match="gone"):
        broken.flush()
    assert _value(metrics.registry, "cdc_sink_errors_total", kind="fatal") == 1
    with pytest.raises(Exception, match="gone"):
        broken.close()


def test_wal3_consumer_lag_is_the_records_behind_the_end(folder: Path) -> None:
    from sinks.wal3 import LogReader, open_log_sink, read_log

    uri = f"file://{folder}/log"
    agent = Agent(MemoryStore(), open_log_sink(uri))
    for i in range(5):
        agent.set("t", i, "a", i)
    agent.close()
    metrics = CaptureMetrics()
    metrics.watch_consumer_lag("reports", wal3_cursor_lag(uri, "reports"))
    behind = _value(metrics.registry, "cdc_consumer_lag", consumer="reports")
    reader = LogReader(uri)  # wal3 records: an EPOCHS run holds several epoch records
    in_log = sum(len(reader.fetch(f)) for f in reader.scan())
    assert behind == in_log > 1  # every record of the log, none read yet
    assert len(list(read_log(uri))) > 5  # five batches, ten epochs, decoded
    list(read_log(uri, "reports"))  # the consumer reads everything, moving its cursor
    assert _value(metrics.registry, "cdc_consumer_lag", consumer="reports") == 0


def test_kafka_consumer_lag_sums_partitions_behind_their_end() -> None:
    class Log:
        def read_offsets(self) -> dict[int, int]:
            return {0: 10, 1: 3}

    class Consumer:
        log = Log()

        def end_offsets(self, timeout: float) -> dict[int, int]:
            return {0: 12, 1: 3, 2: 4}

    metrics = CaptureMetrics()
    metrics.watch_consumer_lag("billing", kafka_consumer_lag(Consumer()))
    assert _value(metrics.registry, "cdc_consumer_lag", consumer="billing") == 6

    def unreachable() -> int:
        raise ConnectionError("broker down")

    metrics.watch_consumer_lag("down", unreachable)  # a failing measure skips its series
    assert metrics.registry.get_sample_value("cdc_consumer_lag", {"consumer": "down"}) is None
    assert _value(metrics.registry, "cdc_consumer_lag", consumer="billing") == 6


def test_importing_agent_does_not_import_the_metrics_library() -> None:
    code = "import sys, agent, agent.sidecar; print('prometheus_client' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert out.strip() == "False"
