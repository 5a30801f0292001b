"""Logging configuration, for the entry points only (the library never configures).

The library's structlog events are ``logging`` records (``sinks/_log_routing.py``);
``configure_logging`` gives the root logger one stderr handler that renders them: a
JSON object per line when stderr is not a terminal (for log collectors), readable
``key=value`` lines on a terminal. Every line passes through ``redact`` (no credentials
inside URLs). Warnings and errors only by default, everything with ``verbose``; the
command line's own events (logger ``cdc-agent``) show at info level.
"""

from __future__ import annotations

import datetime
import logging
import sys
from typing import Any

import structlog

from sinks import LOG_EVENT_ATTRIBUTE as EVENT_ATTRIBUTE
from sinks import redact, route_library_logs

__all__ = ["CLI_LOGGER", "configure_logging", "logs_json", "say"]

CLI_LOGGER = "cdc-agent"
_json_lines = False


class _StderrHandler(logging.Handler):
    """Writes to whatever ``sys.stderr`` is at the time (tests swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:  # logging must never break the program
            self.handleError(record)


class EventFormatter(logging.Formatter):
    """A record as one line: the event's dict (or the record's message, for other
    libraries' records) with timestamp, level and logger, rendered by structlog."""

    def __init__(self, json_lines: bool) -> None:
        super().__init__()
        self._render: Any = (structlog.processors.JSONRenderer(default=str) if json_lines
                             else structlog.dev.ConsoleRenderer(colors=False))

    def format(self, record: logging.LogRecord) -> str:
        event = getattr(record, EVENT_ATTRIBUTE, None)
        fields: dict[str, Any] = {
            "timestamp": datetime.datetime.fromtimestamp(record.created, datetime.UTC)
            .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        fields.update(event if isinstance(event, dict) else {"event": record.getMessage()})
        fields = {"event": fields.pop("event", ""), **fields}
        if record.exc_info:
            fields["exception"] = self.formatException(record.exc_info)
        return redact(str(self._render(None, record.levelname.lower(), fields)))


def configure_logging(verbose: bool = False, *, json_lines: bool | None = None) -> None:
    """Route every event to stderr (see the module docstring); calling it again replaces
    the handler it installed."""
    global _json_lines
    _json_lines = (not sys.stderr.isatty()) if json_lines is None else json_lines
    route_library_logs(force=True)
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
        root.removeHandler(handler)
    handler = _StderrHandler()
    handler.setFormatter(EventFormatter(_json_lines))
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.WARNING)
    logging.getLogger(CLI_LOGGER).setLevel(logging.DEBUG if verbose else logging.INFO)


def logs_json() -> bool:
    """Whether ``configure_logging`` chose JSON lines."""
    return _json_lines


def say(event: str, message: str, *, level: int = logging.INFO, **fields: Any) -> None:
    """A command-line event with a human ``message`` (the sidecar's banner, warnings)."""
    structlog.get_logger(CLI_LOGGER).log(level, event, message=message, **fields)
