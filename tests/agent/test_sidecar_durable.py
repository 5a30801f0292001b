"""Durable acknowledgements (issue 11, item 3): a close asked to be durable is answered
only once its records are durable in the sink, so a sidecar SIGKILLed right after
acknowledging loses none of the batches it acknowledged."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import MemoryStore
from agent.sidecar import SidecarClient, SidecarUnavailable
from agent.sidecar import _protocol as p
from sequencer import ChangeEvent
from sinks import EventBatch, MemorySink, SinkError
from tests.agent._sidecar import Raw, Served, short_dir

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def folder() -> Iterator[Path]:
    with short_dir() as path:
        yield path


def _rows_in_log(uri: str) -> set[object]:
    from sinks.wal3 import read_log

    rows: set[object] = set()
    for record in read_log(uri):
        if isinstance(record, EventBatch):
            rows.update(e.row for e in record.to_events() if isinstance(e, ChangeEvent))
    return rows


def test_every_durably_acknowledged_batch_survives_a_sigkill(folder: Path) -> None:
    """Four threads close batches durably (two clients durable for every batch, two asking
    per batch) against `cdc-agent sidecar` on a wal3 log; the sidecar is SIGKILLed just
    after the 300th acknowledgement; every acknowledged batch's events are in the log."""
    socket_path, uri = folder / "s", f"file://{folder}/log"
    proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "sidecar", "--socket",
                             str(socket_path), "--log", uri], cwd=ROOT,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    acked: list[str] = []
    lock = threading.Lock()
    enough = threading.Event()
    try:
        assert proc.stderr is not None
        assert "listening" in proc.stderr.readline()
        everyone = SidecarClient(str(socket_path), MemoryStore(), durable=True)
        some = SidecarClient(str(socket_path), MemoryStore())

        def write(client: SidecarClient, name: str) -> None:
            try:
                for i in range(100_000):
                    row = f"{name}-{i}"
                    with client.batch(durable=client is some):
                        client.set("t", row, "a", i)
                        client.set("t", row, "b", b"x" * 100)
                    with lock:
                        acked.append(row)
                        if len(acked) >= 300:
                            enough.set()
            except SidecarUnavailable:
                return  # the sidecar was killed

        threads = [threading.Thread(target=write, args=(client, f"w{n}"))
                   for n, client in enumerate([everyone, everyone, some, some])]
        for thread in threads:
            thread.start()
        assert enough.wait(120), "the writers did not get 300 acknowledgements"
        proc.send_signal(signal.SIGKILL)
        with lock:
            acknowledged = list(acked)  # every ack read before the kill
        for thread in threads:
            thread.join(60)
        everyone.close()
        some.close()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(60)
        if proc.stderr is not None:
            proc.stderr.close()
    in_log = _rows_in_log(uri)
    missing = [row for row in acknowledged if row not in in_log]
    assert not missing, f"{len(missing)} of {len(acknowledged)} acknowledged batches lost"


def test_durable_close_replies_say_so_and_flush_the_sink(folder: Path) -> None:
    """A durable close is answered with "durable": true after a sink flush; a plain close
    is not waited for; a hello with durable makes every close of the connection durable."""
    served = Served(folder / "s")
    flushes = []
    real_flush = served.sink.flush
    served.sink.flush = lambda: (flushes.append(1), real_flush())[1]  # type: ignore[method-assign]
    raw = Raw(folder / "s")
    batch = raw.open()
    assert raw.call({"op": "close", "batch": batch, "events": [
        ["t", 1, "a", {"absent": True}, 1]]}) == {"id": None, "ok": True, "events": 1}
    assert not flushes
    batch = raw.open()
    assert raw.call({"op": "close", "batch": batch, "durable": True, "events": [
        ["t", 2, "a", {"absent": True}, 1]]}) == {"id": None, "ok": True, "events": 1,
                                                 "durable": True}
    assert flushes
    assert raw.call({"op": "close", "batch": batch, "durable": 1})["error"] == p.BAD_REQUEST
    always = Raw(folder / "s", hello=False)
    assert always.call({"op": "hello", "protocol": 1, "durable": True})["ok"]
    before = len(flushes)
    batch = always.open()
    assert always.call({"op": "close", "batch": batch})["durable"] is True
    assert len(flushes) > before
    batch = always.open()  # a close may still opt out
    assert "durable" not in always.call({"op": "close", "batch": batch, "durable": False})
    raw.close()
    always.close()
    served.stop()


class _FailingFlushSink(MemorySink):
    def flush(self) -> None:
        raise SinkError("the disk is gone")


def test_a_durable_close_reports_a_sink_failure(folder: Path) -> None:
    """A durable close whose records cannot be made durable is answered shipping_failed,
    never ok (the client must not believe they are safe)."""
    served = Served(folder / "s", sink=_FailingFlushSink())
    raw = Raw(folder / "s")
    batch = raw.open()
    reply = raw.call({"op": "close", "batch": batch, "durable": True, "events": [
        ["t", 1, "a", {"absent": True}, 1]]})
    assert reply["ok"] is False and reply["error"] == p.SHIPPING_FAILED, reply
    assert "may not be durable" in reply["message"]
    raw.close()
    with pytest.raises(Exception, match="disk is gone"):
        served.stop()


def test_the_protocol_parses_durable() -> None:
    assert p.parse_request(b'{"op":"close","batch":"b","durable":true}') == p.Close(
        None, "b", [], True)
    assert p.parse_request(b'{"op":"close","batch":"b"}').durable is None  # type: ignore[union-attr]
    assert p.parse_request(b'{"op":"hello","protocol":1,"durable":true}') == p.Hello(
        None, 1, "", True)
    with pytest.raises(p.ProtocolError, match="true or false"):
        p.parse_request(b'{"op":"hello","protocol":1,"durable":"yes"}')
