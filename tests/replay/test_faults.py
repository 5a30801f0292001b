"""Faults met while reading: every verified changeset before the fault is handed out first,
then the fault's own error (never a bare RuntimeError, never a lost changeset)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay import Assembler, Changeset, InconsistentLog
from sequencer import EpochRecord
from tests.helpers import Captured


def _log(writes: int = 40, threads_like: int = 3) -> list[Any]:
    c = Captured()
    for i in range(writes):
        if i % 4 == 0:
            with c.agent.batch():
                for j in range(threads_like):
                    c.agent.set("t", (i + j) % 7, "a", i * 10 + j)
        else:
            c.agent.set("t", i % 5, "b", i)
    c.agent.close()
    return list(c.sink.records)


def _streamed(records: list[Any]) -> list[Changeset]:
    """The reference: one record at a time, each interval verified as it completes."""
    assembler = Assembler()
    out: list[Changeset] = []
    for record in records:
        out += assembler.feed(record)
    return out


def _same(got: list[Changeset], want: list[Changeset]) -> None:
    """Equal changesets (a position's ``seen`` hint depends on how far reading got)."""
    def key(c: Changeset) -> tuple[Any, ...]:
        return (c.domain_id, c.epoch_seq, c.event_count, c.changes, c.before,
                c.position.epoch_seq, c.position.end_id)
    assert [key(c) for c in got] == [key(c) for c in want]


def test_a_missing_epoch_inside_an_interval_is_an_inconsistent_log() -> None:
    """A lost epoch record between two held ones: InconsistentLog naming it, not a
    'generator raised StopIteration' RuntimeError (issue 10 item 5)."""
    records = _log()
    epochs = [r for r in records if isinstance(r, EpochRecord)]
    # An epoch whose predecessor is held and not a quiescence point, so the epochs held
    # after the last applied point start with one that is present.
    lost = next(e for i, e in enumerate(epochs[1:], 1) if not epochs[i - 1].quiescent)
    with pytest.raises(InconsistentLog, match=f"epoch {lost.epoch_seq} never arrived") as info:
        list(Assembler().changesets([r for r in records if r is not lost]))
    assert info.value.epoch_seq == lost.epoch_seq
    assert info.value.domain_id == lost.domain_id


class SourceFailed(Exception):
    """What a damaged source raises."""


def _failing(records: list[Any], cut: int) -> Iterator[Any]:
    yield from records[:cut]
    raise SourceFailed(f"record {cut} is damaged")


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_a_failing_source_hands_out_every_changeset_before_the_fault(data: st.DataObject
                                                                     ) -> None:
    """The source raises after any number of records: the changesets yielded first are
    exactly those the records before the fault complete, then the source's error."""
    records = _log()
    cut = data.draw(st.integers(0, len(records)))
    got: list[Changeset] = []
    with pytest.raises(SourceFailed):
        got.extend(Assembler().changesets(_failing(records, cut)))
    _same(got, _streamed(records[:cut]))


def test_a_bad_record_after_good_intervals_comes_after_them() -> None:
    """A record that contradicts an earlier one: the intervals before it are handed out."""
    import dataclasses

    records = _log()
    last_epoch = max(i for i, r in enumerate(records) if isinstance(r, EpochRecord))
    forged = dataclasses.replace(records[last_epoch], event_count=99)
    bad = [*records, forged]
    got: list[Changeset] = []
    with pytest.raises(InconsistentLog, match="two different records"):
        got.extend(Assembler().changesets(bad))
    _same(got, _streamed(records))


def test_a_damaged_wal3_fragment_comes_after_every_changeset_before_it(tmp_path: Path
                                                                       ) -> None:
    """Fragment 5 of many corrupt: read_log + Assembler hand out the changesets of the
    fragments before it, then CorruptFragment (issue 10 item 8)."""
    from agent import Agent, MemoryStore
    from sinks.wal3 import CorruptFragment, LogReader, Wal3Sink, WriterOptions, read_log

    uri = f"file://{tmp_path / 'log'}"
    sink = Wal3Sink(uri, options=WriterOptions(batch_size_records=4, ship_when_idle=False,
                                               batch_interval=10.0))
    agent = Agent(MemoryStore(), sink)
    for i in range(120):
        agent.set("t", i % 9, "a", i)
        if i % 6 == 5:
            agent.flush()
    agent.close()
    reader = LogReader(uri)
    fragments = reader.scan()
    assert len(fragments) > 10
    damaged = fragments[4]
    before = [r for f in fragments[:4] for r in reader.fetch(f)]
    want = _streamed([x for r in before for x in _decode(r.body)])
    assert want, "the fragments before the damage complete some intervals"
    path = tmp_path / "log" / reader.store.key(damaged.path)
    path.write_bytes(path.read_bytes()[:-40])  # cut short: its footer is gone
    got: list[Changeset] = []
    with pytest.raises(CorruptFragment):
        got.extend(Assembler().changesets(read_log(uri)))
    _same(got, want)


def _decode(body: bytes) -> Any:
    from sinks.codec import decode, records

    return records(decode(body))
