"""The shipper's per-epoch tallies (agent._tally), against a plain recount, however the
shipments cut the stream of segments and epoch closes."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent._tally import EpochTally, TallyMismatch, table_runs
from sinks import Setsum
from tests.sequencer._impls import native

segment = st.tuples(st.integers(1, 6),  # epoch (the segment's batch was counted in it)
                    st.binary(min_size=32, max_size=32),  # its digest
                    st.lists(st.sampled_from(["a", "b", "é", "zz"]), min_size=1, max_size=4))


@settings(max_examples=300, deadline=None)
@given(st.lists(segment, max_size=25), st.lists(st.integers(0, 40), max_size=8),
       st.integers(0, 6))
def test_tallies_equal_a_plain_recount_whatever_the_shipment_cuts(
        segments: list[tuple[int, bytes, list[str]]], cuts: list[int], late: int) -> None:
    """Epochs 1..6 close in order, each once all its segments went out (some ``late``
    ones later still); shipments cut the stream anywhere. Each epoch's setsum digest,
    event count and sorted per-table counts are those of its own segments."""
    last = {e: i for i, (e, _, _) in enumerate(segments)}
    # The stream: each segment, and each epoch's close right after its epoch's (and
    # every earlier epoch's) last segment, or ``late`` items later.
    stream: list[tuple[str, object]] = []
    closes_at: dict[int, int] = {}
    floor = -1
    for epoch in range(1, 7):
        floor = max(floor, last.get(epoch, -1))
        closes_at[epoch] = max(floor + (late if epoch % 2 else 0), closes_at.get(epoch - 1, -1))
    stream += [("close", e) for e in range(1, 7) if closes_at[e] < 0]
    for i, item in enumerate(segments):
        stream.append(("segment", item))
        stream += [("close", e) for e in range(1, 7) if closes_at[e] == i]
    stream += [("close", e) for e in range(1, 7) if closes_at[e] >= len(segments)]
    tally = EpochTally()
    got: dict[int, tuple[bytes, int, list[tuple[str, int]]]] = {}
    expected_counts = Counter(e for e, _, tables in segments for _ in tables)
    bounds = sorted({0, len(stream), *[c for c in cuts if c < len(stream)]})
    for lo, hi in itertools.pairwise(bounds):
        shipment = stream[lo:hi]
        segs = [s for kind, s in shipment if kind == "segment"]
        closed = [e for kind, e in shipment if kind == "close"]
        if segs or tally.carrying:  # as the shipper does
            tables = [t for _, _, ts in segs for t in ts]  # type: ignore[misc]
            tally.add(np.array([e for e, _, _ in segs], dtype=np.uint64),  # type: ignore[misc]
                      b"".join(d for _, d, _ in segs),  # type: ignore[misc]
                      np.array([len(ts) for _, _, ts in segs], dtype=np.int64),  # type: ignore[misc]
                      pa.array(tables, pa.utf8()))
        if closed:
            digests, offsets, names, counts = tally.take(
                closed, [expected_counts[e] for e in closed])  # type: ignore[index]
            for k, epoch in enumerate(closed):
                span = slice(int(offsets[k]), int(offsets[k + 1]))
                got[epoch] = (digests[32 * k: 32 * k + 32], int(expected_counts[epoch]),  # type: ignore[index]
                              list(zip(names[span].to_pylist(), counts[span].tolist(),
                                       strict=True)))
        tally.carry()
    assert sorted(got) == list(range(1, 7)) and tally.pending() == 0
    for epoch in range(1, 7):
        mine = [(d, ts) for e, d, ts in segments if e == epoch]
        setsum = Setsum.of_digests([d for d, _ in mine]) if mine else Setsum()
        assert got[epoch][0] == setsum.digest()
        assert got[epoch][2] == sorted(Counter(t for _, ts in mine for t in ts).items())


def test_a_count_that_differs_from_the_sequencers_is_a_bug_named() -> None:
    tally = EpochTally()
    tally.add(np.array([3], dtype=np.uint64), bytes(32), np.array([2]), pa.array(["t", "t"]))
    with pytest.raises(TallyMismatch, match="epoch 3: sequencer counted 1 events, shipper saw 2"):
        tally.take([3], [1])


# -- table runs: the shipper's C shortcut for per-table counts (sequencer._native) ---------

# Equal names as distinct objects too: C compares by pointer first, then by value.
_name = st.sampled_from(["a", "b", "é", "zz"]).map(lambda t: "".join(list(t)))
_event = st.tuples(_name, st.integers(0, 3), st.just("c"), st.none(), st.integers(0, 3))
_odd_event = st.one_of(  # what the C pass refuses: the shipper then tallies per event
    st.tuples(st.integers(0, 3), st.just(1), st.just("c"), st.none(), st.none()),
    st.tuples(_name, st.just(1), st.just("c"), st.none()),
    st.builds(list, st.tuples(_name, st.just(1), st.just("c"), st.none(), st.none())),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(_event, max_size=6), max_size=6),
       st.one_of(st.none(), st.tuples(st.integers(0, 5), st.integers(0, 6), _odd_event)))
def test_native_table_runs_equal_the_python_reference(
        lists: list[list[object]], odd: tuple[int, int, object] | None) -> None:
    if odd is not None and lists:
        k, i, event = odd
        segment = lists[k % len(lists)]
        segment.insert(min(i, len(segment)), event)
    expected = table_runs(lists)  # type: ignore[arg-type]
    got = native().table_runs(lists)
    assert got == expected
    if odd is None or not lists:  # a well-formed shipment: the runs re-count its tables
        assert expected is not None
        names, segments, counts = expected
        recount = Counter(
            (k, t) for k, t, n in zip(np.frombuffer(segments, np.int64).tolist(), names,
                                      np.frombuffer(counts, np.int64).tolist(), strict=True)
            for _ in range(n))
        assert recount == Counter((k, e[0]) for k, s in enumerate(lists)
                                  for e in s)  # type: ignore[index]
        # Runs are maximal: no two neighbours in one segment name the same table.
        seg_list = np.frombuffer(segments, np.int64).tolist()
        assert all(not (seg_list[j] == seg_list[j + 1] and names[j] == names[j + 1])
                   for j in range(len(names) - 1))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5), st.binary(min_size=32, max_size=32),
                          st.lists(_name, min_size=1, max_size=5)), max_size=20),
       st.lists(st.integers(0, 20), max_size=5))
def test_tallies_from_runs_equal_tallies_event_by_event(
        segments: list[tuple[int, bytes, list[str]]], cuts: list[int]) -> None:
    """The shipper's native path (``runs``) gives the reference path's digests, counts
    and per-table counts exactly, however shipments cut the segments (epochs close
    after the last shipment, so open epochs carry over between shipments)."""
    by_event, by_run = EpochTally(), EpochTally()
    bounds = sorted({0, len(segments), *[c for c in cuts if c < len(segments)]})
    for lo, hi in itertools.pairwise(bounds):
        segs = segments[lo:hi]
        args = (np.array([e for e, _, _ in segs], dtype=np.uint64),
                b"".join(d for _, d, _ in segs),
                np.array([len(ts) for _, _, ts in segs], dtype=np.int64))
        by_event.add(*args, pa.array([t for _, _, ts in segs for t in ts], pa.utf8()))
        runs = native().table_runs([[(t, 0, "c", None, 1) for t in ts] for _, _, ts in segs])
        by_run.add(*args, pa.array([], pa.utf8()), runs)
        by_event.carry()
        by_run.carry()
    epochs = sorted({e for e, _, _ in segments})
    counts = [sum(len(ts) for e, _, ts in segments if e == epoch) for epoch in epochs]
    if segments:  # the shipment that closes them (none of its own: ``carrying``)
        for tally in (by_event, by_run):
            tally.add(np.zeros(0, np.uint64), b"", np.zeros(0, np.int64),
                      pa.array([], pa.utf8()))
    want, got = by_event.take(epochs, counts), by_run.take(epochs, counts)
    assert want[0] == got[0]
    assert want[1].tolist() == got[1].tolist()
    assert want[2].to_pylist() == got[2].to_pylist()
    assert want[3].tolist() == got[3].tolist()
