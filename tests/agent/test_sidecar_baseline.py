"""The sidecar over a store that already holds data: the docs/sidecar.md example, with
a baseline, then ``cdc-agent log verify`` on the wal3 log it wrote."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import structlog.testing

from agent import MemoryStore
from agent.sidecar import Sidecar, SidecarClient
from replay import Assembler
from sinks import MemorySink
from sinks.wal3 import Wal3Sink, read_log
from tests.agent._sidecar import Raw, short_dir
from tests.helpers import bits

ROOT = Path(__file__).resolve().parents[2]


def _serve(sidecar: Sidecar, path: Path) -> threading.Thread:
    started = threading.Event()
    thread = threading.Thread(
        target=lambda: asyncio.run(sidecar.serve(path, started=started.set)), daemon=True)
    thread.start()
    assert started.wait(30)
    return thread


def _store() -> MemoryStore:
    cells: dict[Any, Any] = {("accounts", i, "balance"): i * 10 for i in range(1, 60)}
    cells |= {("accounts", 42, "note"): "vip", ("accounts", 1, "frozen"): False}
    return MemoryStore(cells)


def _session(tmp: Path, log_dir: Path, *, baseline: bool) -> dict[Any, bytes]:
    store = _store()
    sidecar = Sidecar(Wal3Sink(f"file://{log_dir}"))
    sock = tmp / "agent.sock"
    thread = _serve(sidecar, sock)
    client = SidecarClient(str(sock), store)
    if baseline:
        report = client.snapshot(chunk_rows=16)
        assert report["chunks"] == 4 and report["cells"] == 61
    # The example of docs/sidecar.md.
    with client.batch():
        client.set("accounts", 42, "balance", 75)
        client.delete("accounts", 42, "note")
    client.set("accounts", 7, "balance", 0)
    client.update("accounts", [1, 2], {"frozen": True})
    client.conditional_set("accounts", {42: {"balance": (75, 80)}})
    client.flush()
    client.close()
    sidecar.stop()
    thread.join(30)
    return bits(store.snapshot())


def _verify(log_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "agent.cli", "log", "verify",
                           f"file://{log_dir}"], capture_output=True, text=True, env=env,
                          timeout=120, check=False)


def test_sidecar_example_over_a_prepopulated_store_verifies_with_a_baseline() -> None:
    with short_dir() as tmp:
        final = _session(tmp, tmp / "log", baseline=True)
        result = _verify(tmp / "log")
        assert result.returncode == 0, result.stderr
        assert "OK" in result.stdout
        snaps = list(Assembler().replay(read_log(f"file://{tmp / 'log'}")))
        assert bits(snaps[-1].state) == final


def test_without_a_baseline_verify_fails_as_the_issue_reported() -> None:
    with short_dir() as tmp:
        _session(tmp, tmp / "log", baseline=False)
        result = _verify(tmp / "log")
        assert result.returncode == 1
        assert "did not replace the value the cell held" in result.stderr


def test_a_client_gone_while_holding_lets_writers_go() -> None:
    with short_dir() as tmp:
        sidecar = Sidecar(Wal3Sink("memory://sidecar-hold"))
        sock = tmp / "agent.sock"
        thread = _serve(sidecar, sock)
        holder = Raw(sock)
        assert holder.call({"op": "snapshot_hold"})["ok"]
        holder.close()  # dies before sending its chunk
        writer = Raw(sock)
        writer.sock.settimeout(10)
        assert writer.open()  # would wait for the hold (and time out) otherwise
        writer.close()
        sidecar.stop()
        thread.join(30)


@pytest.mark.parametrize(("request_", "message"), [
    ({"op": "snapshot_chunk", "baseline": None, "index": 0, "cells": []}, "snapshot_hold first"),
    ({"op": "snapshot_chunk", "index": -1, "cells": []}, "needs \"index\""),
    ({"op": "snapshot_chunk", "index": 0, "cells": [["t", 1, "c"]]}, "a cell is"),
    ({"op": "snapshot_chunk", "index": 0, "cells": [], "lo": ["t"]}, "\"lo\" must be"),
    ({"op": "snapshot_hold", "journal": 3}, "must be an object store URI"),
    ({"op": "snapshot_hold", "journal": "nosuch://x"}, "\"journal\""),
])
def test_bad_snapshot_requests_are_refused_clearly(request_: dict[str, Any],
                                                    message: str) -> None:
    with short_dir() as tmp:
        sidecar = Sidecar(Wal3Sink("memory://sidecar-bad"))
        sock = tmp / "agent.sock"
        thread = _serve(sidecar, sock)
        raw = Raw(sock)
        reply = raw.call(request_)
        assert reply["ok"] is False and message in reply["message"]
        raw.close()
        sidecar.stop()
        thread.join(30)


@pytest.mark.parametrize(("chunks", "message"), [
    ([{"baseline": None, "index": 1}], "a baseline starts with index 0"),
    ([{"baseline": "00000000000000ab", "index": 0}], "is not under way"),
    ([{"baseline": None, "index": 0, "hi": ["t", 5]}, {"index": 2}], "chunk 1 is due"),
    ([{"baseline": None, "index": 0, "hi": ["t", 5]}, {"index": 0}], "chunk 1 is due"),
])
def test_chunks_out_of_order_are_refused_and_let_writers_go(
        chunks: list[dict[str, Any]], message: str) -> None:
    """A chunk that is not the one due (a gap, a repeat, a baseline the sidecar does not
    run) is refused before anything is recorded, and the hold is released."""
    with short_dir() as tmp:
        sink = MemorySink()
        sidecar = Sidecar(sink)
        sock = tmp / "agent.sock"
        thread = _serve(sidecar, sock)
        raw = Raw(sock)
        baseline = None
        for i, chunk in enumerate(chunks):
            assert raw.call({"op": "snapshot_hold"})["ok"]
            request = {"op": "snapshot_chunk", "baseline": baseline, "cells": [], **chunk}
            reply = raw.call(request)
            if i < len(chunks) - 1:
                assert reply["ok"], reply
                baseline = reply["baseline"]
        assert reply["ok"] is False and message in reply["message"], reply
        assert raw.open()  # writers are not held
        raw.close()
        sidecar.stop()
        thread.join(30)
        assert len(sink.snapshot_chunks) == len(chunks) - 1


class _SmallMessages(MemorySink):
    """Takes snapshot chunks of at most ``snapshot_max_bytes`` (as KafkaSink does)."""

    snapshot_max_bytes = 600


def test_sidecar_chunks_are_cut_to_the_sinks_message_size() -> None:
    """The sidecar cuts a client's chunk larger than the sink's snapshot_max_bytes into
    chunks of whole rows at the same point, numbered in order across the client's
    chunks; a consumer given nothing rebuilds the store."""
    with short_dir() as tmp:
        store = MemoryStore({("t", i, c): f"{i}-{c}-" + "x" * 40 for i in range(60)
                             for c in "ab"} | {("t", 99, "big"): b"y" * 2000})
        sink = _SmallMessages()
        sidecar = Sidecar(sink)
        sock = tmp / "agent.sock"
        thread = _serve(sidecar, sock)
        client = SidecarClient(str(sock), store)
        report = client.snapshot(chunk_rows=25)
        client.set("t", 1, "a", "after")
        client.flush()
        client.close()
        sidecar.stop()
        thread.join(30)
    chunks = sink.snapshot_chunks
    assert report["chunks"] == 3 and len(chunks) > 6
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert chunks[0].lo is None and chunks[-1].hi is None and chunks[-1].last
    for before, after in itertools.pairwise(chunks):
        assert after.lo == before.hi
    for chunk in chunks:
        rows = {(t, r) for t, r, _c, _v in chunk.cells()}
        assert chunk.data.nbytes <= 600 or rows == {("t", 99)}
    asm = Assembler()
    state = None
    for record in sink.records:
        for _changeset in asm.feed(record):
            state = asm.state
    assert state is not None and bits(state) == bits(store.snapshot())


def _sidecar_process(socket_path: Path, log_uri: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.cli", "sidecar", "--socket", str(socket_path),
         "--log", log_uri], cwd=ROOT, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stderr is not None
    banner = proc.stderr.readline()
    assert "listening on" in banner, banner
    return proc


def _journaled_start(socket_path: Path, store: MemoryStore, journal: str, n: int
                     ) -> dict[str, Any]:
    """A program's start: ``snapshot(journal=...)``, then writes, all flushed."""
    with SidecarClient(str(socket_path), store) as client:
        report = client.snapshot(chunk_rows=16, journal=journal)
        client.set("accounts", 100 + n, "balance", n)
        client.set("accounts", 1, "balance", -n)
        client.flush()
    return report


def test_a_journaled_sidecar_baseline_is_retaken_only_after_an_unclean_end() -> None:
    """``SidecarClient.snapshot(journal=...)`` at every start: after the sidecar's clean
    shutdown (SIGTERM) the journal says closed and the next start takes nothing; after
    a SIGKILL it says done and the next start takes a new baseline; a consumer from
    nothing then holds the store."""
    from agent import BaselineJournal

    with short_dir() as tmp:
        socket_path, log_uri, journal = tmp / "s", f"file://{tmp}/log", f"file://{tmp}/j"
        store = _store()
        state = lambda: BaselineJournal.at(journal).read()["state"]  # noqa: E731
        procs = [_sidecar_process(socket_path, log_uri)]
        first = procs[0]
        try:
            taken = _journaled_start(socket_path, store, journal, 1)
            assert not taken["recorded"] and taken["cells"] == 61
            assert state() == "done"
            first.send_signal(signal.SIGTERM)
            assert first.wait(60) == 0
            assert state() == "closed"
            second = _sidecar_process(socket_path, log_uri)
            procs.append(second)
            again = _journaled_start(socket_path, store, journal, 2)
            assert again["recorded"] and again["baseline"] == taken["baseline"]
            assert state() == "done"
            second.kill()  # SIGKILL: no clean close
            second.wait(60)
            assert state() == "done"
            third = _sidecar_process(socket_path, log_uri)
            procs.append(third)
            retaken = _journaled_start(socket_path, store, journal, 3)
            assert not retaken["recorded"] and retaken["baseline"] != taken["baseline"]
            third.send_signal(signal.SIGTERM)
            assert third.wait(60) == 0
            assert state() == "closed"
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                if proc.stderr is not None:
                    proc.stderr.close()
        snaps = list(Assembler().replay(read_log(log_uri)))
        assert bits(snaps[-1].state) == bits(store.snapshot())


def test_a_client_gone_with_a_batch_open_leaves_the_journal_for_a_retake() -> None:
    """A client that died between its store write and its report (its batch left open)
    may have written what the log lacks: the sidecar's clean close then leaves the
    journal ``done`` (the next start retakes), not ``closed``."""
    from agent import BaselineJournal

    with short_dir() as tmp:
        journal = f"file://{tmp}/j"
        sidecar = Sidecar(Wal3Sink("memory://sidecar-journal-orphan"))
        sock = tmp / "agent.sock"
        thread = _serve(sidecar, sock)
        with SidecarClient(str(sock), _store()) as client:
            assert not client.snapshot(chunk_rows=16, journal=journal)["recorded"]
        dying = Raw(sock)
        assert dying.open()
        dying.close()  # gone with its batch open
        sidecar.stop()
        thread.join(30)
        assert BaselineJournal.at(journal).read()["state"] == "done"  # type: ignore[index]


@pytest.mark.parametrize("lost", ["batch left open", "report refused"])
def test_a_write_the_log_may_lack_keeps_a_closed_journal_from_being_adopted(lost: str) -> None:
    """A client gone with a batch open (or whose report of writes was refused) BEFORE a
    later ``snapshot(journal=...)``: the journal says closed from the last clean run,
    but this sidecar's log may now lack a write, so a new baseline is taken (not the
    recorded one adopted) and its clean close leaves the journal ``done``."""
    from agent import BaselineJournal

    with short_dir() as tmp:
        journal, log = f"file://{tmp}/j", f"memory://sidecar-journal-lost-{lost[:5]}"
        store = _store()
        for run in range(2):
            sidecar = Sidecar(Wal3Sink(log))
            sock = tmp / f"agent-{run}.sock"
            thread = _serve(sidecar, sock)
            if run == 1:  # the client wrote the store, then its report never counted
                dying = Raw(sock)
                batch = dying.open()
                store.exchange("accounts", 7, "balance", 777)
                if lost == "report refused":
                    reply = dying.call(b'{"op": "events", "id": 9, "batch": "' +
                                       batch.encode() + b'", "events": [["accounts"]]}\n')
                    assert "error" in reply, reply
                    closed = dying.call({"op": "close", "id": 10, "batch": batch})
                    assert "error" not in closed, closed  # nothing left open
                dying.close()
            with structlog.testing.capture_logs() as logs, \
                    SidecarClient(str(sock), store) as client:
                report = client.snapshot(chunk_rows=16, journal=journal)
            assert report["recorded"] is False, (run, report)  # run 1: not adopted
            said = [e["event"] for e in logs]
            if run == 1:  # says why, without blaming the last run's clean close
                assert "cdc.baseline_journal_not_adopted" in said, said
                assert "cdc.baseline_retaken" not in said, said
            sidecar.stop()
            thread.join(30)
            state = BaselineJournal.at(journal).read()["state"]  # type: ignore[index]
            assert state == ("closed" if run == 0 else "done"), (run, state)
