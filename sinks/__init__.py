"""Shipping: the sink protocol, the record codec, setsum, and the sinks themselves.

May import ``sequencer``; never ``agent`` or ``replay``. Start with ``codec.py`` (the
bytes every sink and reader share) and ``_protocol.py`` (what a sink must do).
Optional back ends (``sinks.wal3``, ``sinks.kafka``) import their drivers lazily.
It also holds the little both ``agent`` and ``replay`` need (``redact``, log routing,
``PostgresError``), since neither may import the other.
"""

from sinks._log_routing import EVENT_ATTRIBUTE as LOG_EVENT_ATTRIBUTE
from sinks._log_routing import route_library_logs
from sinks._memory import MemorySink, RecordingSink
from sinks._postgres_error import PostgresError
from sinks._protocol import Sink, SinkBackpressure, SinkClosed, SinkError, SinkTimeout
from sinks._redact import redact
from sinks._setsum import SETSUM_PRIMES, Setsum
from sinks.codec import EventBatch, SnapshotChunk

route_library_logs()  # events to the logging module, never stdout (sinks/_log_routing.py)

__all__ = [
    "EventBatch",
    "LOG_EVENT_ATTRIBUTE",
    "MemorySink",
    "PostgresError",
    "RecordingSink",
    "SETSUM_PRIMES",
    "Setsum",
    "Sink",
    "SinkBackpressure",
    "SinkClosed",
    "SinkError",
    "SinkTimeout",
    "SnapshotChunk",
    "redact",
    "route_library_logs",
]
