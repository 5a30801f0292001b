"""A conformance suite every sink runs: ``check_sink(make_sink, read_back)``.

Shipped in the package so a sink written elsewhere can prove itself the same way. It
needs no test framework: each check raises ``AssertionError`` saying what broke.

``make_sink()`` returns a fresh, empty sink; ``read_back(sink)`` returns every record
the destination holds, in its order (``ChangeEvent``, ``EpochRecord`` or
``EventBatch``), reading from the destination itself, not from the sink's memory.

The suite writes a log of its own making, as the agent's shipper would (the events of
each write batch in seq order, several batches interleaved, each epoch record after
the events it covers, with its real setsum), so it needs nothing above ``sinks``: like
the rest of the package it imports ``sequencer`` only. It checks what a sink promises:
every event comes back exactly once, bit for bit; the epoch records come back in
order, each after every event it covers; and each epoch's setsum holds over the events
read back, as a reader will verify. Driving a sink with a live ``agent.Agent`` and
replaying it with ``replay.Assembler`` is the end-to-end test of the project's own
sinks (``tests/helpers.py``), not part of this suite.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from sequencer import ABSENT, ChangeEvent, EpochRecord, Value
from sinks._protocol import Sink, SinkError
from sinks.codec import (
    EpochRun,
    EventBatch,
    digests_setsum,
    encode_key,
    encode_value,
    segment_digests,
)

__all__ = ["check_sink"]

ReadBack = Callable[[Any], Iterable[ChangeEvent | EpochRecord | EventBatch]]
_BASE_ID = 1 << 40  # batch ids are 32.32 fixed-point seconds; any point on the ring works
_EPOCH_SPAN = 1 << 20


def check_sink(make_sink: Callable[[], Sink], read_back: ReadBack, *,
               threads: int = 4, batches: int = 150) -> None:
    """Run every conformance check against fresh sinks from ``make_sink``.

    ``threads`` is how many writers' batches interleave in the log written, ``batches``
    how many write batches it holds in all.
    """
    check_round_trip(make_sink(), read_back, threads=threads, batches=batches)
    sink = make_sink()
    if getattr(sink, "write_shipment", None) is not None:
        check_round_trip(sink, read_back, threads=threads, batches=batches, shipments=True)
    else:
        sink.close()
    check_lifecycle(make_sink(), read_back)


def synthetic_log(*, writers: int, batches: int, seed: int = 11, domain_id: int = 7
                  ) -> list[EventBatch | EpochRecord]:
    """A log as the shipper writes it: event batches, then the epoch records covering
    them; the cells overlap, values of every type, ABSENT on either side, empty epochs."""
    rng = random.Random(seed)
    state: dict[tuple[str, int | str, str], Value] = {}
    log: list[EventBatch | EpochRecord] = []
    left, epoch_seq, begin = batches, 0, 0
    while left > 0 or epoch_seq == 0:
        epoch_seq += 1
        start = _BASE_ID + epoch_seq * _EPOCH_SPAN
        count = min(left, rng.randrange(0, 2 * writers + 1))
        left -= count
        epoch_events: list[ChangeEvent] = []
        shipment: list[ChangeEvent] = []
        for k in range(count):  # writers' batches close one after another, ids rising
            batch_id = start + 1 + k * 1000 + rng.randrange(1000)
            events = [_event(rng, state, domain_id, batch_id, seq)
                      for seq in range(rng.randrange(1, 6))]
            shipment += events
            epoch_events += events
            if rng.random() < 0.5:  # sometimes several write batches in one shipment
                log.append(EventBatch.from_events(shipment))
                shipment = []
        if shipment:
            log.append(EventBatch.from_events(shipment))
        end = start + _EPOCH_SPAN
        log.append(EpochRecord(
            domain_id, epoch_seq, begin, end, len(epoch_events),
            quiescent=left == 0 or rng.random() < 0.5,
            table_counts=tuple(sorted(Counter(e.table for e in epoch_events).items())),
            setsum=_setsum(epoch_events)))
        begin = end
    return log


def _event(rng: random.Random, state: dict[tuple[str, int | str, str], Value],
           domain_id: int, batch_id: int, seq: int) -> ChangeEvent:
    cell = (rng.choice(("accounts", "orders")), rng.choice((1, -7, 1 << 62, "k", "ké")),
            rng.choice(("a", "b")))
    old = state.get(cell, ABSENT)
    new: Value | Any = rng.choice((ABSENT, None, True, 0, -1.5, float("nan"), -0.0, "",
                                   "π", b"", b"\x00\xff", rng.randrange(-(1 << 63), 1 << 63)))
    if new is ABSENT:
        state.pop(cell, None)
    else:
        state[cell] = new
    return ChangeEvent(domain_id, batch_id, seq, cell[0], cell[1], cell[2], old, new)


def _setsum(events: list[ChangeEvent]) -> str:
    ordered = sorted(events, key=lambda e: (e.batch_id, e.seq))
    digests = [d for _, _, d in segment_digests(EventBatch.from_events(ordered).data)]
    return digests_setsum(digests).hexdigest()


def _identity(event: ChangeEvent) -> tuple[Any, ...]:
    return (event.domain_id, event.batch_id, event.seq, event.table, encode_key(event.row),
            event.column, encode_value(event.old), encode_value(event.new))


def check_round_trip(sink: Sink, read_back: ReadBack, *, threads: int, batches: int,
                     shipments: bool = False) -> None:
    """Everything written comes back: each event once and bit for bit, the epoch records
    in order, each after the events it covers, each setsum true of the events read.
    With ``shipments``, the log goes to the sink's optional ``write_shipment`` in runs
    of consecutive records (one to five), as the agent's shipper hands them over: a
    shipment's epoch records as one ``EpochRun`` where the sink takes runs too."""
    written = synthetic_log(writers=threads, batches=batches)
    if shipments:
        write_shipment = sink.write_shipment  # type: ignore[attr-defined]
        runs = getattr(sink, "write_epochs", None) is not None
        sizes = itertools.cycle((3, 1, 5, 2, 4))
        at = 0
        while at < len(written):
            size = next(sizes)
            write_shipment(_shipment(written[at:at + size], runs))
            at += size
    else:
        for record in written:
            if isinstance(record, EventBatch):
                sink.write_events(record)
            else:
                sink.write_epoch(record)
    sink.flush()
    sink.close()
    sent_events = [_identity(e) for r in written if isinstance(r, EventBatch)
                   for e in r.to_events()]
    sent_epochs = [r for r in written if isinstance(r, EpochRecord)]
    got = list(_flatten(read_back(sink)))
    events = [r for r in got if isinstance(r, ChangeEvent)]
    epochs = [r for r in got if isinstance(r, EpochRecord)]
    assert Counter(map(_identity, events)) == Counter(sent_events), (
        f"{len(sent_events)} events written, {len(events)} read back, or they differ")
    assert [_whole(r) for r in epochs] == sent_epochs, "epoch records differ or moved"
    pending = {_identity(e): e for e in events}
    for item in got:
        if isinstance(item, ChangeEvent):
            pending.pop(_identity(item), None)
            continue
        record = item
        early = [e for e in pending.values() if record.covers(e.batch_id)]
        assert not early, (f"epoch {record.epoch_seq} read back before {len(early)} of "
                           "its events")
        mine = [e for e in events if record.covers(e.batch_id)]
        assert _setsum(mine) == record.setsum, (
            f"epoch {record.epoch_seq}: its setsum does not hold over the events read back")


def _shipment(records: list[EventBatch | EpochRecord], runs: bool
              ) -> list[EventBatch | EpochRecord | EpochRun]:
    """``records`` with each stretch of two or more epoch records as one run (if
    ``runs``)."""
    out: list[EventBatch | EpochRecord | EpochRun] = []
    stretch: list[EpochRecord] = []
    for record in [*records, None]:
        if isinstance(record, EpochRecord):
            stretch.append(record)
            continue
        if runs and len(stretch) > 1:
            out.append(EpochRun.from_records(stretch))
        else:
            out.extend(stretch)
        stretch = []
        if record is not None:
            out.append(record)
    return out


def _whole(record: EpochRecord) -> EpochRecord:
    return record if record.stream is None else dataclasses.replace(record, stream=None)


def check_lifecycle(sink: Sink, read_back: ReadBack) -> None:
    """flush() makes records readable; close() twice is fine; writing after close fails
    with a SinkError."""
    event = ChangeEvent(7, _BASE_ID + 1, 0, "conformance", 1, "a", ABSENT, b"\x00bytes")
    sink.write_events(EventBatch.from_events([event]))
    sink.write_epoch(EpochRecord(7, 1, 0, _BASE_ID + 2, 1, True, (("conformance", 1),),
                                 _setsum([event])))
    sink.flush()
    events = [r for r in _flatten(read_back(sink)) if isinstance(r, ChangeEvent)]
    assert [e.new for e in events] == [b"\x00bytes"], "flushed event not readable"
    sink.close()
    sink.close()  # a second close
    record = EpochRecord(7, 2, _BASE_ID + 2, _BASE_ID + 3, 0, True, (), "00" * 32)
    writes: list[Callable[[], None]] = [lambda: sink.write_epoch(record)]
    if getattr(sink, "write_shipment", None) is not None:
        writes.append(lambda: sink.write_shipment([record]))  # type: ignore[attr-defined]
    for write in writes:
        try:
            write()
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
