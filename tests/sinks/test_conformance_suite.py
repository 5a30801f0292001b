"""The conformance suite catches broken sinks: each faulty MemorySink below fails it."""

from __future__ import annotations

import dataclasses

import pytest

from sequencer import EpochRecord
from sinks import EventBatch, MemorySink
from sinks.testing import check_sink


class DropsAnEvent(MemorySink):
    def write_events(self, batch: EventBatch) -> None:
        super().write_events(EventBatch(batch.data.slice(1)) if len(batch) > 3 else batch)


class CorruptsAValue(MemorySink):
    def write_events(self, batch: EventBatch) -> None:
        events = batch.to_events()
        events[0] = dataclasses.replace(events[0], new=b"flipped")
        super().write_events(EventBatch.from_events(events))


class EpochsFirst(MemorySink):
    """Holds events back and writes them after the next epoch record."""

    held: list[EventBatch]

    def write_events(self, batch: EventBatch) -> None:
        self.__dict__.setdefault("held", []).append(batch)

    def write_epoch(self, record: EpochRecord) -> None:
        super().write_epoch(record)
        for batch in self.__dict__.pop("held", []):
            super().write_events(batch)


class SwapsEpochs(MemorySink):
    def write_epoch(self, record: EpochRecord) -> None:
        held = self.__dict__.pop("held", None)
        if held is None:
            self.__dict__["held"] = record
            return
        super().write_epoch(record)
        super().write_epoch(held)

    def flush(self) -> None:
        if "held" in self.__dict__:
            super().write_epoch(self.__dict__.pop("held"))
        super().flush()


class WritesAfterClose(MemorySink):
    def write_epoch(self, record: EpochRecord) -> None:
        self.records.append(record)


@pytest.mark.parametrize("faulty", [DropsAnEvent, CorruptsAValue, EpochsFirst, SwapsEpochs,
                                    WritesAfterClose])
def test_a_faulty_sink_fails_the_suite(faulty: type[MemorySink]) -> None:
    """Losing, changing or misplacing a record, or accepting one after close, is caught."""
    with pytest.raises(AssertionError) as info:
        check_sink(faulty, lambda sink: sink.records, batches=40)
    assert str(info.value), "the suite must say what broke"


def test_the_memory_sink_passes() -> None:
    """The baseline: the same suite passes on the sink the faulty ones derive from."""
    check_sink(MemorySink, lambda sink: sink.records, batches=40)
