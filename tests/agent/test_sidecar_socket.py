"""The sidecar's socket file: its mode, and clear errors for paths it cannot use
(issue 11, item 7)."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.sidecar import SidecarAddressInUse, SidecarSocketError
from tests.agent._sidecar import Served, short_dir

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def folder() -> Iterator[Path]:
    with short_dir() as path:
        yield path


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_the_socket_gets_660_by_default_whatever_the_umask(folder: Path) -> None:
    old = os.umask(0o022)  # the umask that used to give clients of the group EACCES
    try:
        served = Served(folder / "s")
    finally:
        os.umask(old)
    try:
        assert _mode(folder / "s") == 0o660
    finally:
        served.stop()


@pytest.mark.parametrize("mode", [0o600, 0o666])
def test_socket_mode_is_applied(folder: Path, mode: int) -> None:
    old = os.umask(0o077)
    try:
        served = Served(folder / "s", socket_mode=mode)
    finally:
        os.umask(old)
    try:
        assert _mode(folder / "s") == mode
    finally:
        served.stop()


def _start_error(path: Path) -> BaseException:
    with pytest.raises(RuntimeError, match="did not start") as info:
        Served(path)
    cause = info.value.__cause__
    assert isinstance(cause, SidecarSocketError), repr(cause)
    return cause


def test_bad_socket_paths_get_clear_errors(folder: Path) -> None:
    assert "does not exist; create it" in str(_start_error(folder / "missing" / "s"))
    assert "at most 107" in str(_start_error(folder / ("x" * 120)))
    (folder / "file").write_text("")
    error = _start_error(folder / "file")
    assert isinstance(error, SidecarAddressInUse) and "not a socket" in str(error)
    assert "cannot use the socket path" in str(_start_error(folder / "file" / "s"))
    if os.geteuid() != 0:  # root may write anywhere: only the others can be refused
        locked = folder / "locked"
        locked.mkdir(mode=0o500)
        assert "no permission" in str(_start_error(locked / "s"))


@pytest.mark.parametrize(("extra", "message"), [
    (["--socket", "/nonexistent-dir/s"], "folder /nonexistent-dir does not exist"),
    (["--socket", "/tmp/" + "y" * 120], "at most 107"),
    (["--socket-mode", "9x"], "not an octal mode"),
    (["--socket-mode", "1777"], "not a permission mode"),
])
def test_cli_says_what_is_wrong_with_the_socket(extra: list[str], message: str,
                                                folder: Path) -> None:
    args = ["--socket", str(folder / "s"), *extra] if extra[0] != "--socket" else extra
    proc = subprocess.run([sys.executable, "-m", "agent.cli", "sidecar", "--log",
                           "memory://", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_socket_mode(folder: Path) -> None:
    path = folder / "s"
    proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "sidecar", "--log",
                             "memory://", "--socket", str(path), "--socket-mode", "0640"],
                            cwd=ROOT, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            text=True)
    try:
        assert proc.stderr is not None
        assert "listening" in proc.stderr.readline()
        assert _mode(path) == 0o640
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(path))
    finally:
        proc.terminate()
        assert proc.wait(60) == 0
        if proc.stderr is not None:
            proc.stderr.close()
