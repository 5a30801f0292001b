"""The sink settings ``cdc-agent demo`` and ``cdc-agent sidecar`` share: one set of
flags, one configuration path, one way to open the sink.

Precedence: ``--log``/``--endpoint-url`` over ``CDC_AGENT_*`` variables over the
``--config`` file; with none of them, a wal3 log in a new temporary folder.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from agent._config import Config, ConfigError, load_config, uri_from_path

__all__ = ["add_sink_arguments", "not_durable_reason", "sink_config"]

_TEMPORARY_ROOTS = ("/tmp", "/var/tmp", "/dev/shm")


def add_sink_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config``, ``--log`` and ``--endpoint-url``, with the same meaning everywhere."""
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="take the agent options and the sink from a configuration file "
                             "(see config/ and docs/configuration.md); CDC_AGENT_* "
                             "environment variables override its keys")
    parser.add_argument("--log", metavar="URI", default=None,
                        help="where the log goes, instead of the configured sink: a folder "
                             "(a path or file:///dir) or s3://bucket/prefix for a wal3 log, "
                             "or memory:// (default: the configured sink, else a wal3 log "
                             "in a new temporary folder)")
    parser.add_argument("--endpoint-url", default=None, metavar="URL",
                        help="S3 endpoint for s3:// logs (S3-compatible servers)")


def sink_config(args: argparse.Namespace, command: str) -> Config:
    """The configuration ``args`` describe: file, then environment, then flags."""
    config = load_config(args.config)
    if args.log is not None:
        if args.log.startswith("memory:"):
            config.sink = {"kind": "memory"}
        else:
            uri = uri_from_path(args.log)
            if not uri.startswith(("file://", "s3://")):
                raise ConfigError(f"unsupported --log URI {args.log!r} (use a folder, "
                                  "file:///dir, s3://bucket/prefix or memory://)")
            config.sink = {"kind": "wal3", "uri": uri}
        config.sink_given = True
        config.from_env = {k: v for k, v in config.from_env.items()
                           if not k.startswith("sink.")}
    elif not config.sink_given:
        folder = tempfile.mkdtemp(prefix=f"cdc-{command}-log-")
        config.sink = {"kind": "wal3", "uri": Path(folder).as_uri()}
    if args.endpoint_url is not None:
        if config.sink.get("kind") != "wal3":
            raise ConfigError("--endpoint-url applies to a wal3 log on s3://, not to "
                              f"[sink] kind = {config.sink.get('kind')!r}")
        config.sink["endpoint_url"] = args.endpoint_url
    return config


def not_durable_reason(config: Config) -> str | None:
    """Why records shipped with ``config`` would not outlive this process or this boot
    (memory, a temporary folder), or None."""
    kind = config.sink.get("kind")
    uri = str(config.sink.get("uri", ""))
    if kind == "memory" or uri.startswith("memory:"):
        return "the sink is in memory: every record is lost when the process exits"
    if kind == "wal3" and uri.startswith("file://"):
        path = uri[len("file://"):]
        roots = {*_TEMPORARY_ROOTS, tempfile.gettempdir()}
        if any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots):
            return (f"the log is in a temporary folder ({uri}), which the system may empty "
                    "at any time")
    return None
