"""Ctrl-C during ``cdc-agent spark verify``: status 130, a line, and a session that still
works; not the Py4JError and logged tracebacks of PySpark's own SIGINT handler. Ctrl-C
while Spark starts leaves no JVM behind."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import agent.cli
from tests.spark._logs import Logged

pytestmark = [
    pytest.mark.spark,
    # (py4j's connection of the thread that cancels the jobs is closed by the collector)
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


def _interrupt_once_a_job_runs(spark: Any, done: threading.Event,
                               sent: threading.Event) -> None:
    """SIGINT to this process while a Spark job runs, so the main thread is blocked in a
    call to the JVM (the case PySpark's handler gets wrong)."""
    tracker = spark.sparkContext.statusTracker()
    while not done.is_set():
        if tracker.getActiveJobsIds():
            os.kill(os.getpid(), signal.SIGINT)
            sent.set()
            return
        time.sleep(0.01)


def test_ctrl_c_during_a_replay_cancels_its_jobs_and_exits_130(
        spark: Any, small: Logged, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    # (the session's own threads must not make main() end the test process)
    monkeypatch.setattr(agent.cli, "_exit_now_if_threads_linger", lambda status: None)
    late = threading.Event()  # a SIGINT outside the command must not end the test run

    def outside(signum: int, frame: Any) -> None:
        late.set()

    previous = signal.signal(signal.SIGINT, outside)
    done, sent = threading.Event(), threading.Event()
    sender = threading.Thread(target=_interrupt_once_a_job_runs, args=(spark, done, sent))
    sender.start()
    try:
        with caplog.at_level(logging.ERROR):
            status = agent.cli.main(["spark", "verify", small.uri])
    finally:
        done.set()
        sender.join()
        put_back = signal.signal(signal.SIGINT, previous)
    assert sent.is_set() and not late.is_set()
    assert status == 130
    err = capsys.readouterr().err
    assert "cdc-agent spark: interrupted" in err and "Py4J" not in err
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert put_back is outside  # the command put back the handler it found
    assert spark.range(5).count() == 5  # the shared session still answers


def _processes_with(marker: str) -> list[int]:
    """The processes whose environment holds ``marker`` (the command and its JVM)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if f"CDC_AGENT_TEST_RUN={marker}".encode() in environ.read_bytes():
                found.append(int(environ.parent.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def test_ctrl_c_while_spark_starts_leaves_no_jvm_behind(small: Logged,
                                                       tmp_path: Path) -> None:
    """Interrupted inside PySpark's launch, the JVM used to outlive the command (its
    gateway thread kept it up after its main thread failed): now the command waits for
    the JVM to be up, stops it and exits 130."""
    marker = uuid.uuid4().hex
    env = {**os.environ, "CDC_AGENT_TEST_RUN": marker}
    env.pop("SPARK_LOCAL_IP", None)
    said = tmp_path / "stderr"  # (a file: a JVM left behind would hold a pipe open)
    with said.open("w") as err_file, subprocess.Popen(
            [sys.executable, "-m", "agent.cli", "spark", "verify", small.uri,
             "--master", "local[1]"], env=env, stdout=subprocess.DEVNULL, stderr=err_file,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) as proc:
        try:
            deadline = time.monotonic() + 60
            while "starting Spark" not in said.read_text() and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.5)  # inside PySpark's launch of the JVM (it takes several seconds)
            proc.send_signal(signal.SIGINT)
            status = proc.wait(120)
            deadline = time.monotonic() + 15  # a JVM told to stop takes a moment
            while _processes_with(marker) and time.monotonic() < deadline:
                time.sleep(0.2)
            left = _processes_with(marker)
        finally:
            proc.kill()
            for pid in _processes_with(marker):  # (a failed run leaves nothing either)
                os.kill(pid, signal.SIGKILL)
    err = said.read_text()
    assert not left, f"processes left running: {left}"
    assert status == 130, err
    assert "stopping once Spark is up" in err and "Traceback" not in err
