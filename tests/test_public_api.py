"""The stable public surface: names other code imports must stay."""

from __future__ import annotations

import agent
import replay
import replay.spark
import sequencer
import sinks
import sinks.objstore
import sinks.wal3


def test_stable_names_are_exported() -> None:
    """The names promised in the README and issues exist and are sorted in __all__."""
    promised = {
        agent: {"ABSENT", "Agent", "MemoryStore", "AsyncAgent", "InvalidWrite",
                "PostgresStore", "AsyncPostgresStore", "TableSpec", "BaselineReport",
                "CellChunk", "ListableStore", "SnapshotProgress"},
        sequencer: {"ChangeEvent", "EpochRecord", "MonotonicIds"},
        sinks: {"MemorySink", "Setsum", "Sink", "EventBatch", "SnapshotChunk"},
        replay: {"Assembler", "InconsistentLog", "Position", "Frontier", "Changeset",
                 "PostgresReplica"},
        sinks.wal3: {"Manifest", "Setsum", "Wal3Sink", "open_log_sink", "read_log",
                     "LogWriter", "LogReader"},
        sinks.objstore: {"ObjectStore", "open_store", "InMemoryObjectStore", "LocalStore",
                         "S3Store"},
        replay.spark: {"changesets", "events", "snapshot", "to_state", "verify", "wide",
                       "LogReplay", "write_changesets", "write_state",
                       "stream_changesets", "QuiescencePoints"},
    }
    for module, names in promised.items():
        assert names <= set(module.__all__), module.__name__
        assert list(module.__all__) == sorted(module.__all__), module.__name__
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"


def test_optional_drivers_are_imported_lazily() -> None:
    """Importing every package pulls in no optional driver until a sink or store needs it."""
    import subprocess
    import sys

    code = ("import sys, agent, sinks, replay, sinks.wal3, sinks.objstore\n"
            "print(','.join(m for m in ('psycopg', 'confluent_kafka', 'boto3') "
            "if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == ""
