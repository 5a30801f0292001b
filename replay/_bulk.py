"""Cancel-out over one or many quiescent intervals in one vectorised pass.

Each event is a Z-set delta on its cell: +1 for ``new``, -1 for ``old``. For every
(interval, cell), the sum must be nothing (the events returned to where they began)
or exactly ``+final -initial``; and across intervals, each cell's initial must be the
final it had before (the state held, or an earlier interval's final). Where the
events return to where they began, the value they began from must be one they
replaced (the Z-set alone cannot see the start of a closed loop).

Everything runs on integer codes: cells and values are dictionary-encoded once, then
grouped and compared with numpy, so a run of many tiny intervals (a single writer
quiesces after almost every batch) costs about as much as one large interval.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["BrokenChain", "IntervalResult", "NetChanges", "cancel_out", "net_changes"]


@dataclass(frozen=True, slots=True)
class IntervalResult:
    """What one interval changed: cell key -> final (``b""``: ABSENT), and before."""

    changes: dict[bytes, bytes]
    before: dict[bytes, bytes]
    event_count: int


@dataclass(frozen=True, slots=True)
class BrokenChain:
    """The first (interval, cell) whose events cannot be rebuilt into a state."""

    interval: int
    key: bytes
    why: str


def cancel_out(state: dict[bytes, bytes], keys: pa.Array, old: pa.Array, new: pa.Array,
               interval: np.ndarray, n_intervals: int) -> list[IntervalResult] | BrokenChain:
    """Check and net out the events of ``n_intervals`` consecutive intervals.

    ``keys``, ``old``, ``new`` and ``interval`` describe each (deduplicated) event;
    ``state`` holds the values before the first interval (it is only read).
    """
    n = len(keys)
    counts = np.bincount(interval, minlength=n_intervals)
    if n == 0:
        return [IntervalResult({}, {}, 0) for _ in range(n_intervals)]
    # -- codes ------------------------------------------------------------------------
    key_codes = pc.dictionary_encode(keys)
    cells = key_codes.dictionary
    kc = key_codes.indices.to_numpy().astype(np.int64)
    n_cells = len(cells)
    held = pa.array([state.get(k, b"") for k in cells.to_pylist()], pa.binary())
    value_codes = pc.dictionary_encode(pa.concat_arrays([new, old, held]))
    values = value_codes.dictionary
    vc = value_codes.indices.to_numpy().astype(np.int64)
    new_vc, old_vc, held_vc = vc[:n], vc[n:2 * n], vc[2 * n:]
    n_values = len(values)
    iv = interval.astype(np.int64)
    group = iv * n_cells + kc  # (interval, cell) as one integer
    # -- per (interval, cell): net Z-set -----------------------------------------------
    combo = np.concatenate((group, group)) * n_values + np.concatenate((new_vc, old_vc))
    unique, inverse = np.unique(combo, return_inverse=True)
    weight = np.bincount(inverse, weights=np.concatenate((np.ones(n), -np.ones(n))))
    nonzero = weight != 0
    nz_group, nz_value = np.divmod(unique[nonzero], n_values)
    nz_weight = weight[nonzero]
    # Each changed group (sorted) must be exactly one -1 and one +1 entry; the weights
    # of a group always sum to zero, so "two entries of absolute weight 1" says it.
    changed_groups, first_entry, entries = np.unique(nz_group, return_index=True,
                                                     return_counts=True)
    if len(changed_groups):
        abs_sum = np.add.reduceat(np.abs(nz_weight), first_entry)
        bad = (entries != 2) | (abs_sum != 2)
        if bad.any():
            return _broken(int(changed_groups[bad][0]), n_cells, cells,
                           "its events do not chain from the value held to one final "
                           "value (an event is missing or altered)")
    plus_first = nz_weight[0::2] > 0
    final_vc = np.where(plus_first, nz_value[0::2], nz_value[1::2])
    initial_vc = np.where(plus_first, nz_value[1::2], nz_value[0::2])
    # -- across intervals: each cell's chain ------------------------------------------
    touched = np.unique(group)
    t_iv, t_kc = np.divmod(touched, n_cells)
    order = np.lexsort((t_iv, t_kc))  # by cell, then interval
    t_kc, touched = t_kc[order], touched[order]
    m = len(touched)
    t_final = np.full(m, -1, dtype=np.int64)
    t_initial = np.full(m, -1, dtype=np.int64)
    is_changed = np.zeros(m, dtype=bool)
    if len(changed_groups):
        where = np.minimum(np.searchsorted(changed_groups, touched), len(changed_groups) - 1)
        is_changed = changed_groups[where] == touched
        t_final = np.where(is_changed, final_vc[where], -1)
        t_initial = np.where(is_changed, initial_vc[where], -1)
    positions = np.arange(m)
    first = np.ones(m, dtype=bool)
    first[1:] = t_kc[1:] != t_kc[:-1]
    start = np.maximum.accumulate(np.where(first, positions, 0))
    last_changed = np.maximum.accumulate(np.where(is_changed, positions, -1))
    before_me = np.concatenate(([-1], last_changed[:-1]))
    from_run = before_me >= start
    start_vc = np.where(from_run, t_final[np.maximum(before_me, 0)], held_vc[t_kc])
    wrong_start = is_changed & (t_initial != start_vc)
    if wrong_start.any():
        i = int(np.flatnonzero(wrong_start)[0])
        return _broken(int(touched[i]), n_cells, cells,
                       "its first event did not replace the value the cell held")
    loops = ~is_changed
    if loops.any():
        replaced = np.unique(group * n_values + old_vc)
        wanted = touched[loops] * n_values + start_vc[loops]
        missing = ~np.isin(wanted, replaced)
        if missing.any():
            i = int(np.flatnonzero(loops)[np.flatnonzero(missing)[0]])
            return _broken(int(touched[i]), n_cells, cells,
                           "its events never replaced the value held")
    # -- hand out what each interval changed ---------------------------------------------
    c_iv, c_kc = np.divmod(changed_groups, n_cells)
    c_keys = cells.take(pa.array(c_kc)).to_pylist()
    c_final = values.take(pa.array(final_vc)).to_pylist()
    c_initial = values.take(pa.array(initial_vc)).to_pylist()
    bounds = np.searchsorted(c_iv, np.arange(n_intervals + 1)).tolist()
    return [
        IntervalResult(
            dict(zip(c_keys[lo:hi], c_final[lo:hi], strict=True)),
            dict(zip(c_keys[lo:hi], c_initial[lo:hi], strict=True)),
            int(counts[i]),
        )
        for i, (lo, hi) in enumerate(itertools.pairwise(bounds))
    ]


def _broken(group: int, n_cells: int, cells: pa.Array, why: str) -> BrokenChain:
    interval, cell = divmod(group, n_cells)
    return BrokenChain(interval, cells[cell].as_py(), why)


class NetChanges:
    """What a run of intervals changed, flat and in interval order: interval ``i``'s
    entries are ``keys[bounds[i]:bounds[i + 1]]`` (finals, ``b""`` for ABSENT, and
    initials alike); ``counts[i]`` is how many events it had.

    ``initials`` may be given as an Arrow array: it becomes a list when first read (most
    consumers of a run of tiny intervals never ask for ``before``)."""

    __slots__ = ("_initials", "bounds", "counts", "finals", "keys")

    def __init__(self, keys: list[bytes], finals: list[bytes],
                 initials: list[bytes] | pa.Array, bounds: list[int], counts: list[int]
                 ) -> None:
        self.keys = keys
        self.finals = finals
        self._initials = initials
        self.bounds = bounds
        self.counts = counts

    @property
    def initials(self) -> list[bytes]:
        initials = self._initials
        if isinstance(initials, pa.Array):
            initials = self._initials = initials.to_pylist()
        return initials

    def __repr__(self) -> str:
        return (f"NetChanges(keys={self.keys!r}, finals={self.finals!r}, "
                f"initials={self.initials!r}, bounds={self.bounds!r}, counts={self.counts!r})")


def net_changes(state: dict[bytes, bytes], keys: pa.Array, old: pa.Array, new: pa.Array,
                interval: np.ndarray, n_intervals: int) -> NetChanges | BrokenChain:
    """``cancel_out``'s result, found faster when the events chain in the order given.

    The events come in (batch, seq) order. Where a cell's events, in that order, each
    replace the value the one before wrote (the first: the value held), their Z-set sum
    is ``+last -first`` by telescoping, so the chain proves what the cancel-out would
    check; that is one stable sort by cell and two vectorised comparisons. Cells whose
    events do not chain in that order (concurrent batches wrote them out of id order,
    or the log is damaged) go through ``cancel_out``, the reference.
    """
    n = len(keys)
    counts = np.bincount(interval, minlength=n_intervals).tolist() if n else [0] * n_intervals
    if n == 0:
        return NetChanges([], [], [], [0] * (n_intervals + 1), counts)
    encoded = pc.dictionary_encode(keys)
    cells = encoded.dictionary
    kc = encoded.indices.to_numpy()
    order = np.argsort(kc, kind="stable")
    kc_s = kc[order]
    iv_s = interval[order]
    take = pa.array(order)
    old_s, new_s = old.take(take), new.take(take)
    first = np.ones(n, dtype=bool)
    first[1:] = kc_s[1:] != kc_s[:-1]
    linked = first.copy()
    if n > 1:
        linked[1:] |= pc.equal(old_s.slice(1), new_s.slice(0, n - 1)).to_numpy(
            zero_copy_only=False)
    heads = np.flatnonzero(first)
    cell_keys = cells.to_pylist()  # each cell's bytes, made once (state lookups, output)
    held = (pa.array(list(map(state.get, cell_keys, itertools.repeat(b"", len(cell_keys)))),
                     pa.binary())
            if state else pa.repeat(pa.scalar(b"", pa.binary()), len(cell_keys)))
    linked[heads] = pc.equal(old_s.take(pa.array(heads)), held).to_numpy(zero_copy_only=False)
    bad_cells = np.unique(kc_s[~linked])
    # -- the cells that chain: one (interval, cell) group per run of equal codes --------
    group_first = first.copy()
    group_first[1:] |= iv_s[1:] != iv_s[:-1]
    starts = np.flatnonzero(group_first)
    ends = np.concatenate((starts[1:], [n])) - 1
    g_cell = kc_s[starts]
    g_iv = iv_s[starts]
    finals = new_s.take(pa.array(ends))
    initials = old_s.take(pa.array(starts))
    keep = pc.not_equal(finals, initials).to_numpy(zero_copy_only=False)
    if len(bad_cells):
        keep &= ~np.isin(g_cell, bad_cells)
    rows = np.flatnonzero(keep)
    rows = rows[np.argsort(g_iv[rows], kind="stable")]
    iv_list = g_iv[rows]
    pick = pa.array(rows)
    out_keys = list(map(cell_keys.__getitem__, g_cell[rows].tolist()))
    out_finals = finals.take(pick).to_pylist()
    picked_initials = initials.take(pick)
    out_initials: list[bytes] | pa.Array = picked_initials  # a list when read
    if len(bad_cells):
        mask = pa.array(np.isin(kc, bad_cells))
        slow = cancel_out(state, keys.filter(mask), old.filter(mask), new.filter(mask),
                          interval[mask.to_numpy(zero_copy_only=False)], n_intervals)
        if isinstance(slow, BrokenChain):
            return slow
        extra_iv = [i for i, r in enumerate(slow) for _ in range(len(r.changes))]
        merged_iv = np.concatenate((iv_list, np.array(extra_iv, dtype=iv_list.dtype)))
        merged = np.argsort(merged_iv, kind="stable").tolist()
        all_keys = out_keys + [k for r in slow for k in r.changes]
        all_finals = out_finals + [v for r in slow for v in r.changes.values()]
        all_initials = picked_initials.to_pylist() + [r.before[k] for r in slow
                                                      for k in r.changes]
        out_keys = [all_keys[i] for i in merged]
        out_finals = [all_finals[i] for i in merged]
        out_initials = [all_initials[i] for i in merged]
        iv_list = merged_iv[merged]
    bounds = np.searchsorted(iv_list, np.arange(n_intervals + 1)).tolist()
    return NetChanges(out_keys, out_finals, out_initials, bounds, counts)
