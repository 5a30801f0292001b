"""Small helpers shared by tests: bit-exact state comparison and a capturing agent."""

from __future__ import annotations

from collections.abc import Mapping
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
