"""``cdc-agent snapshot --config FILE``: record a baseline of a configured store.

Reads every cell of the ``[store]`` in chunks and ships them as snapshot records to the
``[sink]``, under an agent of its own. Run it while no other process writes the store
(its agent holds back only its own writers); a program that writes the store while the
baseline is taken calls ``Agent.snapshot()`` (or ``SidecarClient.snapshot()``) instead.

With ``--journal URI`` (an object store: ``file:///dir``, ``s3://...``) a rerun after a
baseline cut short (the command died) takes a new one from chunk 0, and a rerun after
one that finished takes none and prints it (``agent._baseline_journal``).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from agent._logging import configure_logging

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add ``cdc-agent snapshot`` to the parser."""
    parser = subparsers.add_parser(
        "snapshot", help="record a baseline snapshot of a configured store in its sink",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, metavar="FILE",
                        help="a configuration file with [store] and [sink] (see config/)")
    parser.add_argument("--chunk-rows", type=int, default=10_000, metavar="N",
                        help="rows read per chunk (writers wait for one chunk at most)")
    parser.add_argument("--journal", metavar="URI",
                        help="an object store (file:///dir, s3://...) recording the "
                        "baseline: a rerun retakes a cut one, skips a finished one")
    parser.add_argument("-v", "--verbose", action="store_true", help="log details to stderr")
    parser.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from agent._agent import Agent
    from agent._config import ConfigError, load_config

    configure_logging(args.verbose)
    if args.chunk_rows < 1:
        print(f"cdc-agent snapshot: --chunk-rows must be at least 1, not {args.chunk_rows}",
              file=sys.stderr)
        return 2
    try:
        config = load_config(args.config)
        store = config.open_store()
        sink = config.open_sink()
    except (ConfigError, OSError, ValueError) as exc:
        print(f"cdc-agent snapshot: {exc}", file=sys.stderr)
        return 2
    started = time.perf_counter()

    def progress(step: Any) -> None:
        print(f"  ... chunk {step.chunks:,}: {step.cells:,} cells "
              f"({time.perf_counter() - started:.1f} s)", file=sys.stderr)

    agent = Agent(store, sink, **config.agent)
    try:
        report = agent.snapshot(chunk_rows=args.chunk_rows, progress=progress,
                                journal=args.journal)
    except Exception as exc:  # the store or the sink failed: say which, exit 1
        print(f"cdc-agent snapshot: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        agent.close()
        close = getattr(store, "close", None)
        if close is not None:
            close()
    if report.domain_id != agent.domain_id:
        print(f"already recorded  (journal {args.journal}: no baseline taken)")
    print(f"domain            {report.domain_id:016x}")
    print(f"baseline          {report.baseline_id:016x}")
    print(f"chunks            {report.chunks:,}")
    print(f"cells             {report.cells:,}")
    print(f"setsum            {report.setsum}")
    print(f"seconds           {report.elapsed:.2f}")
    return 0
