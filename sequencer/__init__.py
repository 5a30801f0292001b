"""cdc-agent's pure core: ids, domains, the epoch sequencer, the value model and records.

Sans-IO: nothing here reads a clock, touches a socket or file, or imports a driver;
callers feed time, fresh ids and events and get back the epochs to publish. It imports nothing
else of this project. Start with ``_epochs.py`` (the state table), then ``_ids.py``.
``NATIVE`` is their C twin (``_native.c``, built when a compiler was there; ``None``
otherwise), the same state machines for the writers' hot path.
"""

from sequencer._accel import NATIVE, NATIVE_ERROR
from sequencer._domain import new_domain_id
from sequencer._epochs import BatchTicket, EpochClosed, EpochSequencer, SequencerError
from sequencer._ids import MonotonicIds, id_le, id_lt
from sequencer._records import ChangeEvent, EpochRecord, Record
from sequencer._values import (
    ABSENT,
    Absent,
    InvalidWrite,
    RowKey,
    Value,
    check_name,
    check_row,
    check_value,
    check_write,
)

__all__ = [
    "ABSENT",
    "Absent",
    "BatchTicket",
    "ChangeEvent",
    "EpochClosed",
    "EpochRecord",
    "EpochSequencer",
    "InvalidWrite",
    "MonotonicIds",
    "NATIVE",
    "NATIVE_ERROR",
    "Record",
    "RowKey",
    "SequencerError",
    "Value",
    "check_name",
    "check_row",
    "check_value",
    "check_write",
    "id_le",
    "id_lt",
    "new_domain_id",
]
