"""Which sequencer and id source the agent runs: the C ones (``sequencer._native``) when
they were built, else the pure-Python reference; ``CDC_AGENT_NATIVE=0`` forces Python.

Both implementations have one semantics (tests/sequencer/test_native.py holds them
equal on random histories); the C ones only cost less per write batch.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

import numpy as np
import structlog

import sequencer
from sequencer import BatchTicket, EpochSequencer, MonotonicIds

__all__ = ["ENV_VAR", "cell_writer", "event_encoder", "event_list", "native_in_use", "new_ids",
           "new_sequencer", "segment_digests_helper", "shipper_helpers", "table_runs_helper",
           "transpose", "unscoped_writer", "UnscopedWriter"]

ENV_VAR: Final = "CDC_AGENT_NATIVE"

log = structlog.get_logger()
_warned = False


def native_in_use() -> bool:
    """True if new agents run the C sequencer and ids (built, and not switched off)."""
    global _warned
    if os.environ.get(ENV_VAR, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if sequencer.NATIVE is None:
        if not _warned:  # once per process: the install is fine, only slower
            _warned = True
            log.warning("cdc.native_unavailable", error=sequencer.NATIVE_ERROR,
                        fallback="pure-Python sequencer (slower per write batch)",
                        hint="reinstall with a C compiler and the Python headers")
        return False
    return True


def new_ids(boottime_ns: Callable[[], int], realtime_ns: Callable[[], int]) -> MonotonicIds:
    """A ``MonotonicIds`` (or its C twin) over these clocks."""
    if native_in_use():
        assert sequencer.NATIVE is not None
        return sequencer.NATIVE.MonotonicIds(boottime_ns, realtime_ns)  # type: ignore[no-any-return]
    return MonotonicIds(boottime_ns, realtime_ns)


def new_sequencer(domain_id: int, *, now_ns: int,
                  max_quiescence_interval_ns: int | None = None) -> EpochSequencer:
    """An ``EpochSequencer`` (or its C twin)."""
    if native_in_use():
        assert sequencer.NATIVE is not None
        return sequencer.NATIVE.EpochSequencer(  # type: ignore[no-any-return]
            domain_id, now_ns=now_ns, max_quiescence_interval_ns=max_quiescence_interval_ns)
    return EpochSequencer(domain_id, now_ns=now_ns,
                          max_quiescence_interval_ns=max_quiescence_interval_ns)


class UnscopedWriter(Protocol):
    """``sequencer._native.UnscopedWriter``: an unscoped write, and a scoped batch's
    open (``Agent._open``'s common case) and close (``Agent._finish``), one call each."""

    def __call__(self, table: str, row: Any, column: str, value: Any) -> Any: ...

    def open_ticket(self) -> BatchTicket | None: ...

    def close_batch(self, ticket: BatchTicket, seq_start: int, events: list[Any]) -> None: ...


def unscoped_writer(*, sequencer: object, **parts: Any) -> UnscopedWriter | None:
    """``Agent._set_unscoped`` as one C call (``sequencer._native.UnscopedWriter``) when
    ``sequencer`` is the C one, else None (the agent keeps its Python method)."""
    native = globals()["sequencer"].NATIVE
    if native is None or type(sequencer) is not native.EpochSequencer:
        return None
    return native.UnscopedWriter(sequencer=sequencer, **parts)  # type: ignore[no-any-return]


def event_list() -> Callable[[], list[Any]]:
    """What makes a batch's list of events: ``sequencer._native.event_list`` (a list the
    collector does not track: events cannot lead back to it), or ``list``. Chosen once,
    at import (the process's ``CDC_AGENT_NATIVE``)."""
    if native_in_use():
        assert sequencer.NATIVE is not None
        return sequencer.NATIVE.event_list  # type: ignore[no-any-return]
    return list


def cell_writer(*, sequencer: object, **parts: Any) -> Callable[..., Any] | None:
    """``Agent.set`` as one C call (``sequencer._native.CellWriter``) when ``sequencer``
    is the C one, else None (the agent keeps its Python method)."""
    native = globals()["sequencer"].NATIVE
    if native is None or type(sequencer) is not native.EpochSequencer:
        return None
    return native.CellWriter(**parts)  # type: ignore[no-any-return]


def transpose(rows: Sequence[tuple[Any, ...]], width: int) -> tuple[list[Any], ...]:
    """The columns of ``rows`` (each a tuple of ``width`` items), as lists: what
    ``zip(*rows, strict=True)`` gives, but ``width`` lists even for no rows."""
    if rows and (set(map(len, rows)) != {width}
                 or not all(isinstance(row, tuple) for row in rows)):
        bad = next(i for i, row in enumerate(rows)
                   if not isinstance(row, tuple) or len(row) != width)
        raise ValueError(f"row {bad} is not a tuple of {width} items")
    return tuple([row[k] for row in rows] for k in range(width))


Transpose = Callable[[list[Any], int], tuple[list[Any], ...]]
DigestSlices = Callable[[bytes, np.ndarray], bytes]


def shipper_helpers() -> tuple[Transpose, DigestSlices | None]:
    """The shipper's per-shipment helpers: ``transpose`` (C, or the Python above) and
    ``sha3_slices`` for ``sinks.codec.segment_digest_array`` (C, or None: hashlib)."""
    if native_in_use():
        assert sequencer.NATIVE is not None
        return sequencer.NATIVE.transpose, sequencer.NATIVE.sha3_slices
    return transpose, None


# event_columns(lists) -> five (offsets, data) pairs, or None (the codec then encodes)
EventEncoder = Callable[[list[Any]], tuple[tuple[bytes, bytes], ...] | None]


def event_encoder() -> EventEncoder | None:
    """``sequencer._native.event_columns`` (a shipment's variable event columns built in
    one C pass, the codec's bytes), or None: the shipper then transposes the events and
    encodes them with ``sinks.codec``."""
    if native_in_use():
        assert sequencer.NATIVE is not None
        return sequencer.NATIVE.event_columns  # type: ignore[no-any-return]
    return None


# sha3_segments(bounds, domains, batches, seqs, ((offsets, values) x 5)) -> digests
SegmentDigests = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, tuple[Any, ...]],
                          bytes]


def segment_digests_helper() -> SegmentDigests | None:
    """``sequencer._native.sha3_segments`` (each segment's setsum item built and hashed
    in C; replay uses it too), or None: the shipper then uses
    ``sinks.codec.segment_digest_array``."""
    if native_in_use():
        assert sequencer.NATIVE is not None
        return sequencer.NATIVE.sha3_segments  # type: ignore[no-any-return]
    return None


# table_runs(lists) -> (names, segments, counts) or None: see agent._tally.table_runs
TableRunsHelper = Callable[[list[Any]], tuple[list[str], bytes, bytes] | None]


def table_runs_helper() -> TableRunsHelper | None:
    """``sequencer._native.table_runs`` (a shipment's runs of one table, for the
    per-table counts), or None: the shipper then tallies event by event, the
    reference (``agent._tally.table_runs`` is its Python twin, for tests)."""
    if native_in_use():
        assert sequencer.NATIVE is not None
        return sequencer.NATIVE.table_runs  # type: ignore[no-any-return]
    return None
