"""Which sequencer and id source the agent runs: the C ones (``sequencer._native``) when
they were built, else the pure-Python reference; ``CDC_AGENT_NATIVE=0`` forces Python.

Both implementations have one semantics (tests/sequencer/test_native.py holds them
equal on random histories); the C ones only cost less per write batch.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Final

import structlog

from sequencer import EpochSequencer, MonotonicIds
from sequencer._accel import NATIVE, NATIVE_ERROR

__all__ = ["ENV_VAR", "native_in_use", "new_ids", "new_sequencer"]

ENV_VAR: Final = "CDC_AGENT_NATIVE"

log = structlog.get_logger()
_warned = False


def native_in_use() -> bool:
    """True if new agents run the C sequencer and ids (built, and not switched off)."""
    global _warned
    if os.environ.get(ENV_VAR, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if NATIVE is None:
        if not _warned:  # once per process: the install is fine, only slower
            _warned = True
            log.warning("cdc.native_unavailable", error=NATIVE_ERROR,
                        fallback="pure-Python sequencer (slower per write batch)",
                        hint="reinstall with a C compiler and the Python headers")
        return False
    return True


def new_ids(boottime_ns: Callable[[], int], realtime_ns: Callable[[], int]) -> MonotonicIds:
    """A ``MonotonicIds`` (or its C twin) over these clocks."""
    if native_in_use():
        assert NATIVE is not None
        return NATIVE.MonotonicIds(boottime_ns, realtime_ns)  # type: ignore[no-any-return]
    return MonotonicIds(boottime_ns, realtime_ns)


def new_sequencer(domain_id: int, *, now_ns: int,
                  max_quiescence_interval_ns: int | None = None) -> EpochSequencer:
    """An ``EpochSequencer`` (or its C twin)."""
    if native_in_use():
        assert NATIVE is not None
        return NATIVE.EpochSequencer(  # type: ignore[no-any-return]
            domain_id, now_ns=now_ns, max_quiescence_interval_ns=max_quiescence_interval_ns)
    return EpochSequencer(domain_id, now_ns=now_ns,
                          max_quiescence_interval_ns=max_quiescence_interval_ns)
