"""The command line's entry point: version, usage errors."""

from __future__ import annotations

import subprocess
import sys


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], capture_output=True,
                          text=True, timeout=60)


def test_version_is_printed() -> None:
    out = run("--version")
    assert out.returncode == 0 and out.stdout.startswith("cdc-agent ")


def test_no_command_or_an_unknown_one_is_a_usage_error() -> None:
    """Exit status 2 and a usage line naming the commands, not a traceback."""
    for args in ((), ("frobnicate",)):
        out = run(*args)
        assert out.returncode == 2
        assert "usage: cdc-agent" in out.stderr and "Traceback" not in out.stderr


def test_demo_refuses_nonsense_sizes() -> None:
    out = run("demo", "--threads", "0")
    assert out.returncode == 2 and "at least 1" in out.stderr
