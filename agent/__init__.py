"""Application side: write-batch scoping, the Agent, relaxed stores, the command line.

May import ``sequencer`` and ``sinks`` (and ``replay`` in the demo and the command line
only: ``cli.py``, ``_cli_*``, ``_demo*``), never another package's private modules
(``tests/test_package_boundaries.py`` checks). Start with ``_agent.py`` (batches and
capture), then ``_store.py`` (what a relaxed store is).
"""

from agent._agent import Agent, AgentClosed, QuiescenceTimeout
from agent._async_agent import AsyncAgent
from agent._baseline import BaselineReport, CellChunk, ListableStore, SnapshotProgress
from agent._baseline_journal import BaselineJournal, JournalError
from agent._clock import system_ids
from agent._config import Config, ConfigError, load_config
from agent._metrics import CaptureMetrics, kafka_consumer_lag, serve_metrics, wal3_cursor_lag
from agent._postgres_spec import (
    PostgresError,
    SchemaMismatch,
    TableSpec,
    WriteFailed,
    WriteOutcomeUnknown,
)
from agent._postgres_store import AsyncPostgresStore, PostgresStore
from agent._shipper import ShippingBackpressure, ShippingFailed
from agent._store import AsyncMemoryStore, AsyncRelaxedStore, MemoryStore, RelaxedStore
from sequencer import ABSENT, InvalidWrite

__all__ = [
    "ABSENT",
    "Agent",
    "AgentClosed",
    "AsyncAgent",
    "AsyncMemoryStore",
    "AsyncPostgresStore",
    "AsyncRelaxedStore",
    "BaselineJournal",
    "BaselineReport",
    "CaptureMetrics",
    "CellChunk",
    "Config",
    "ConfigError",
    "InvalidWrite",
    "JournalError",
    "ListableStore",
    "MemoryStore",
    "PostgresError",
    "PostgresStore",
    "QuiescenceTimeout",
    "RelaxedStore",
    "SchemaMismatch",
    "ShippingBackpressure",
    "ShippingFailed",
    "SnapshotProgress",
    "TableSpec",
    "WriteFailed",
    "WriteOutcomeUnknown",
    "kafka_consumer_lag",
    "load_config",
    "serve_metrics",
    "system_ids",
    "wal3_cursor_lag",
]
