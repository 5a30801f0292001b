"""Both implementations of the sequencer's state machines, for tests that run on each:
the pure-Python reference and its C twin (``sequencer._native``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from sequencer import EpochSequencer, MonotonicIds
from sequencer._accel import NATIVE, NATIVE_ERROR


def native() -> Any:
    """The compiled module; the tests need it built (``pip install -e .`` builds it)."""
    assert NATIVE is not None, (
        f"sequencer._native was not built ({NATIVE_ERROR}): run `pip install -e .` "
        "(or `python3 setup.py build_ext --inplace`) with gcc and the Python headers")
    return NATIVE


def native_sequencer(*args: Any, **kwargs: Any) -> Any:
    return native().EpochSequencer(*args, **kwargs)


def native_ids(*args: Any, **kwargs: Any) -> Any:
    return native().MonotonicIds(*args, **kwargs)


SEQUENCERS = pytest.mark.parametrize(
    "make_sequencer", [EpochSequencer, native_sequencer], ids=["python", "native"])
IDS = pytest.mark.parametrize("make_monotonic", [MonotonicIds, native_ids],
                              ids=["python", "native"])


def sha3_lane_counts() -> list[int]:
    """The SHA3 helpers' modes this machine has: one message at a time, and four at
    once where the CPU has AVX2 (sequencer._native.sha3_x4)."""
    if NATIVE is None:
        return [1]
    old = NATIVE.sha3_lanes()
    try:
        NATIVE.sha3_lanes(4)
    except ValueError:
        return [1]
    finally:
        NATIVE.sha3_lanes(old)
    return [1, 4]


@contextlib.contextmanager
def sha3_lanes(lanes: int) -> Iterator[None]:
    old = native().sha3_lanes(lanes)
    try:
        yield
    finally:
        native().sha3_lanes(old)
