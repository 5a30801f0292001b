"""``Progress``: a line on stderr every few seconds while long command-line work runs."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """``with Progress("verifying", lambda: "12 of 40 snapshots"):`` prints
    ``  ... verifying: 12 of 40 snapshots (4.0 s)`` every ``every`` seconds until the
    block ends; work shorter than ``every`` prints nothing."""

    def __init__(self, what: str, status: Callable[[], str], *, every: float = 2.0,
                 out: TextIO | None = None) -> None:
        self._what = what
        self._status = status
        self._every = every
        self._out = out
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._report, name=f"progress-{what}",
                                        daemon=True)

    def __enter__(self) -> Progress:
        self._started = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._done.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=1.0)

    def _report(self) -> None:
        while not self._done.wait(self._every):
            out = self._out or sys.stderr
            elapsed = time.perf_counter() - self._started
            print(f"  ... {self._what}: {self._status()} ({elapsed:.1f} s)", file=out,
                  flush=True)
