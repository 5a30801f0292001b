"""``cdc-agent sidecar``: serve the capture core on a Unix socket (docs/sidecar.md).

Applications write their store themselves and report each write over the socket; the
sidecar sequences the events and ships them to the sink. SIGTERM or SIGINT shut it down
gracefully: no new batch, a grace period for open ones, then flush, close the sink and
remove the socket file.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from typing import Any

from agent._cli_sink import add_sink_arguments, not_durable_reason, sink_config
from agent._logging import configure_logging, say

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "sidecar", help="serve write capture to other processes over a Unix socket",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--socket", metavar="PATH", required=True,
                        help="the Unix socket to listen on (a stale one is replaced)")
    add_sink_arguments(parser)
    parser.add_argument("--grace", type=float, default=5.0, metavar="SECONDS",
                        help="on shutdown, how long open batches may take to close before "
                             "the sidecar closes them (default 5)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    parser.set_defaults(run=run, log_json_lines=True)


def run(args: argparse.Namespace) -> int:
    from agent._agent import QuiescenceTimeout
    from agent._shipper import ShippingFailed
    from agent.sidecar import Sidecar, SidecarAddressInUse

    configure_logging(args.verbose)
    if args.grace < 0:
        say("cdc.sidecar_usage", "cdc-agent sidecar: --grace must not be negative",
            level=logging.ERROR)
        return 2
    config = sink_config(args, "sidecar")  # errors: one line and exit 2 (agent/cli.py)
    destination, not_durable = config.describe_sink(), not_durable_reason(config)
    sidecar = Sidecar(config.open_sink(), grace_period=args.grace, **config.agent)

    def started() -> None:
        say("cdc.sidecar_ready", f"cdc-agent sidecar: listening on {args.socket}, log at "
            f"{destination}", socket=args.socket, log=destination)
        if not_durable:
            say("cdc.sidecar_log_not_durable", f"cdc-agent sidecar: WARNING: {not_durable}; "
                "give --log or [sink] a lasting place (docs/configuration.md)",
                level=logging.WARNING, log=destination)

    try:
        asyncio.run(sidecar.serve(args.socket, started=started, handle_signals=True))
    except SidecarAddressInUse as exc:
        sidecar.close()
        say("cdc.sidecar_failed", f"cdc-agent sidecar: {exc}", level=logging.ERROR)
        return 2
    except (ShippingFailed, QuiescenceTimeout, TimeoutError) as exc:
        say("cdc.sidecar_log_incomplete", f"cdc-agent sidecar: the log is incomplete: {exc}",
            level=logging.ERROR)
        return 1
    say("cdc.sidecar_exited", f"cdc-agent sidecar: stopped after {sidecar.stats['batches']} "
        f"batches, {sidecar.stats['events']} events", **sidecar.stats)
    return 0
