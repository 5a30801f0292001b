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
    parser.add_argument("--socket-mode", type=_octal_mode, default=None, metavar="MODE",
                        help="permissions of the socket file, in octal (default 660: the "
                             "sidecar's user and group may connect; 666: every user)")
    parser.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                        help="serve Prometheus metrics over HTTP on this port (GET "
                             "/metrics; 0 picks a free one); needs the metrics extra")
    parser.add_argument("--metrics-address", default="127.0.0.1", metavar="ADDRESS",
                        help="the address the metrics server listens on (default "
                             "127.0.0.1: this host only; 0.0.0.0 for every interface)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    parser.set_defaults(run=run, log_json_lines=True)


def _octal_mode(text: str) -> int:
    try:
        mode = int(text.removeprefix("0o"), 8)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an octal mode such as 660"
                                         ) from None
    if not 0 <= mode <= 0o777:
        raise argparse.ArgumentTypeError(f"{text!r} is not a permission mode (000 to 777)")
    return mode


def run(args: argparse.Namespace) -> int:
    from agent.sidecar import Sidecar
    from agent.sidecar._server import SOCKET_MODE

    configure_logging(args.verbose)
    if args.grace < 0:
        say("cdc.sidecar_usage", "cdc-agent sidecar: --grace must not be negative",
            level=logging.ERROR)
        return 2
    config = sink_config(args, "sidecar")  # errors: one line and exit 2 (agent/cli.py)
    destination, not_durable = config.describe_sink(), not_durable_reason(config)
    options: dict[str, Any] = dict(config.agent)
    metrics_server = None
    if args.metrics_port is not None:
        # Before the sink opens: a metrics problem leaves nothing to close.
        try:
            from agent._metrics import CaptureMetrics, serve_metrics

            options["metrics"] = CaptureMetrics()
            metrics_server = serve_metrics(options["metrics"], args.metrics_port,
                                           args.metrics_address)
        except ImportError as exc:
            say("cdc.sidecar_failed", f"cdc-agent sidecar: {exc}", level=logging.ERROR)
            return 2
        except OSError as exc:
            say("cdc.sidecar_failed", f"cdc-agent sidecar: cannot serve metrics on "
                f"{args.metrics_address}:{args.metrics_port}: {exc.strerror or exc}; choose "
                "another --metrics-port or --metrics-address", level=logging.ERROR)
            return 2
    try:
        sidecar = Sidecar(config.open_sink(), grace_period=args.grace, **options)

        def started() -> None:
            where = ("" if metrics_server is None else f", metrics at http://"
                     f"{metrics_server.address}:{metrics_server.port}/metrics")
            say("cdc.sidecar_ready", f"cdc-agent sidecar: listening on {args.socket}, log at "
                f"{destination}{where}", socket=args.socket, log=destination)
            if not_durable:
                say("cdc.sidecar_log_not_durable", f"cdc-agent sidecar: WARNING: "
                    f"{not_durable}; give --log or [sink] a lasting place "
                    "(docs/configuration.md)", level=logging.WARNING, log=destination)

        return _serve(args, sidecar, started, SOCKET_MODE)
    finally:
        if metrics_server is not None:
            metrics_server.stop()


def _serve(args: argparse.Namespace, sidecar: Any, started: Any, default_mode: int) -> int:
    from agent._agent import QuiescenceTimeout
    from agent._shipper import ShippingFailed
    from agent.sidecar import SidecarSocketError

    try:
        asyncio.run(sidecar.serve(args.socket, started=started, handle_signals=True,
                                  socket_mode=(default_mode if args.socket_mode is None
                                               else args.socket_mode)))
    except SidecarSocketError as exc:
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
