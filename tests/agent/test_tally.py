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

from agent._tally import EpochTally, TallyMismatch
from sinks import Setsum

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
