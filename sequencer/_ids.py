"""Monotonic write-batch ids (seed 000).

An id is a 64-bit timestamp in 32.32 fixed point (seconds since the Unix epoch),
computed from CLOCK_BOOTTIME plus an offset to CLOCK_REALTIME taken once, with the
bottom 7 bits zeroed. A compare-and-swap on the last id issued keeps ids strictly
increasing; when the clock has not moved on (or went back), the next id is last + 1,
which stays inside the zeroed bits unless 128 ids come within one clock tick. 0 is a
reserved sentinel: it is never issued. Ids are compared modulo 2**64, so the 32-bit
seconds counter may wrap.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Final

__all__ = ["MonotonicIds", "id_le", "id_lt"]

_MASK64: Final = (1 << 64) - 1
_HALF: Final = 1 << 63
_LOW_BITS_CLEARED: Final = _MASK64 ^ 0x7F
_NS_PER_S: Final = 1_000_000_000


def id_lt(a: int, b: int) -> bool:
    """``a`` comes strictly before ``b`` on the 64-bit ring (valid within 2**63 of each other)."""
    return 0 < ((b - a) & _MASK64) < _HALF


def id_le(a: int, b: int) -> bool:
    """``a`` comes before ``b`` or equals it, on the 64-bit ring."""
    return ((b - a) & _MASK64) < _HALF


# A C-level partial, not a Python function: it saves a frame on every id.
_real_boottime_ns: Callable[[], int] = functools.partial(time.clock_gettime_ns,
                                                         time.CLOCK_BOOTTIME)


class MonotonicIds:
    """A thread-safe source of strictly increasing, never-zero 64-bit ids.

    ``boottime_ns`` and ``realtime_ns`` are callables returning nanoseconds; ``None``
    selects the real ``CLOCK_BOOTTIME`` and ``CLOCK_REALTIME``. Tests inject their own
    to freeze the clock, send it backwards, or cross the 32-bit wrap of the seconds.
    """

    __slots__ = ("_state", "next", "offset_ns")

    def __init__(
        self,
        boottime_ns: Callable[[], int] | None = None,
        realtime_ns: Callable[[], int] | None = None,
    ) -> None:
        boottime = boottime_ns or _real_boottime_ns
        # The offset is taken once: ids follow the boot clock, which never jumps,
        # yet read as wall-clock seconds since the epoch.
        offset = (realtime_ns or time.time_ns)() - boottime()
        self.offset_ns = offset
        state = self._state = [0]  # [last id issued]; 0 = none yet (0 is never issued)
        lock = threading.Lock()
        acquire, release = lock.acquire, lock.release
        ns_per_s, cleared, mask, half = _NS_PER_S, _LOW_BITS_CLEARED, _MASK64, _HALF

        # A closure rather than a method: ids sit on every batch's path, and local
        # names are the cheapest thing Python has.
        def next_id() -> int:
            """Return an id strictly greater (modulo 2**64) than every id issued before."""
            # 32.32 fixed point of the seconds: ns * 2**32 / 1e9, in exact integers.
            candidate = (((boottime() + offset) << 32) // ns_per_s) & cleared
            acquire()
            last = state[0]
            # The compare-and-swap: the clock if it moved past the last id (or nothing
            # was issued yet), else last + 1.
            if 0 < ((candidate - last) & mask) < half or not last:
                issued = candidate or 1
            else:
                issued = ((last + 1) & mask) or 1
            state[0] = issued
            release()
            return issued

        self.next = next_id

    def __call__(self) -> int:
        return self.next()

    def last(self) -> int:
        """The last id issued (0 before the first)."""
        return self._state[0]
