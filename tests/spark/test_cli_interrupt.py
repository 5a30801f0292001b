"""Ctrl-C during ``cdc-agent spark verify``: status 130, a line, and a session that still
works; not the Py4JError and logged tracebacks of PySpark's own SIGINT handler."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
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
