"""Sidecar capture against in-process capture: ``python3 -m bench.sidecar``.

The baseline is an ``Agent`` in this process on a MemoryStore; the contender is a
``SidecarClient`` on the same kind of store, reporting to ``cdc-agent sidecar`` running
as a separate process (memory:// log), so the two do not share a GIL. Both run the same
writes: batches of ``--events`` sets, then single unscoped writes (automatic batches),
from one thread and from four. Every write costs the sidecar client at least one round
trip over the Unix socket, so expect a fraction of in-process speed.

Then durable acknowledgements: a second sidecar ships to a wal3 log in a local folder
(``file://``), and the same batches are closed durably (each close answered once its
records are durable in the log) against plain closes, from one thread and from eight
(concurrent durable closes share a flush).
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent import Agent, MemoryStore
from agent.sidecar import SidecarClient
from bench._util import best_of, report
from sinks import MemorySink


def _batches(api: Any, batches: int, per_batch: int, thread: int) -> int:
    for b in range(batches):
        with api.batch():
            for i in range(per_batch):
                api.set("t", thread * 1_000_000 + b, f"c{i % 8}", i)
    return batches * per_batch


def _singles(api: Any, writes: int, thread: int) -> int:
    for i in range(writes):
        api.set("t", thread, f"c{i % 8}", i)
    return writes


def _threaded(threads: int, work: Callable[[int], int]) -> int:
    counts = [0] * threads

    def run(n: int) -> None:
        counts[n] = work(n)

    workers = [threading.Thread(target=run, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(counts)


def _runner(threads: int, work: Callable[[int], int]) -> Callable[[], int]:
    return lambda: _threaded(threads, work)


def _start_sidecar(socket_path: Path, log: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.cli", "sidecar", "--socket", str(socket_path),
         "--log", log], stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    assert proc.stderr is not None
    banner = proc.stderr.readline()
    if "listening" not in banner:
        raise SystemExit(f"the sidecar did not start: {banner}")
    return proc


def _stop_sidecar(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)
    if proc.stderr is not None:
        proc.stderr.close()


def _durable_acks(folder: Path, args: argparse.Namespace) -> None:
    proc = _start_sidecar(folder / "d", f"file://{folder}/log")
    try:
        plain = SidecarClient(str(folder / "d"), MemoryStore())
        durable = SidecarClient(str(folder / "d"), MemoryStore(), durable=True)
        print(f"durable vs plain closes, wal3 log in a local folder: {args.events}-set "
              f"batches, best of {args.runs}")
        for threads in (1, 8):
            batches = max(20, args.batches // threads)
            rates = {}
            for name, api in (("plain", plain), ("durable", durable)):
                rates[name] = best_of(args.runs, _runner(
                    threads, lambda n, api=api, b=batches: _batches(api, b, args.events, n)))
            report(f"{threads} thread(s), durable closes", rates["durable"], "plain",
                   rates["plain"], "events/s", "informational: the price of durability")
        plain.close()
        durable.close()
    finally:
        _stop_sidecar(proc)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=400, help="batches per thread")
    parser.add_argument("--events", type=int, default=10, help="sets per batch")
    parser.add_argument("--runs", type=int, default=3, help="best of this many runs")
    parser.add_argument("--only", choices=["capture", "durable"], default=None,
                        help="run one part only")
    args = parser.parse_args(argv)

    folder = Path(tempfile.mkdtemp(prefix="cdc-bench-sc-", dir="/tmp"))
    try:
        if args.only != "durable":
            _capture(folder, args)
        if args.only != "capture":
            _durable_acks(folder, args)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _capture(folder: Path, args: argparse.Namespace) -> None:
    socket_path = folder / "s"
    proc = _start_sidecar(socket_path, "memory://")
    try:
        agent = Agent(MemoryStore(), MemorySink())
        client = SidecarClient(str(socket_path), MemoryStore())
        held = SidecarClient(str(socket_path), MemoryStore(), report="batch")
        print(f"sidecar vs in-process Agent: {args.batches} batches x {args.events} sets "
              f"per thread, best of {args.runs}")
        for threads in (1, 4):
            rates = {}
            for name, api in (("agent", agent), ("sidecar", client), ("held", held)):
                rates[name, "batches"] = best_of(args.runs, _runner(
                    threads, lambda n, api=api: _batches(api, args.batches, args.events, n)))
                if name != "held":  # report="batch" changes nothing for a single write
                    rates[name, "singles"] = best_of(args.runs, _runner(
                        threads, lambda n, api=api: _singles(api, args.batches, n)))
            report(f"{threads} thread(s), {args.events}-set batches", rates["sidecar", "batches"],
                   "agent", rates["agent", "batches"], "events/s", ">= 0.3")
            report(f"{threads} thread(s), {args.events}-set batches, report=batch",
                   rates["held", "batches"], "agent", rates["agent", "batches"], "events/s",
                   ">= 0.3")
            report(f"{threads} thread(s), unscoped single sets", rates["sidecar", "singles"],
                   "agent", rates["agent", "singles"], "events/s", "informational")
        client.close()
        held.close()
        agent.close()
    finally:
        _stop_sidecar(proc)


if __name__ == "__main__":
    main()
