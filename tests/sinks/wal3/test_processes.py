"""Several writer processes on one log on the local filesystem, and SIGKILLed writers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from sinks.objstore import LocalStore
from sinks.wal3 import LogReader, LogWriter

ROOT = Path(__file__).resolve().parents[3]


def spawn(uri: str, name: str, count: int, chunk: int,
          endpoint: str | None = None) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "tests.sinks.wal3._writer_proc", uri, name, str(count),
            str(chunk)]
    if endpoint:
        argv.append(endpoint)
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def parse(output: str) -> tuple[dict[str, int], list[str]]:
    acked: dict[str, int] = {}
    failed: list[str] = []
    for line in output.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "ack":
            acked[parts[2]] = int(parts[1])
        elif parts and parts[0] == "fail":
            failed.append(parts[1])
    return acked, failed


def check_log(store: object, acked: dict[str, int]) -> list[bytes]:
    """Scrub passes, offsets are contiguous, nothing twice, every ack at its offset."""
    reader = LogReader(store)  # type: ignore[arg-type]
    reader.scrub()
    records = list(reader.records())
    assert [r.offset for r in records] == list(range(1, len(records) + 1))
    counts = Counter(r.body for r in records)
    assert not [b for b, n in counts.items() if n > 1], "records appear twice"
    by_offset = {r.offset: r.body.decode() for r in records}
    for body, offset in acked.items():
        assert by_offset.get(offset) == body, f"acknowledged {body} at {offset} lost"
    return [r.body for r in records]


def run_contention(uri: str, store: object, writers: int, count: int,
                   endpoint: str | None = None) -> None:
    procs = [spawn(uri, f"w{i}", count, 5, endpoint) for i in range(writers)]
    acked: dict[str, int] = {}
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-2000:]
        assert out.rstrip().endswith("done")
        got, _ = parse(out)
        acked.update(got)
    assert len(set(acked.values())) == len(acked), "two acks share an offset"
    bodies = check_log(store, acked)
    assert len(acked) >= writers * count // 2
    assert len(bodies) >= len(acked)


@pytest.mark.slow
@pytest.mark.parametrize("writers", [2, 4])
def test_writer_processes_contend_on_the_local_filesystem(tmp_path: Path, writers: int) -> None:
    """2 and 4 processes append to one log at once (If-Match on the manifest): every
    acknowledged append is read back exactly once at its offset; scrub passes."""
    root = tmp_path / "log"
    store = LocalStore(root)
    LogWriter.initialize(store)
    run_contention(f"file://{root}", store, writers, 120 if writers == 2 else 60)


@pytest.mark.slow
def test_sigkilled_writer_is_recovered(tmp_path: Path) -> None:
    """SIGKILL a writer mid-stream; the next writer recovers with no manual step and
    every append the dead one acknowledged is still there, once."""
    root = tmp_path / "log"
    store = LocalStore(root)
    LogWriter.initialize(store)
    proc = spawn(f"file://{root}", "victim", 100_000, 20)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if len(lines) >= 300:
            break
    os.kill(proc.pid, signal.SIGKILL)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    complete = "".join(lines) + rest.rsplit("\n", 1)[0]
    acked, _ = parse(complete)
    assert len(acked) >= 300
    with LogWriter.open(store) as writer:
        after = writer.append(b"after-the-kill")
    bodies = check_log(store, acked)
    assert bodies[-1] == b"after-the-kill" and after.offset == len(bodies)
