"""The ``cdc-agent`` command line: one subcommand module per area.

Each module in ``_COMMAND_MODULES`` defines ``register(subparsers)``, which adds its
subcommands with ``set_defaults(run=callable)``; ``run(args)`` returns the exit status.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys
from collections.abc import Sequence

__all__ = ["main"]

_COMMAND_MODULES = (
    "agent._cli_demo",  # cdc-agent demo
    "agent._cli_log",  # cdc-agent log inspect|scrub|verify|gc (wal3)
    "agent._cli_tail",  # cdc-agent tail kafka (Kafka)
    "agent._cli_sidecar",  # cdc-agent sidecar
    "agent._cli_health",  # cdc-agent health (probes a sidecar)
    "agent._cli_spark",  # cdc-agent spark snapshot|changesets|verify (Spark)
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    status: int = args.run(args)
    return status


if __name__ == "__main__":
    sys.exit(main())
