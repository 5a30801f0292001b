"""Prometheus metrics of capture, with the standard client library (``prometheus-client``,
the ``metrics`` extra; imported only when metrics are asked for).

``CaptureMetrics(registry)`` holds the collectors. Pass it to an ``Agent``, ``AsyncAgent``
or ``Sidecar`` (``metrics=``); several may share one. Capture pays nothing per write:

- counts (batches, events, epochs shipped), the shipping queue's depth and the age of
  the last quiescence point are read from the agents when the registry is scraped;
- sink latency and errors are observed by the shipping thread, once per sink call
  (one call ships a whole drained group of batches);
- snapshot progress and consumers' lag come from hooks: ``snapshot_progress(...)``,
  ``watch_consumer_lag(name, fn)`` (``wal3_cursor_lag`` and ``kafka_consumer_lag``
  build ``fn`` for the two logs).

Serve them over HTTP with ``serve_metrics(metrics, port, address)`` (what
``cdc-agent sidecar --metrics-port`` does) or through the application's own exporter
(``metrics.registry``). The metric names are listed in ``docs/metrics.md``.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import structlog

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

__all__ = ["CaptureMetrics", "MetricsServer", "kafka_consumer_lag", "serve_metrics",
           "wal3_cursor_lag"]

log = structlog.get_logger()

# Sink call latency buckets (seconds): a memory sink answers in microseconds, an object
# store in tens of milliseconds, a stalled one in seconds.
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                    2.5, 5.0, 10.0, 30.0)


def _client() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:
        raise ImportError("metrics need prometheus-client: pip install 'cdc-agent[metrics]'"
                          ) from exc
    return prometheus_client


class Watched(Protocol):
    """What the collector reads from an agent at scrape time (``_Capture`` has it)."""

    def _metric_counts(self) -> dict[str, float]: ...


class CaptureMetrics:
    """The collectors of capture, registered in ``registry`` (a new one by default)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        client = _client()
        self.registry: CollectorRegistry = (registry if registry is not None
                                            else client.CollectorRegistry())
        self._agents: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lag: dict[str, Callable[[], int]] = {}
        self._lock = threading.Lock()
        self.sink_seconds = client.Histogram(
            "cdc_sink_call_seconds", "Time a sink call took (write_events, write_epoch, "
            "write_shipment: a shipment's events and epoch records in one call, "
            "write_snapshot, flush), retries included", ["call"],
            buckets=_LATENCY_BUCKETS, registry=self.registry)
        # Children looked up once: the shipping thread observes without a label lookup.
        self._sink_observers: dict[str, Callable[[float], None]] = {
            call: self.sink_seconds.labels(call).observe
            for call in ("write_events", "write_epoch", "write_shipment", "write_snapshot",
                         "flush")}
        self.sink_errors = client.Counter(
            "cdc_sink_errors", "Sink calls that raised: retried (the sink was behind) or "
            "fatal (shipping stopped)", ["kind"], registry=self.registry)
        self.snapshot_rows = client.Counter(
            "cdc_snapshot_rows", "Rows an initial snapshot has captured", ["table"],
            registry=self.registry)
        self.snapshot_rows_expected = client.Gauge(
            "cdc_snapshot_rows_expected", "Rows an initial snapshot expects to capture "
            "(when known)", ["table"], registry=self.registry)
        self.snapshot_done = client.Gauge(
            "cdc_snapshot_done", "1 once a table's initial snapshot is complete", ["table"],
            registry=self.registry)
        self.snapshot_cells = client.Counter(
            "cdc_snapshot_cells", "Cells recorded by snapshots (Agent.snapshot baselines)",
            registry=self.registry)
        self.snapshot_chunks = client.Counter(
            "cdc_snapshot_chunks", "Chunks recorded by snapshots (Agent.snapshot baselines)",
            registry=self.registry)
        self.snapshot_running = client.Gauge(
            "cdc_snapshot_running", "1 while an Agent.snapshot baseline is being taken",
            registry=self.registry)
        self.registry.register(_Collector(self))

    # -- hooks -----------------------------------------------------------------------------

    def attach(self, agent: Watched) -> None:
        """Report ``agent``'s counts at each scrape (``Agent(metrics=...)`` calls this)."""
        with self._lock:
            self._agents.add(agent)

    def observe_sink_call(self, call: str, seconds: float) -> None:
        observe = self._sink_observers.get(call)
        if observe is None:
            observe = self._sink_observers[call] = self.sink_seconds.labels(call).observe
        observe(seconds)

    def count_sink_error(self, kind: str) -> None:
        self.sink_errors.labels(kind).inc()

    def snapshot_progress(self, table: str, rows: int, *, expected: int | None = None,
                          done: bool = False) -> None:
        """A snapshot captured ``rows`` more rows of ``table`` (call it per chunk)."""
        if rows:
            self.snapshot_rows.labels(table).inc(rows)
        if expected is not None:
            self.snapshot_rows_expected.labels(table).set(expected)
        if done:
            self.snapshot_done.labels(table).set(1)

    def baseline_chunk(self, cells: int, *, finished: bool) -> None:
        """``Agent.snapshot`` recorded one more chunk of ``cells`` cells."""
        self.snapshot_chunks.inc()
        self.snapshot_cells.inc(cells)
        self.snapshot_running.set(0 if finished else 1)

    def watch_consumer_lag(self, consumer: str, lag: Callable[[], int]) -> None:
        """Report ``lag()`` (positions behind the log's end) as
        ``cdc_consumer_lag{consumer=...}`` at each scrape."""
        with self._lock:
            self._lag[consumer] = lag

    # -- scraping --------------------------------------------------------------------------

    def _snapshot(self) -> tuple[list[dict[str, float]], dict[str, Callable[[], int]]]:
        with self._lock:
            return [a._metric_counts() for a in list(self._agents)], dict(self._lag)


class _Collector:
    """Reads the agents' counters at scrape time (nothing is counted per write)."""

    def __init__(self, metrics: CaptureMetrics) -> None:
        self._metrics = metrics
        core = _client().metrics_core
        self._counter = core.CounterMetricFamily
        self._gauge = core.GaugeMetricFamily

    def describe(self) -> list[Metric]:
        return []  # unchecked: the families are built at collect time

    def collect(self) -> Iterator[Metric]:
        counts, lags = self._metrics._snapshot()

        def total(key: str) -> float:
            return sum(c[key] for c in counts)

        yield self._counter("cdc_batches_shipped", "Write batches closed and handed to "
                            "the shipper", value=total("batches"))
        yield self._counter("cdc_events_shipped", "Change events the sink accepted",
                            value=total("events"))
        yield self._counter("cdc_epochs_shipped", "Epoch records the sink accepted",
                            value=total("epochs"))
        yield self._gauge("cdc_shipping_queue_depth", "Segments and epoch records waiting "
                          "for the shipping thread", value=total("queue_depth"))
        yield self._gauge("cdc_shipping_backlogged", "1 while the shipping queue is over "
                          "max_queue (new batches wait)", value=max(
                              (c["backlogged"] for c in counts), default=0.0))
        ages = [c["quiescence_age"] for c in counts]
        yield self._gauge("cdc_last_quiescence_age_seconds", "Seconds since the last "
                          "quiescent epoch record reached the sink (since start if none; "
                          "the oldest over the agents)", value=max(ages, default=0.0))
        lag = self._gauge("cdc_consumer_lag", "Log positions a consumer is behind the "
                          "log's end (wal3 records, Kafka messages)", labels=["consumer"])
        for name, measure in lags.items():
            try:
                lag.add_metric([name], float(measure()))
            except Exception as exc:  # a log that cannot be read now: say so, keep serving
                log.warning("cdc.consumer_lag_failed", consumer=name, error=repr(exc))
        yield lag


def wal3_cursor_lag(log_uri: Any, cursor: str, *, prefix: str = "",
                    endpoint_url: str | None = None) -> Callable[[], int]:
    """A lag measure for ``watch_consumer_lag``: records between a wal3 cursor and the
    log's end (the whole log while the cursor does not exist yet)."""
    from sinks.wal3 import CursorStore, LogReader, as_store

    store = as_store(log_uri, endpoint_url=endpoint_url)
    reader = LogReader(store, prefix)
    cursors = CursorStore(store, prefix, writer="cdc-agent metrics")

    def measure() -> int:
        manifest = reader.manifest()
        witness = cursors.load(cursor)
        position = manifest.oldest_offset if witness is None else witness.cursor.position
        return max(0, manifest.next_offset - position)

    return measure


def kafka_consumer_lag(consumer: Any, *, timeout: float = 5.0) -> Callable[[], int]:
    """A lag measure for ``watch_consumer_lag``: messages between what a
    ``KafkaConsistentConsumer`` has read and each partition's end, summed."""

    def measure() -> int:
        ends: dict[int, int] = consumer.end_offsets(timeout)
        read: dict[int, int] = consumer.log.read_offsets()
        return sum(max(0, high - read.get(p, 0)) for p, high in ends.items())

    return measure


class MetricsServer:
    """An HTTP server of a registry (``GET /metrics``) on a daemon thread."""

    def __init__(self, metrics: CaptureMetrics, port: int, address: str = "127.0.0.1"
                 ) -> None:
        self._server, self._thread = _client().start_http_server(
            port, address, registry=metrics.registry)
        self.address = address
        self.port: int = self._server.server_port  # the real one when port was 0

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def serve_metrics(metrics: CaptureMetrics, port: int, address: str = "127.0.0.1"
                  ) -> MetricsServer:
    """Serve ``metrics.registry`` over HTTP on ``address:port`` (loopback by default);
    ``.stop()`` the result to end it."""
    return MetricsServer(metrics, port, address)

