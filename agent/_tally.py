"""Per-epoch tallies for the shipper: setsums, event counts and per-table counts.

The shipper hands over, per shipment of events, each segment's epoch, digest and
length and each event's table; later, the epochs the sequencer closed. ``EpochTally``
sums the first per epoch and answers the second for a whole run at once, in numpy and
Arrow: there is no Python step per event or per epoch, only per epoch still open at the
end of a shipment (a few), whose partial tallies carry over to the next.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sinks import SETSUM_PRIMES

__all__ = ["EpochTally", "TableRuns", "TallyMismatch", "table_runs"]

# A shipment's runs of one table: (names, segments, counts), segments and counts as the
# bytes of native int64 arrays; run k is counts[k] events of table names[k] in segment
# segments[k].
TableRuns = tuple[list[str], bytes, bytes]

_PRIMES: Final = np.array(SETSUM_PRIMES, dtype=np.uint64)
_COUNT: Final = 8  # column of the event count, after the 8 setsum lanes
_EMPTY_U64: Final = np.zeros(0, dtype=np.uint64)


class TallyMismatch(AssertionError):
    """The sequencer counted a different number of events than were shipped (a bug)."""


class EpochTally:
    """Tallies of the epochs whose events were shipped and whose records were not yet."""

    def __init__(self) -> None:
        # This shipment's tallies: sorted epoch seqs, their sums (8 lanes + count), and
        # (seq, table, count) triples sorted by seq then table; ``_used`` marks epochs
        # whose records went out.
        self._seqs = _EMPTY_U64
        self._sums = np.zeros((0, 9), dtype=np.uint64)
        self._used = np.zeros(0, dtype=bool)
        self._t_seqs = _EMPTY_U64
        self._t_names: pa.Array = pa.array([], pa.utf8())
        self._t_counts = _EMPTY_U64
        # Partial tallies carried over from earlier shipments: seq -> (sums, tables).
        self._carried: dict[int, tuple[np.ndarray, dict[str, int]]] = {}

    def add(self, seg_seqs: np.ndarray, digests: bytes, seg_lengths: np.ndarray,
            tables: pa.Array, runs: TableRuns | None = None) -> None:
        """Tally one shipment: per segment its epoch, SHA3 digest and event count, and
        every event's table (segments contiguous, in the same order). Call it once per
        shipment, before ``take``, when there are segments or ``carrying``; ``carry``
        at its end.

        With ``runs`` (``table_runs`` of the shipment's events), ``tables`` is not read:
        each run of one table counts at once (a run per segment in the common case, so
        the sort below sorts segments, not events); the tallies are the same."""
        carried, self._carried = self._carried, {}
        lanes = np.frombuffer(digests, dtype="<u4").reshape(-1, 8).astype(np.uint64)
        rows = np.concatenate((lanes, seg_lengths.astype(np.uint64)[:, None]), axis=1)
        seqs = seg_seqs.astype(np.uint64)
        if runs is None:
            event_seqs = np.repeat(seqs, seg_lengths)
            weights = np.ones(len(event_seqs), dtype=np.uint64)
        else:
            names, run_segments, run_counts = runs
            event_seqs = seqs[np.frombuffer(run_segments, np.int64)]
            weights = np.frombuffer(run_counts, np.int64).astype(np.uint64)
            tables = pa.array(names, pa.utf8())
        if carried:  # the open epochs' partial tallies join this shipment's
            names = [t for _, counts in carried.values() for t in counts]
            seqs = np.concatenate((seqs, np.fromiter(carried, np.uint64, len(carried))))
            rows = np.concatenate((rows, np.stack([s for s, _ in carried.values()])))
            event_seqs = np.concatenate((event_seqs, np.fromiter(
                (seq for seq, (_, counts) in carried.items() for _ in counts), np.uint64,
                len(names))))
            weights = np.concatenate((weights, np.fromiter(
                (n for _, counts in carried.values() for n in counts.values()), np.uint64,
                len(names))))
            tables = pa.concat_arrays([tables, pa.array(names, pa.utf8())])
        order = np.argsort(seqs, kind="stable")
        seqs = seqs[order]
        starts = _group_starts(seqs)
        self._seqs = seqs[starts]
        sums = np.add.reduceat(rows[order], starts, axis=0) if len(starts) else rows[:0]
        sums[:, :8] %= _PRIMES
        self._sums = sums
        self._used = np.zeros(len(starts), dtype=bool)
        # Per (epoch, table): tables ranked by name, so each epoch's counts come sorted.
        encoded = pc.dictionary_encode(tables)
        dictionary = encoded.dictionary
        rank = np.empty(len(dictionary), dtype=np.int64)
        rank[pc.array_sort_indices(dictionary).to_numpy()] = np.arange(len(dictionary))
        codes = encoded.indices.to_numpy()
        order = np.lexsort((rank[codes], event_seqs))
        event_seqs, codes = event_seqs[order], codes[order]
        starts = _group_starts(event_seqs, codes)
        self._t_seqs = event_seqs[starts]
        self._t_names = dictionary.take(pa.array(codes[starts]))
        self._t_counts = (np.add.reduceat(weights[order], starts) if len(starts)
                          else _EMPTY_U64)

    def take(self, seqs: Sequence[int], event_counts: Sequence[int],
             ) -> tuple[bytes, np.ndarray, pa.Array, np.ndarray]:
        """The tallies of closed epochs ``seqs`` (increasing), checked against the
        sequencer's ``event_counts``: their setsum digests (32 bytes each), and per
        epoch k its tables ``names[offsets[k]:offsets[k + 1]]`` with their ``counts``."""
        wanted = np.array(seqs, np.uint64)
        n = len(wanted)
        sums = np.zeros((n, 9), dtype=np.uint64)
        if len(self._seqs):
            at = np.minimum(np.searchsorted(self._seqs, wanted), len(self._seqs) - 1)
            hit = self._seqs[at] == wanted
            sums[hit] = self._sums[at[hit]]
            self._used[at[hit]] = True
        expected = np.array(event_counts, np.uint64)
        wrong = np.flatnonzero(sums[:, _COUNT] != expected)
        if len(wrong):
            k = int(wrong[0])
            raise TallyMismatch(f"epoch {int(wanted[k])}: sequencer counted "
                                f"{int(expected[k])} events, shipper saw {int(sums[k, _COUNT])}")
        digests = sums[:, :8].astype("<u4").tobytes()
        left = np.searchsorted(self._t_seqs, wanted, side="left")
        right = np.searchsorted(self._t_seqs, wanted, side="right")
        lengths = right - left
        offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        picked = np.arange(offsets[-1]) - np.repeat(offsets[:-1] - left, lengths)
        return (digests, offsets, self._t_names.take(pa.array(picked, pa.int64())),
                self._t_counts[picked])

    def carry(self) -> None:
        """End of a shipment: keep the tallies of epochs not closed yet for the next."""
        for j in np.flatnonzero(~self._used).tolist():
            seq = int(self._seqs[j])
            lo, hi = np.searchsorted(self._t_seqs, [seq, seq + 1])
            names = self._t_names.slice(lo, hi - lo).to_pylist()
            self._carried[seq] = (self._sums[j].copy(),
                                  dict(zip(names, self._t_counts[lo:hi].tolist(), strict=True)))
        self._seqs, self._used = _EMPTY_U64, np.zeros(0, dtype=bool)
        self._t_seqs = _EMPTY_U64

    @property
    def carrying(self) -> bool:
        """Whether earlier shipments left tallies of epochs not closed yet."""
        return bool(self._carried)

    def pending(self) -> int:
        """How many epochs have tallies waiting for their records (for tests)."""
        return len(self._carried) + int(np.count_nonzero(~self._used))


def table_runs(lists: Sequence[Sequence[tuple[object, ...]]]) -> TableRuns | None:
    """Each segment's runs of one table (``sequencer._native.table_runs``'s reference):
    a run ends where its segment ends or the table changes. None when an event is not
    a 5-tuple with a ``str`` table (then tally event by event)."""
    names: list[str] = []
    segments: list[int] = []
    counts: list[int] = []
    for k, events in enumerate(lists):
        previous: str | None = None
        for event in events:
            if type(event) is not tuple or len(event) != 5 or type(event[0]) is not str:
                return None
            if event[0] != previous:
                names.append(event[0])
                segments.append(k)
                counts.append(0)
                previous = event[0]
            counts[-1] += 1
    return (names, np.array(segments, np.int64).tobytes(),
            np.array(counts, np.int64).tobytes())


def _group_starts(*keys: np.ndarray) -> np.ndarray:
    """Where each run of equal keys starts, in arrays sorted by those keys."""
    n = len(keys[0])
    if not n:
        return np.zeros(0, dtype=np.int64)
    change = np.zeros(n - 1, dtype=bool)
    for key in keys:
        change |= key[1:] != key[:-1]
    return np.concatenate(([0], np.flatnonzero(change) + 1)).astype(np.int64)
