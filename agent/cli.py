"""The ``cdc-agent`` command line: one subcommand module per area.

Each module in ``_COMMAND_MODULES`` defines ``register(subparsers)``, which adds its
subcommands with ``set_defaults(run=callable)``; ``run(args)`` returns the exit status.
A command may raise instead: ``main`` turns a configuration error, a missing extra, an
unreachable server or an OS error into one line on stderr and exit status 2, and Ctrl-C
into exit status 130, never a traceback (``-v`` adds the traceback to the line).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import importlib.metadata
import logging
import os
import sys
import threading
import traceback
from collections.abc import Sequence
from typing import Any

from sinks import redact

__all__ = ["main"]

_COMMAND_MODULES = (
    "agent._cli_demo",  # cdc-agent demo
    "agent._cli_log",  # cdc-agent log inspect|scrub|verify|gc (wal3)
    "agent._cli_tail",  # cdc-agent tail kafka|wal3
    "agent._cli_sidecar",  # cdc-agent sidecar
    "agent._cli_snapshot",  # cdc-agent snapshot (baseline of a configured store)
    "agent._cli_health",  # cdc-agent health (probes a sidecar)
    "agent._cli_spark",  # cdc-agent spark snapshot|changesets|verify (Spark)
)


def build_parser() -> argparse.ArgumentParser:
    parser = PlainParser(
        prog="cdc-agent",
        description="Change-data capture for stores without transactions.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def _version() -> str:
    try:
        return importlib.metadata.version("cdc-agent")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
        return "(not installed)"


class PlainHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help as plain text: the docstrings' reStructuredText literals (````x````) lose
    their backquotes; paragraphs and indented examples keep their lines."""

    def _format_text(self, text: str) -> str:
        return super()._format_text(text.replace("``", ""))

    def _expand_help(self, action: argparse.Action) -> str:
        return super()._expand_help(action).replace("``", "")


class PlainParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose help (and every subcommand's) is ``PlainHelpFormatter``
    text; subparsers inherit the class."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["formatter_class"] = PlainHelpFormatter
        super().__init__(*args, **kwargs)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status: int = args.run(args)
    except KeyboardInterrupt:
        _say(args, "interrupted")
        _exit_now_if_threads_linger(130)
        return 130
    except Exception as exc:  # the one place errors become a line
        _say(args, failure_line(exc))
        if getattr(args, "verbose", False):
            traceback.print_exception(exc, file=sys.stderr)
        return 2
    return status


def command_name(args: argparse.Namespace) -> str:
    """``cdc-agent log verify``: the command ``args`` ran, for messages."""
    words = [getattr(args, name, None) for name in ("command", "log_command", "source")]
    return " ".join(["cdc-agent", *(w for w in words if isinstance(w, str))])


def _say(args: argparse.Namespace, line: str) -> None:
    text = redact(f"{command_name(args)}: {line}")
    if getattr(args, "log_json_lines", False):  # the sidecar: every line a log event
        from agent._logging import say

        say("cdc.command_failed", text, level=logging.ERROR)
    else:
        print(text, file=sys.stderr, flush=True)


def _exit_now_if_threads_linger(status: int) -> None:
    """Worker threads (demo writers) would keep the process alive after Ctrl-C."""
    if any(t.is_alive() and not t.daemon for t in threading.enumerate()
           if t is not threading.main_thread()):
        sys.stdout.flush()
        os._exit(status)


_EXTRAS = {"boto3": "s3", "botocore": "s3", "confluent_kafka": "kafka", "psycopg": "postgres",
           "psycopg_pool": "postgres", "pyspark": "spark"}
_ERRNO_HINTS = {
    errno.ENOENT: "check that the path exists",
    errno.EACCES: "check the permissions, or run as a user that may use it",
    errno.EPERM: "check the permissions, or run as a user that may use it",
    errno.ECONNREFUSED: "is the server running, and is the address right?",
    errno.EADDRINUSE: "another process uses that address; stop it or choose another",
    errno.ENAMETOOLONG: "use a shorter path (a Unix socket path has at most 107 bytes)",
    errno.ENOSPC: "free some space on that filesystem",
    errno.EROFS: "the filesystem is read-only; choose a writable place",
    errno.ENOTDIR: "a part of the path is not a folder",
}


def failure_line(exc: BaseException) -> str:
    """One line naming what failed and what to do about it."""
    if isinstance(exc, ModuleNotFoundError) and "pip install" not in str(exc):
        root = (exc.name or "").split(".")[0]
        extra = _EXTRAS.get(root)
        fix = (f"pip install 'cdc-agent[{extra}]'" if extra else "install it")
        return f"the Python package {root or exc.name!r} is not installed; {fix}"
    if isinstance(exc, ImportError):
        return str(exc)
    if isinstance(exc, OSError) and exc.errno is not None:
        what = exc.strerror or str(exc)
        where = f" ({exc.filename})" if exc.filename else ""
        hint = _ERRNO_HINTS.get(exc.errno)
        return f"{what}{where}" + (f"; {hint}" if hint else "")
    text = str(exc) or type(exc).__name__
    if type(exc).__module__.startswith("psycopg") and type(exc).__name__ == "OperationalError":
        return (f"cannot use PostgreSQL: {text.splitlines()[0]}; check the DSN (host, port, "
                "dbname, user) and that the server runs")
    if isinstance(exc, (ValueError, LookupError)) or type(exc).__module__.startswith(
            ("agent", "sinks", "replay", "sequencer")):
        return text.splitlines()[0] if text.strip() else text
    return f"{type(exc).__name__}: {text.splitlines()[0] if text.strip() else text} " \
           "(run with -v for the traceback)"


if __name__ == "__main__":
    sys.exit(main())
