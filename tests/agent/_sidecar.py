"""Helpers for the sidecar tests: a sidecar served from a thread, and a raw connection."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agent import MemoryStore
from agent.sidecar import Sidecar
from replay import Assembler
from sinks import MemorySink
from tests.helpers import bits


@contextmanager
def short_dir() -> Iterator[Path]:
    """A fresh folder with a short path (a Unix socket path has at most ~107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="cdc-sc-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class Served:
    """A Sidecar on a MemorySink, served by a thread; records ``store`` at quiescence."""

    def __init__(self, path: Path, store: MemoryStore | None = None, **options: Any) -> None:
        self.path = path
        self.store = store or MemoryStore()
        self.sink = options.pop("sink", None) or MemorySink()
        self.serve_options = {k: options.pop(k) for k in ("socket_mode",) if k in options}
        self.at_quiescence: dict[tuple[int, int], dict[Any, bytes]] = {}
        self.quiesced = threading.Event()
        self.sidecar = Sidecar(self.sink, on_quiescence=self._capture, **options)
        self.error: BaseException | None = None
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self._thread.start()
        if not started.wait(30) or self.error is not None:
            self.sidecar.close()
            raise RuntimeError(f"the sidecar did not start: {self.error!r}") from self.error

    def _capture(self, marker: Any) -> None:
        self.at_quiescence[(marker.domain_id, marker.epoch_seq)] = bits(self.store.snapshot())
        self.quiesced.set()

    def _run(self, started: threading.Event) -> None:
        try:
            asyncio.run(self.sidecar.serve(self.path, started=started.set,
                                           **self.serve_options))
        except BaseException as exc:
            self.error = exc
            started.set()

    def stop(self) -> None:
        """Shut the sidecar down and wait for it; re-raise what serve() raised."""
        self.sidecar.stop()
        self._thread.join(60)
        assert not self._thread.is_alive(), "the sidecar did not stop"
        if self.error is not None:
            raise self.error

    def replay(self) -> list[Any]:
        """Every snapshot the log replays to (raises InconsistentLog if it is not)."""
        return list(Assembler().replay(self.sink.records))

    def check_against_store(self) -> int:
        """Every replayed snapshot equals the store as captured; the last equals it now."""
        snapshots = self.replay()
        for snap in snapshots:
            assert bits(snap.state) == self.at_quiescence[(snap.domain_id, snap.epoch_seq)], (
                f"snapshot at epoch {snap.epoch_seq} differs from the store's state")
        assert len(snapshots) == len(self.at_quiescence)
        assert bits(snapshots[-1].state) == bits(self.store.snapshot())
        return len(snapshots)


class Raw:
    """A raw protocol connection: send a line (or an object), read one reply."""

    def __init__(self, path: Path, *, hello: bool = True) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(str(path))
        self.file = self.sock.makefile("rb")
        if hello:
            assert self.call({"op": "hello", "protocol": 1})["ok"]

    def send(self, line: bytes | dict[str, Any]) -> None:
        if isinstance(line, dict):
            line = json.dumps(line).encode() + b"\n"
        self.sock.sendall(line)

    def reply(self) -> dict[str, Any]:
        line = self.file.readline()
        assert line.endswith(b"\n"), f"connection closed (got {line!r})"
        reply: dict[str, Any] = json.loads(line)
        return reply

    def call(self, line: bytes | dict[str, Any]) -> dict[str, Any]:
        self.send(line)
        return self.reply()

    def open(self) -> str:
        reply = self.call({"op": "open"})
        assert reply["ok"], reply
        return str(reply["batch"])

    def close(self) -> None:
        self.file.close()
        self.sock.close()
