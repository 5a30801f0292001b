"""The native (C) twins of ``MonotonicIds`` and ``EpochSequencer``, if they were built.

``sequencer/_native.c`` implements the same two state machines for the writers' hot
path; the Python classes stay the reference (the transition table as data) and the
fallback. ``NATIVE`` is the compiled module, or ``None`` when the extension was not
built (``NATIVE_ERROR`` then says why). Choosing between them is the caller's job
(``agent`` honours ``CDC_AGENT_NATIVE=0``): this package reads no environment.
"""

from __future__ import annotations

from types import ModuleType

from sequencer._epochs import QUIESCENT, TWO, BatchTicket, EpochClosed, SequencerError
from sequencer._values import ABSENT, _known_names, check_write

__all__ = ["NATIVE", "NATIVE_ERROR"]

NATIVE: ModuleType | None
NATIVE_ERROR: str | None
try:
    from sequencer import _native  # type: ignore[attr-defined]
except ImportError as exc:  # not built (no compiler at install time): pure Python
    NATIVE, NATIVE_ERROR = None, f"{type(exc).__name__}: {exc}"
else:
    _native.bind(BatchTicket, EpochClosed, SequencerError, QUIESCENT, TWO)
    # CellWriter's checks: the same set of names already seen, check_write for the rest;
    # ABSENT for event_columns.
    _native.bind_checks(_known_names, check_write, ABSENT)
    NATIVE, NATIVE_ERROR = _native, None
