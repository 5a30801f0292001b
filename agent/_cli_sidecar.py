"""``cdc-agent sidecar``: serve the capture core on a Unix socket (docs/sidecar.md).

Applications write their store themselves and report each write over the socket; the
sidecar sequences the events and ships them to the sink. SIGTERM or SIGINT shut it down
gracefully: no new batch, a grace period for open ones, then flush, close the sink and
remove the socket file.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from typing import Any

from agent._config import ConfigError, load_config
from agent._logging import configure_logging
from sinks import MemorySink, Sink

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "sidecar", help="serve write capture to other processes over a Unix socket",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--socket", metavar="PATH", required=True,
                        help="the Unix socket to listen on (a stale one is replaced)")
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="take the agent options and the sink from a configuration file "
                             "(see config/); --log is ignored then")
    parser.add_argument("--log", metavar="URI", default=None,
                        help="where the log goes: file:///dir or s3://bucket/prefix (a wal3 "
                             "log), or memory:// (default: a wal3 log in a new temporary "
                             "folder)")
    parser.add_argument("--endpoint-url", default=None, help="S3 endpoint for s3:// logs")
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
    parser.set_defaults(run=run)


def _octal_mode(text: str) -> int:
    try:
        mode = int(text.removeprefix("0o"), 8)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an octal mode such as 660"
                                         ) from None
    if not 0 <= mode <= 0o777:
        raise argparse.ArgumentTypeError(f"{text!r} is not a permission mode (000 to 777)")
    return mode


def _sink_from_uri(uri: str | None, endpoint_url: str | None) -> tuple[str, Sink]:
    if uri is not None and uri.startswith("memory:"):
        return "memory://", MemorySink()
    if uri is None:
        uri = "file://" + tempfile.mkdtemp(prefix="cdc-sidecar-log-")
    if not uri.startswith(("file://", "s3://")):
        raise ConfigError(f"unsupported --log URI {uri!r} (use file:///dir, "
                          "s3://bucket/prefix or memory://)")
    from sinks.wal3 import open_log_sink

    return uri, open_log_sink(uri, endpoint_url=endpoint_url)


def run(args: argparse.Namespace) -> int:
    from agent.sidecar import Sidecar
    from agent.sidecar._server import SOCKET_MODE

    configure_logging(args.verbose)
    if args.grace < 0:
        print("cdc-agent sidecar: --grace must not be negative", file=sys.stderr)
        return 2
    options: dict[str, Any] = {}
    try:
        if args.config:
            config = load_config(args.config)
            destination, sink = str(config.sink.get("uri", config.sink["kind"])), \
                config.open_sink()
            options = dict(config.agent)
        else:
            destination, sink = _sink_from_uri(args.log, args.endpoint_url)
    except ConfigError as exc:
        print(f"cdc-agent sidecar: {exc}", file=sys.stderr)
        return 2
    metrics_server = None
    if args.metrics_port is not None:
        try:
            from agent._metrics import CaptureMetrics, serve_metrics

            options["metrics"] = CaptureMetrics()
            metrics_server = serve_metrics(options["metrics"], args.metrics_port,
                                           args.metrics_address)
        except ImportError as exc:
            sink.close()
            print(f"cdc-agent sidecar: {exc}", file=sys.stderr)
            return 2
        except OSError as exc:
            sink.close()
            print(f"cdc-agent sidecar: cannot serve metrics on {args.metrics_address}:"
                  f"{args.metrics_port}: {exc.strerror or exc}; choose another "
                  "--metrics-port or --metrics-address", file=sys.stderr)
            return 2
    sidecar = Sidecar(sink, grace_period=args.grace, **options)

    def started() -> None:
        where = ("" if metrics_server is None else
                 f", metrics at http://{metrics_server.address}:{metrics_server.port}/metrics")
        print(f"cdc-agent sidecar: listening on {args.socket}, log at {destination}{where}",
              file=sys.stderr, flush=True)

    try:
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
        print(f"cdc-agent sidecar: {exc}", file=sys.stderr)
        return 2
    except (ShippingFailed, QuiescenceTimeout, TimeoutError) as exc:
        print(f"cdc-agent sidecar: the log is incomplete: {exc}", file=sys.stderr)
        return 1
    print(f"cdc-agent sidecar: stopped after {sidecar.stats['batches']} batches, "
          f"{sidecar.stats['events']} events", file=sys.stderr)
    return 0
