"""Running a snippet of Python in a fresh interpreter: for tests of code that may crash
the process (a segfault must fail the test, not end the run) or that need a clean
import state."""

from __future__ import annotations

import subprocess
import sys


def python_output(code: str, *, timeout: float = 60) -> str:
    """Run ``code`` with this interpreter; assert it exited 0; return its stdout, stripped."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr[-2000:])
    return done.stdout.strip()
