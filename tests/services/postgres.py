"""Session fixture for a real PostgreSQL server, started from the Debian binaries.

``scripts/install-postgres.sh`` makes sure ``initdb`` and ``postgres`` are installed.
The fixture runs ``initdb`` in a fresh temporary folder, starts the postmaster on a
free loopback port (``listen_addresses=127.0.0.1``, its unix socket in the same
folder), waits until it accepts connections, and stops it by PID (SIGINT: fast
shutdown, then SIGKILL if it lingers) at the end of the session.

PostgreSQL refuses to run as root; when the tests run as root (CI), the server runs
as the ``postgres`` system user (created if missing) and the folder is handed to it.

Fixtures:

- ``pg_server``: the running ``PostgresServer`` (session scope).
- ``pg_dsn``: a DSN to a database created once for the session.
- ``pg_database``: a factory; ``pg_database()`` creates a fresh, empty database and
  returns its DSN (give a name to choose it).

``postgres_server()`` is the same as a context manager, for the benchmarks.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.services._proc import free_port, wait_for_port

__all__ = ["PostgresServer", "find_postgres_bin", "postgres_server"]

_SERVICE_USER = "postgres"
_START_TIMEOUT = 90.0


def find_postgres_bin() -> Path:
    """The folder holding ``initdb`` and ``postgres`` (the newest installed version)."""
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit()
        else 0,
    )
    if candidates:
        return Path(candidates[-1]).parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(os.path.realpath(initdb)).parent
    raise RuntimeError(
        "PostgreSQL server binaries (initdb, postgres) not found; "
        "run scripts/install-postgres.sh (it installs the Debian 'postgresql' package)"
    )


def _service_user() -> str | None:
    """The user the server runs as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(_SERVICE_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
             _SERVICE_USER],
            check=True, stdin=subprocess.DEVNULL, capture_output=True,
        )
    return _SERVICE_USER


class PostgresServer:
    """One throwaway PostgreSQL cluster: ``initdb``, ``postgres``, stop by PID."""

    def __init__(self) -> None:
        self.bin = find_postgres_bin()
        self.user = _service_user()
        # Not under pytest's tmp_path: that one is private to root (0700) and the server
        # may run as another user. mkdtemp is 0700 too, so hand it over.
        self.dir = Path(tempfile.mkdtemp(prefix="cdc-pg-"))
        self.data = self.dir / "data"
        self.log_path = self.dir / "postgres.log"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._names = itertools.count(1)
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)

    @property
    def superuser(self) -> str:
        return "postgres"

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user={self.superuser} dbname={dbname}"

    def _popen_user(self) -> dict[str, object]:
        if self.user is None:
            return {}
        entry = pwd.getpwnam(self.user)
        return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}

    def start(self) -> None:
        """Step 1: initdb. Step 2: start the postmaster. Step 3: wait for a real login."""
        # Step 1.
        result = subprocess.run(
            [str(self.bin / "initdb"), "-D", str(self.data), "-U", self.superuser,
             "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-instructions"],
            stdin=subprocess.DEVNULL, capture_output=True, cwd=self.dir,
            **self._popen_user(),  # type: ignore[call-overload]
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"initdb failed with {result.returncode}:\n"
                f"{result.stdout.decode(errors='replace')}{result.stderr.decode(errors='replace')}"
            )
        # Step 2.
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps it; closed below
        try:
            self.proc = subprocess.Popen(
                [str(self.bin / "postgres"), "-D", str(self.data), "-p", str(self.port),
                 "-c", "listen_addresses=127.0.0.1",
                 "-c", f"unix_socket_directories={self.dir}",
                 "-c", "max_connections=200",
                 "-c", "logging_collector=off"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.dir, start_new_session=True,
                **self._popen_user(),  # type: ignore[call-overload]
            )
        finally:
            log.close()
        # Step 3.
        try:
            wait_for_port(self.port, _START_TIMEOUT, self.proc)
            self._wait_for_login()
        except Exception as exc:
            self.stop()
            raise RuntimeError(f"PostgreSQL did not start:\n{self.tail()}") from exc

    def _wait_for_login(self) -> None:
        import psycopg

        deadline = time.monotonic() + _START_TIMEOUT
        while True:
            try:
                with psycopg.connect(self.dsn(), connect_timeout=5) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline or (self.proc and self.proc.poll() is not None):
                    raise
                time.sleep(0.1)

    def create_database(self, name: str | None = None) -> str:
        """Create an empty database and return its DSN."""
        import psycopg
        from psycopg import sql

        if name is None:
            name = f"test_{next(self._names)}"
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.dsn(name)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGINT the postmaster (fast shutdown), SIGKILL its group if it lingers."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGINT)
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout)
            except ProcessLookupError:
                pass

    def cleanup(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


@contextlib.contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    """A running throwaway server, stopped and removed on exit."""
    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.stop()
        server.cleanup()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    """The session's PostgreSQL server; fails loudly if it cannot start."""
    with postgres_server() as server:
        yield server


@pytest.fixture(scope="session")
def pg_dsn(pg_server: PostgresServer) -> str:
    """A DSN to a database created once for the whole session."""
    return pg_server.create_database("cdc_session")


@pytest.fixture
def pg_database(pg_server: PostgresServer) -> Callable[..., str]:
    """A factory: ``pg_database(name=None)`` creates a fresh empty database, returns its DSN."""
    return pg_server.create_database
