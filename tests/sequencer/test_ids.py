"""Monotonic ids: strictly increasing, never zero, across threads and clock misbehaviour."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from agent._clock import boottime_ns
from sequencer import MonotonicIds, id_le, id_lt
from tests.sequencer._impls import IDS

NS = 1_000_000_000


class FakeClock:
    """A boot clock the test moves by hand."""

    def __init__(self, now: int = 10 * NS) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def make_ids(clock: FakeClock, realtime_ns: int,
             make: Any = MonotonicIds) -> MonotonicIds:
    return make(boottime_ns=clock, realtime_ns=lambda: realtime_ns)  # type: ignore[no-any-return]


def assert_strictly_increasing(ids: list[int]) -> None:
    assert 0 not in ids
    for a, b in itertools.pairwise(ids):
        assert id_lt(a, b), (hex(a), hex(b))


@IDS
def test_ids_strictly_increase_across_eight_threads(make_monotonic: Any) -> None:
    """8 threads x 100k ids: every thread sees increasing ids, and no id is issued twice."""
    ids = make_monotonic(boottime_ns, time.time_ns)
    results: list[list[int]] = [[] for _ in range(8)]

    def work(out: list[int]) -> None:
        nxt = ids.next
        out.extend(nxt() for _ in range(100_000))

    threads = [threading.Thread(target=work, args=(out,)) for out in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for out in results:
        assert_strictly_increasing(out)
    assert len({i for out in results for i in out}) == 800_000


@IDS
def test_ids_read_as_wall_clock_seconds_in_32_32_fixed_point(make_monotonic: Any) -> None:
    """The high 32 bits are the Unix seconds; the bottom 7 bits are zero at a fresh tick."""
    clock = FakeClock()
    ids = make_ids(clock, realtime_ns=1_700_000_000 * NS + NS // 2, make=make_monotonic)
    first = ids.next()
    assert first >> 32 == 1_700_000_000
    assert (first & 0xFFFF_FFFF) == (1 << 31) & ~0x7F  # half a second
    assert first & 0x7F == 0


@IDS
def test_frozen_clock_still_gives_distinct_increasing_ids(make_monotonic: Any) -> None:
    """A clock that never moves: ids go up by one."""
    clock = FakeClock()
    ids = make_ids(clock, realtime_ns=1_700_000_000 * NS, make=make_monotonic)
    issued = [ids.next() for _ in range(1000)]
    assert_strictly_increasing(issued)
    assert issued[-1] - issued[0] == 999


@IDS
def test_clock_going_backwards_never_makes_ids_go_backwards(make_monotonic: Any) -> None:
    """The boot clock jumps back a minute: ids keep increasing."""
    clock = FakeClock(100 * NS)
    ids = make_ids(clock, realtime_ns=1_700_000_000 * NS, make=make_monotonic)
    before = [ids.next() for _ in range(10)]
    clock.now -= 60 * NS
    after = [ids.next() for _ in range(10)]
    assert_strictly_increasing(before + after)


@IDS
def test_two_hundred_ids_in_one_tick(make_monotonic: Any) -> None:
    """More than 128 ids in one tick carry into the timestamp bits, still increasing."""
    clock = FakeClock()
    ids = make_ids(clock, realtime_ns=1_700_000_000 * NS, make=make_monotonic)
    burst = [ids.next() for _ in range(200)]
    assert_strictly_increasing(burst)
    clock.now += 1  # a 1 ns tick is below the id resolution: still +1 steps
    clock.now += NS  # one second later: back on the clock
    later = ids.next()
    assert id_lt(burst[-1], later)
    assert later & 0x7F == 0


@IDS
def test_ids_cross_the_32_bit_seconds_wrap_and_skip_zero(make_monotonic: Any) -> None:
    """Seconds wrap at 2**32: the ids wrap to small values, compare as later, and 0 is skipped."""
    clock = FakeClock(0)
    ids = make_ids(clock, realtime_ns=(1 << 32) * NS - 3, make=make_monotonic)
    issued = []
    for _ in range(5):
        issued.append(ids.next())
        clock.now += 1
    assert issued[0] > 1 << 63 and issued[-1] < 1 << 20  # wrapped
    assert 0 not in issued
    assert_strictly_increasing(issued)


def test_modular_comparison() -> None:
    """id_lt/id_le treat ids on a ring of 2**64."""
    top = (1 << 64) - 128
    assert id_lt(top, 128) and not id_lt(128, top)
    assert id_le(5, 5) and not id_lt(5, 5)


@IDS
@given(st.lists(st.integers(min_value=-(10**12), max_value=10**12), min_size=1, max_size=300))
def test_any_clock_path_gives_increasing_nonzero_ids(make_monotonic: Any, steps: list[int]) -> None:
    """Whatever the clock does between calls (jumps, freezes, reversals), ids increase."""
    clock = FakeClock(10**15)
    ids = make_ids(clock, realtime_ns=1_700_000_000 * NS, make=make_monotonic)
    issued = []
    for step in steps:
        clock.now += step
        issued.append(ids.next())
    assert_strictly_increasing(issued)
