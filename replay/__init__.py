"""Reading side: the assembler, position tokens, consumers and appliers.

May import ``sequencer`` and ``sinks``; never ``agent``. Start with ``_assembler.py``
(the cancel-out algebra), then ``_position.py`` (resumable positions).
"""

from replay._assembler import Assembler, Changeset, Snapshot
from replay._errors import InconsistentLog
from replay._position import Frontier, InvalidPosition, Position
from replay._postgres_replica import POSITION_TABLE as REPLICA_POSITION_TABLE
from replay._postgres_replica import PostgresReplica, ReplicaError

__all__ = [
    "Assembler",
    "Changeset",
    "Frontier",
    "InconsistentLog",
    "InvalidPosition",
    "Position",
    "PostgresReplica",
    "REPLICA_POSITION_TABLE",
    "ReplicaError",
    "Snapshot",
]
