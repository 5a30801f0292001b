"""A real single-node Apache Kafka broker (KRaft, combined broker + controller) for tests.

The broker runs from the jars ``scripts/install-kafka.sh`` fetches from Maven Central
into ``.cache/kafka/libs`` (the fixture runs that script if they are missing). Its
storage is formatted in a temporary folder, it listens on free loopback ports, and it
is stopped by the PID we started. ``KafkaBroker.restart()`` stops and starts the SAME
broker (same data folder, same ports), for tests of a broker outage mid-stream.

Fixtures:

- ``kafka_broker`` (session): the running ``KafkaBroker``.
- ``kafka_bootstrap`` (session): its ``"127.0.0.1:port"``.
- ``kafka_topic``: a factory ``kafka_topic(partitions=3) -> name`` creating a fresh
  topic per call, so tests share one broker but never a topic.

The benchmark (``bench/kafka_sink.py``) uses ``KafkaBroker`` directly.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.services._proc import ServiceProcess, free_port, wait_for_port

__all__ = ["KafkaBroker", "kafka_bootstrap", "kafka_broker", "kafka_topic"]

ROOT = Path(__file__).resolve().parents[2]
LIBS = ROOT / ".cache" / "kafka" / "libs"
INSTALL = ROOT / "scripts" / "install-kafka.sh"
LOG4J = ROOT / "scripts" / "kafka" / "log4j2.properties"
HEAP = "512m"
START_TIMEOUT = 120.0

# librdkafka logs through this logger (silenced) instead of writing to stderr.
_quiet = logging.getLogger("tests.services.kafka.librdkafka")
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False


def ensure_installed() -> Path:
    """The folder of broker jars, running the install script once if it is missing."""
    if not any(LIBS.glob("kafka_2.13-*.jar")):
        subprocess.run(["bash", str(INSTALL)], check=True, stdin=subprocess.DEVNULL,
                       env={**os.environ, "CI": "true"}, timeout=600)
    return LIBS


def _java() -> str:
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("the Kafka broker needs 'java' (17+) on PATH")
    return java


class KafkaBroker:
    """One KRaft broker+controller on 127.0.0.1, its data in ``workdir``."""

    def __init__(self, workdir: Path, *, heap: str = HEAP) -> None:
        self.workdir = workdir
        self.libs = ensure_installed()
        self.heap = heap
        self.port = free_port()
        self.controller_port = free_port()
        while self.controller_port == self.port:
            self.controller_port = free_port()
        self.data_dir = workdir / "data"
        self.config = workdir / "server.properties"
        self.log_path = workdir / "broker.log"
        self.process: ServiceProcess | None = None
        self.starts = 0
        self._write_config()
        self._format()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _classpath_argv(self, main: str, *args: str, heap: str = "256m") -> list[str]:
        return [
            _java(), f"-Xmx{heap}", "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={LOG4J}",
            "-cp", f"{self.libs}/*", main, *args,
        ]

    def _write_config(self) -> None:
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": (f"PLAINTEXT://127.0.0.1:{self.port},"
                          f"CONTROLLER://127.0.0.1:{self.controller_port}"),
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.data_dir),
            "auto.create.topics.enable": "false",
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "num.network.threads": "2",
            "num.io.threads": "2",
        }
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))

    def _format(self) -> None:
        run = subprocess.run(
            self._classpath_argv("kafka.tools.StorageTool", "random-uuid"),
            capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL, timeout=120,
        )
        cluster_id = run.stdout.strip().splitlines()[-1]
        fmt = subprocess.run(
            self._classpath_argv("kafka.tools.StorageTool", "format", "-t", cluster_id,
                                 "-c", str(self.config)),
            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120,
        )
        if fmt.returncode != 0:
            raise RuntimeError(f"formatting KRaft storage failed:\n{fmt.stdout}\n{fmt.stderr}")

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start the broker and wait until a metadata request through confluent-kafka works."""
        if self.process is not None:
            raise RuntimeError("the broker is already running")
        argv = self._classpath_argv("kafka.Kafka", str(self.config), heap=self.heap)
        argv[2:2] = ["-Xms128m", "-XX:+UseG1GC"]
        self.process = ServiceProcess(argv, self.log_path)
        self.starts += 1
        deadline = time.monotonic() + timeout
        try:
            wait_for_port(self.port, timeout, self.process.proc)
            self._wait_for_metadata(deadline)
        except Exception as exc:
            tail = self.process.tail()
            self.stop()
            raise RuntimeError(f"the Kafka broker did not start: {exc}\n--- broker log ---\n"
                               f"{tail}") from exc

    def _wait_for_metadata(self, deadline: float) -> None:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "logger": _quiet})
        while True:
            assert self.process is not None
            if self.process.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.process.proc.returncode}")
            try:
                metadata = admin.list_topics(timeout=2.0)
                if metadata.brokers:
                    return
            except KafkaException:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("no metadata from the broker in time")
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop the broker by its PID (SIGTERM, a clean shutdown; SIGKILL if it lingers)."""
        if self.process is not None:
            self.process.stop(timeout=30.0)
            self.process = None

    def restart(self) -> None:
        """Stop and start the same broker: same data folder, same ports."""
        self.stop()
        self.start()

    def create_topic(self, name: str, partitions: int = 3, timeout: float = 30.0) -> str:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "logger": _quiet})
        futures = admin.create_topics([NewTopic(name, partitions, 1)],
                                      operation_timeout=timeout, request_timeout=timeout)
        futures[name].result(timeout)
        # Wait until every partition has a leader, so the first produce does not race it.
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            topic = admin.list_topics(name, timeout=timeout).topics.get(name)
            if topic is not None and topic.error is None and len(topic.partitions) == partitions \
                    and all(p.leader >= 0 for p in topic.partitions.values()):
                return name
            time.sleep(0.05)
        raise TimeoutError(f"topic {name} has no leader for every partition after {timeout}s")


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaBroker]:
    """A running broker for the whole session; fails loudly if it cannot start."""
    workdir = Path(tempfile.mkdtemp(prefix="cdc-kafka-"))
    broker = KafkaBroker(workdir)
    try:
        broker.start()
        yield broker
    finally:
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker: KafkaBroker) -> str:
    """``host:port`` of the session broker."""
    return kafka_broker.bootstrap


_topic_numbers = itertools.count(1)


@pytest.fixture
def kafka_topic(kafka_broker: KafkaBroker,
                request: pytest.FixtureRequest) -> Callable[..., str]:
    """A factory of fresh topics: ``kafka_topic(partitions=3)`` returns a new name."""
    stem = "".join(c if c.isalnum() else "-" for c in request.node.name)[:60]

    def make(partitions: int = 3) -> str:
        return kafka_broker.create_topic(f"t{next(_topic_numbers)}-{stem}", partitions)

    return make
