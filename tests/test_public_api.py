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
                "CellChunk", "ListableStore", "SnapshotProgress", "BaselineJournal",
                "JournalError"},
        sequencer: {"ChangeEvent", "EpochRecord", "MonotonicIds", "NATIVE", "NATIVE_ERROR"},
        sinks: {"MemorySink", "Setsum", "Sink", "EventBatch", "SnapshotChunk",
                # shared by agent and replay, which may not import each other
                "PostgresError", "SETSUM_PRIMES", "redact", "route_library_logs",
                "LOG_EVENT_ATTRIBUTE"},
        replay: {"Assembler", "InconsistentLog", "Position", "Frontier", "Changeset",
                 "PostgresReplica", "ReplicaError", "REPLICA_POSITION_TABLE",
                 "CompactionReport", "checkpoint_log", "collect_log", "compact_log"},
        sinks.wal3: {"Manifest", "Setsum", "Wal3Sink", "open_log_sink", "read_log",
                     "LogWriter", "LogReader", "CursorStore", "as_store", "StateDelta",
                     "StateIndex", "CorruptState", "NotARetainedPoint", "StateContention"},
        sinks.objstore: {"ObjectStore", "open_store", "InMemoryObjectStore", "LocalStore",
                         "S3Store"},
        replay.spark: {"changesets", "events", "snapshot", "to_state", "verify", "wide",
                       "LogReplay", "write_changesets", "write_state",
                       "stream_changesets", "QuiescencePoints", "SESSION_SETTINGS"},
    }
    for module, names in promised.items():
        assert names <= set(module.__all__), module.__name__
        assert list(module.__all__) == sorted(module.__all__), module.__name__
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"


def test_the_codec_exports_every_layout() -> None:
    """sinks.codec is the one module of bytes: wal3's records, snapshot chunks and both
    Kafka encodings, each name other packages use exported."""
    import sinks.codec

    promised = {
        "decode", "encode_events", "encode_epoch", "encode_snapshot", "SnapshotChunk",
        "Bound", "SnapshotCell", "row_order", "decode_snapshot",
        "NATIVE_MAGIC", "NATIVE_VERSION", "RawEvent", "cell_key", "event_keys",
        "partition_of", "partitions_of", "encode_native_events", "decode_native_event",
        "raw_events_batch", "HEADER_PARTITION", "HEADER_WHOLE", "HEADER_SNAPSHOT",
        "SNAPSHOT_PARTITION", "encode_debezium_event", "decode_debezium_event",
        "debezium_transaction_records", "encode_debezium_key", "encode_debezium_value",
    }
    assert promised <= set(sinks.codec.__all__)
    assert len(set(sinks.codec.__all__)) == len(sinks.codec.__all__), "a name twice"
    for name in sinks.codec.__all__:
        assert hasattr(sinks.codec, name), name


def test_postgres_errors_have_one_base() -> None:
    """One ``except agent.PostgresError`` catches the store's and the replica's errors."""
    assert agent.PostgresError is sinks.PostgresError
    assert issubclass(replay.ReplicaError, agent.PostgresError)


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
