"""MemorySink passes the sink conformance suite, records and encoded messages alike."""

from __future__ import annotations

from sinks import MemorySink, Sink
from sinks.testing import check_sink
from tests.helpers import check_agent_round_trip


def test_memory_sink_conformance() -> None:
    """Records kept in memory replay to the store's states."""
    check_sink(MemorySink, lambda sink: sink.records)
    check_agent_round_trip(MemorySink(), lambda sink: sink.records)


def test_memory_sink_messages_conformance() -> None:
    """The encoded messages a byte-oriented sink would store replay the same."""
    check_sink(lambda: MemorySink(keep_messages=True), lambda sink: sink.decoded_messages())
    check_agent_round_trip(MemorySink(keep_messages=True), lambda sink: sink.decoded_messages())


def test_memory_sink_is_a_sink() -> None:
    assert isinstance(MemorySink(), Sink)
