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

import threading
from collections.abc import Callable
from typing import Final

__all__ = ["MonotonicIds", "id_le", "id_lt"]

_MASK64: Final = (1 << 64) - 1
_HALF: Final = 1 << 63
_LOW_BITS_CLEARED: Final = _MASK64 ^ 0x7F
_NUMERATOR: Final = 1 << 23  # 2**32 / 10**9 == 2**23 / 5**9
_DENOMINATOR: Final = 5**9


def id_lt(a: int, b: int) -> bool:
    """``a`` comes strictly before ``b`` on the 64-bit ring (valid within 2**63 of each other)."""
    return 0 < ((b - a) & _MASK64) < _HALF


def id_le(a: int, b: int) -> bool:
    """``a`` comes before ``b`` or equals it, on the 64-bit ring."""
    return ((b - a) & _MASK64) < _HALF


class MonotonicIds:
    """A thread-safe source of strictly increasing, never-zero 64-bit ids.

    ``boottime_ns`` and ``realtime_ns`` are callables returning nanoseconds: the clock
    is an input, never read implicitly (``agent.system_ids()`` passes the real
    ``CLOCK_BOOTTIME`` and ``CLOCK_REALTIME``). Tests pass their own to freeze the clock,
    send it backwards, or cross the 32-bit wrap of the seconds.
    """

    __slots__ = ("_state", "next", "offset_ns")

    def __init__(self, boottime_ns: Callable[[], int], realtime_ns: Callable[[], int]) -> None:
        boottime = boottime_ns
        # The offset is taken once: ids follow the boot clock, which never jumps,
        # yet read as wall-clock seconds since the epoch.
        offset = realtime_ns() - boottime()
        self.offset_ns = offset
        state = self._state = [0]  # [last id issued]; 0 = none yet (0 is never issued)
        lock = threading.Lock()
        acquire, release = lock.acquire, lock.release
        # 2**32 / 1e9 reduced: 32.32 fixed point is ns * 2**23 // 5**9, exactly.
        numerator, denominator = _NUMERATOR, _DENOMINATOR
        cleared, mask, half = _LOW_BITS_CLEARED, _MASK64, _HALF

        # A closure rather than a method: ids sit on every batch's path, and local
        # names are the cheapest thing Python has.
        def next_id() -> int:
            """Return an id strictly greater (modulo 2**64) than every id issued before."""
            candidate = ((boottime() + offset) * numerator // denominator) & cleared
            acquire()
            last = state[0]
            # The compare-and-swap: the clock if it moved past the last id (the common
            # case: plain integers, returned at once; then candidate > last >= 0, so it
            # is not 0), else the modular cases below: last + 1, the wrap, the first id.
            if last < candidate < last + half:
                state[0] = candidate
                release()
                return candidate
            if not last or 0 < ((candidate - last) & mask) < half:
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
