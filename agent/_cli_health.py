"""``cdc-agent health --socket PATH``: probe a running sidecar (for an orchestrator).

Exit status 0 when the sidecar can capture (one line of figures on stdout); 1 with one
line on stderr saying why when it cannot or cannot be reached. A container's
``HEALTHCHECK`` runs it (docs/sidecar.md).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from typing import Any

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "health", help="probe a running sidecar: exit 0 if it can capture",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--socket", metavar="PATH", required=True,
                        help="the sidecar's Unix socket")
    parser.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                        help="how long to wait for the answer (default 5)")
    parser.set_defaults(run=run)


def probe(socket_path: str, timeout: float = 5.0) -> tuple[bool, str]:
    """Ask the sidecar at ``socket_path`` for its health: (healthy, one line why)."""
    from agent.sidecar import _protocol as p

    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(socket_path)
            sock.sendall(p.encode_request("health"))
            with sock.makefile("rb") as replies:
                line = replies.readline()
    except TimeoutError:
        return False, f"the sidecar at {socket_path} did not answer within {timeout}s"
    except OSError as exc:
        return False, (f"cannot reach the sidecar at {socket_path}: "
                       f"{exc.strerror or exc}; is `cdc-agent sidecar` running there?")
    if not line.endswith(b"\n"):
        return False, f"the sidecar at {socket_path} closed the connection without an answer"
    try:
        reply = p.decode_reply(line)
    except p.ProtocolError as exc:
        return False, f"the sidecar at {socket_path} answered nonsense: {exc.message}"
    if not reply["ok"]:
        return False, f"{reply.get('error')}: {reply.get('message')}"
    figures = {k: v for k, v in reply.items() if k not in ("id", "ok", "healthy")}
    return True, "healthy " + json.dumps(figures, separators=(",", ":"))


def run(args: argparse.Namespace) -> int:
    healthy, line = probe(args.socket, args.timeout)
    if healthy:
        print(line)
        return 0
    print(f"cdc-agent health: unhealthy: {line}", file=sys.stderr)
    return 1
