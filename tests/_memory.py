"""How the native-code tests catch leaks: traced memory left after a repeated workload."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable


def traced_growth(run: Callable[[int], None], *, warm_up: int, measured: int) -> int:
    """Bytes still traced after ``run(measured)``, once ``run(warm_up)`` has filled the
    caches (interned ints, a store's rows) and garbage is collected before and after.
    A reference leaked per call keeps megabytes; a flat workload stays within a few
    kilobytes."""
    run(warm_up)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        run(measured)
        gc.collect()
        return int(tracemalloc.get_traced_memory()[0] - before)
    finally:
        tracemalloc.stop()
