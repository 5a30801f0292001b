"""Library events go to the standard ``logging`` module, never to stdout.

The packages log with module-level ``structlog.get_logger()``. structlog's own default
prints to stdout, which would mix the library's events into an application's output.
So, unless the application configured structlog itself (then its configuration rules),
importing the library points structlog at ``logging``: each event becomes a record of
the logger named after the module (``agent._agent``, ``sinks.wal3._writer``), with the
event name and its keys as the message (``cdc.agent_started domain_id='...'``) and the
event's dict as ``record.cdc_event`` for structured handlers. Applications route,
filter and format the records as they do any others; with no logging configured, only
warnings and errors reach stderr (Python's last-resort handler). The command line's
handler (``agent._logging``) renders ``cdc_event`` as JSON lines or readable text.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import structlog

from sinks._redact import redact

__all__ = ["EVENT_ATTRIBUTE", "route_library_logs"]

EVENT_ATTRIBUTE = "cdc_event"


def to_logging_call(logger: Any, method_name: str,
                    event_dict: MutableMapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The last processor: the arguments of the ``logging.Logger`` call."""
    fields = dict(event_dict)
    exc_info = fields.pop("exc_info", None)
    fields.pop("positional_args", None)
    event = str(fields.get("event", ""))
    rest = " ".join(f"{key}={value!r}" for key, value in fields.items() if key != "event")
    message = redact(f"{event} {rest}" if rest else event)
    kwargs: dict[str, Any] = {"extra": {EVENT_ATTRIBUTE: fields}}
    if exc_info:
        kwargs["exc_info"] = exc_info
    return (message,), kwargs


def route_library_logs(*, force: bool = False) -> None:
    """Point structlog at ``logging`` unless the application configured it (``force``:
    even then, for the command line's entry points)."""
    if structlog.is_configured() and not force:
        return
    structlog.configure(
        processors=[structlog.stdlib.filter_by_level, to_logging_call],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
