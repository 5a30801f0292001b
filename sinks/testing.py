"""A conformance suite every sink runs: ``check_sink(make_sink, read_back)``.

Shipped in the package so a sink written elsewhere can prove itself the same way. It
needs no test framework: each check raises ``AssertionError`` saying what broke.

``make_sink()`` returns a fresh, empty sink; ``read_back(sink)`` returns every record
the destination holds, in its order (``ChangeEvent``, ``EpochRecord`` or
``EventBatch``), reading from the destination itself, not from the sink's memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from sequencer import ChangeEvent, EpochRecord
from sinks._protocol import Sink, SinkError
from sinks.codec import EventBatch, encode_value

__all__ = ["check_sink"]

ReadBack = Callable[[Any], Iterable[ChangeEvent | EpochRecord | EventBatch]]


def check_sink(make_sink: Callable[[], Sink], read_back: ReadBack, *,
               threads: int = 4, batches: int = 150) -> None:
    """Run every conformance check against fresh sinks from ``make_sink``."""
    check_round_trip(make_sink(), read_back, threads=threads, batches=batches)
    check_lifecycle(make_sink(), read_back)


def _bits(state: dict[Any, Any]) -> dict[Any, bytes]:
    return {cell: encode_value(value) for cell, value in state.items()}


def check_round_trip(sink: Sink, read_back: ReadBack, *, threads: int, batches: int) -> None:
    """A concurrent workload through an Agent: the destination replays to every
    quiescent state of the store, and to its final state."""
    from agent import Agent, MemoryStore  # the agent drives sinks; imported late
    from agent._workload import Workload
    from replay import Assembler

    store = MemoryStore()
    seen: dict[tuple[int, int], dict[Any, bytes]] = {}
    agent = Agent(store, sink, on_quiescence=lambda m: seen.__setitem__(
        (m.domain_id, m.epoch_seq), _bits(store.snapshot())))
    Workload(threads=threads, batches=batches, seed=11).run(agent)
    agent.flush()
    agent.close()
    snapshots = list(Assembler().replay(read_back(sink)))
    assert snapshots, "the destination replayed to no quiescence point"
    assert len(snapshots) == len(seen), (
        f"{len(seen)} quiescence points captured, {len(snapshots)} replayed")
    for snap in snapshots:
        assert _bits(snap.state) == seen[(snap.domain_id, snap.epoch_seq)], (
            f"state at epoch {snap.epoch_seq} differs from the store's")
    assert _bits(snapshots[-1].state) == _bits(store.snapshot()), "final state differs"


def check_lifecycle(sink: Sink, read_back: ReadBack) -> None:
    """flush() makes records readable; close() twice is fine; writing after close fails
    with a SinkError."""
    from agent import Agent, MemoryStore

    agent = Agent(MemoryStore(), sink)
    agent.set("conformance", 1, "a", b"\x00bytes")
    agent.flush()
    events = [r for r in _flatten(read_back(sink)) if isinstance(r, ChangeEvent)]
    assert [e.new for e in events] == [b"\x00bytes"], "flushed event not readable"
    agent.close()
    sink.close()  # a second close
    record = EpochRecord(1, 1, 0, 2, 0, True, (), "00" * 32)
    try:
        sink.write_epoch(record)
    except SinkError:
        pass
    else:
        raise AssertionError("a closed sink accepted a record")


def _flatten(records: Iterable[ChangeEvent | EpochRecord | EventBatch]
             ) -> Iterable[ChangeEvent | EpochRecord]:
    for record in records:
        if isinstance(record, EventBatch):
            yield from record.to_events()
        else:
            yield record
