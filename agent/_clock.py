"""The real clocks the pure core (``sequencer``) is fed with: it never reads one itself."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

from agent._native import new_ids
from sequencer import MonotonicIds

__all__ = ["boottime_ns", "system_ids"]

# A C-level partial, not a Python function: it saves a frame on every id.
boottime_ns: Callable[[], int] = functools.partial(time.clock_gettime_ns, time.CLOCK_BOOTTIME)


def system_ids() -> MonotonicIds:
    """Batch ids from the real ``CLOCK_BOOTTIME``, offset once to ``CLOCK_REALTIME``."""
    return new_ids(boottime_ns, time.time_ns)
