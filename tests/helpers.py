"""Small helpers shared by tests: bit-exact state comparison and a capturing agent."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent import Agent, MemoryStore
from sinks import MemorySink
from sinks.codec import encode_value


def bits(state: Mapping[Any, object]) -> dict[Any, bytes]:
    """A state with every value as its tagged bytes, so NaN == NaN and -0.0 != 0.0."""
    return {cell: encode_value(value) for cell, value in state.items()}  # type: ignore[arg-type]


class Captured:
    """An Agent on a MemoryStore and a MemorySink, recording the store at each quiescence."""

    def __init__(self, **options: Any) -> None:
        self.store = MemoryStore()
        self.sink = MemorySink()
        self.at_quiescence: dict[tuple[int, int], dict[Any, bytes]] = {}
        self.agent = Agent(self.store, self.sink, on_quiescence=self._capture, **options)

    def _capture(self, marker: Any) -> None:
        self.at_quiescence[(marker.domain_id, marker.epoch_seq)] = bits(self.store.snapshot())


def check_agent_round_trip(sink: Any, read_back: Any, *, threads: int = 4,
                           batches: int = 150) -> None:
    """End to end through a sink: a concurrent workload through an Agent, read back from
    the destination and replayed by the Assembler, reaches every quiescent state of the
    store and its final state. (``sinks.testing`` checks the sink alone; this needs the
    packages above it, so it lives with the tests.)"""
    from agent._workload import Workload
    from replay import Assembler

    store = MemoryStore()
    seen: dict[tuple[int, int], dict[Any, bytes]] = {}
    agent = Agent(store, sink, on_quiescence=lambda m: seen.__setitem__(
        (m.domain_id, m.epoch_seq), bits(store.snapshot())))
    Workload(threads=threads, batches=batches, seed=11).run(agent)
    agent.flush()
    agent.close()
    snapshots = list(Assembler().replay(read_back(sink)))
    assert snapshots, "the destination replayed to no quiescence point"
    assert len(snapshots) == len(seen), (
        f"{len(seen)} quiescence points captured, {len(snapshots)} replayed")
    for snap in snapshots:
        assert bits(snap.state) == seen[(snap.domain_id, snap.epoch_seq)], (
            f"state at epoch {snap.epoch_seq} differs from the store's")
    assert bits(snapshots[-1].state) == bits(store.snapshot()), "final state differs"


@dataclass
class ConsumedMessage:
    """A confluent-kafka consumed message's stand-in (what consumers read of one)."""

    partition_: int
    offset_: int
    key_: bytes | None
    value_: bytes | None
    headers_: Any = None

    def error(self) -> None:
        return None

    def partition(self) -> int:
        return self.partition_

    def offset(self) -> int:
        return self.offset_

    def key(self) -> bytes | None:
        return self.key_

    def value(self) -> bytes | None:
        return self.value_

    def headers(self) -> Any:
        return self.headers_
