"""wal3: a verifiable log on object storage, compatible with Chroma wal3's on-storage format.

May import ``sinks`` (setsum, codec, protocol) and ``sinks.objstore``; never ``agent`` or
``replay``. Start with ``_manifest.py`` (the formats and their invariants), then
``_writer.py`` (the write path and its recovery), ``_reader.py`` and ``_garbage.py``.
``docs/wal3.md`` describes the layout, the protocols and their durability order.
"""

from sinks._setsum import Setsum
from sinks.wal3._async import AsyncLogWriter
from sinks.wal3._cursors import Cursor, CursorStore, Witness
from sinks.wal3._errors import (
    AlreadyInitialized,
    CorruptCursor,
    CorruptFragment,
    CorruptGarbage,
    CorruptLog,
    CorruptManifest,
    CursorContention,
    GarbageCollected,
    GarbageCollectionInProgress,
    LogBackpressure,
    LogClosed,
    LogContention,
    LogSealed,
    LogUnavailable,
    NoSuchCursor,
    UninitializedLog,
    Wal3Error,
)
from sinks.wal3._fragment import decode_fragment, encode_fragment, record_setsum
from sinks.wal3._garbage import Garbage, GarbageCollector, GcReport, compute_garbage
from sinks.wal3._manifest import (
    Fragment,
    LogPosition,
    Manifest,
    ScrubSuccess,
    Snapshot,
    SnapshotOptions,
    SnapshotPointer,
)
from sinks.wal3._paths import fragment_path, parse_fragment_path, snapshot_path
from sinks.wal3._reader import Limits, LogReader, Record, ScrubReport
from sinks.wal3._seal import continue_log, seal_log
from sinks.wal3._sink import Wal3Sink, open_log_sink, read_log
from sinks.wal3._state import (
    CorruptState,
    NotARetainedPoint,
    StateContention,
    StateDelta,
    StateIndex,
    check_accounting,
    check_chain,
    iter_state_deltas,
    load_state_index,
    moved_setsum,
    publish_state_index,
    split_key,
    state_moves,
    state_setsum,
    write_state_objects,
)
from sinks.wal3._store import as_store
from sinks.wal3._writer import LogWriter, WriterOptions

__all__ = [
    "AlreadyInitialized",
    "AsyncLogWriter",
    "CorruptCursor",
    "CorruptFragment",
    "CorruptGarbage",
    "CorruptLog",
    "CorruptManifest",
    "CorruptState",
    "Cursor",
    "CursorContention",
    "CursorStore",
    "Fragment",
    "Garbage",
    "GarbageCollected",
    "GarbageCollectionInProgress",
    "GarbageCollector",
    "GcReport",
    "Limits",
    "LogBackpressure",
    "LogClosed",
    "LogContention",
    "LogPosition",
    "LogReader",
    "LogSealed",
    "LogUnavailable",
    "LogWriter",
    "Manifest",
    "NoSuchCursor",
    "NotARetainedPoint",
    "Record",
    "ScrubReport",
    "ScrubSuccess",
    "Setsum",
    "Snapshot",
    "SnapshotOptions",
    "SnapshotPointer",
    "StateContention",
    "StateDelta",
    "StateIndex",
    "UninitializedLog",
    "Wal3Error",
    "Wal3Sink",
    "Witness",
    "WriterOptions",
    "as_store",
    "check_accounting",
    "check_chain",
    "compute_garbage",
    "continue_log",
    "decode_fragment",
    "encode_fragment",
    "fragment_path",
    "iter_state_deltas",
    "load_state_index",
    "moved_setsum",
    "open_log_sink",
    "parse_fragment_path",
    "publish_state_index",
    "read_log",
    "record_setsum",
    "seal_log",
    "snapshot_path",
    "split_key",
    "state_moves",
    "state_setsum",
    "write_state_objects",
]
