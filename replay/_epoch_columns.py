"""Epoch records as columns: how the assembler verifies a run of intervals at once.

A busy agent closes two epochs per automatic batch (its own and the quiescence marker),
so a run of one-event intervals holds two epoch records per event. One Python object
and one Python step per record cost more than the event itself; here the records of a
run are numpy columns, taken straight from an EPOCHS message's Arrow columns
(``sinks.codec.EpochRun``) or, for records that came one by one, gathered once.

The checks (``first_*_fault``) find the first epoch whose record disagrees with the
events. They may be stricter than the one-interval reference (``replay._assembler``)
but never more lenient: an epoch they flag is verified again by the reference, which
names the fault exactly (or accepts it); an epoch they pass, the reference passes too.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sequencer import NATIVE, EpochRecord
from sinks import SETSUM_PRIMES, EpochRun
from sinks.codec import SEGMENT_BITS, segment_digest_array

__all__ = ["EpochColumns", "first_count_fault", "first_setsum_fault", "first_table_fault",
           "first_tiling_fault"]

# What a record says of its setsum: nothing (an unfilled ""), a digest, or a text that
# is no canonical digest (it can equal no computed setsum: always a fault).
SETSUM_NONE: Final = 0
SETSUM_DIGEST: Final = 1
SETSUM_BOGUS: Final = 2

# C passes over many records or segments (None: not built; Python, the same results).
_SHA3_SEGMENTS: Final = NATIVE.sha3_segments if NATIVE is not None else None
_SHA3_LANES: Final = NATIVE.sha3_lanes if NATIVE is not None else (lambda: 1)
_EPOCH_FIELDS: Final = NATIVE.epoch_fields if NATIVE is not None else None
_SETSUM_FAULT: Final = NATIVE.setsum_fault if NATIVE is not None else None
_PRIMES: Final = np.array(SETSUM_PRIMES, dtype=np.uint64)
_HEX: Final = frozenset("0123456789abcdef")


@dataclass(frozen=True, slots=True)
class EpochColumns:
    """Consecutive epoch records of one domain, one numpy column per field.

    Record ``k`` lists the tables ``table_names[table_offsets[k]:table_offsets[k + 1]]``
    with the counts ``table_counts`` alike; ``lanes[k]`` is its setsum digest as eight
    little-endian 32-bit lanes (meaningful where ``setsum_kind[k]`` is SETSUM_DIGEST).
    """

    seqs: np.ndarray  # uint64
    begins: np.ndarray  # uint64
    ends: np.ndarray  # uint64
    counts: np.ndarray  # uint64
    quiescent: np.ndarray  # bool
    lanes: np.ndarray  # uint32, shape (n, 8)
    setsum_kind: np.ndarray  # int8
    table_offsets: np.ndarray  # int64, n + 1
    table_names: pa.Array  # utf8
    table_counts: np.ndarray  # uint64

    def __len__(self) -> int:
        return len(self.seqs)

    @classmethod
    def of_run(cls, run: EpochRun) -> EpochColumns:
        """A run's columns, without a Python step per record."""
        data = run.data
        n = data.num_rows
        digests = data.column(7)
        body = digests.buffers()[1]
        raw = (np.frombuffer(body, dtype="<u4", count=8 * n, offset=32 * digests.offset)
               if body is not None and n else np.zeros(0, dtype="<u4"))
        lists = data.column(8)
        offsets = lists.offsets.to_numpy().astype(np.int64)
        items = lists.flatten()
        return cls(
            data.column(1).to_numpy(), data.column(2).to_numpy(), data.column(3).to_numpy(),
            data.column(4).to_numpy(), data.column(5).to_numpy(zero_copy_only=False),
            raw.reshape(n, 8), np.full(n, SETSUM_DIGEST, dtype=np.int8),
            offsets - offsets[0], items.field(0), items.field(1).to_numpy())

    @classmethod
    def of_records(cls, records: Sequence[EpochRecord]) -> EpochColumns:
        """The columns of records that came one by one: one pass in C
        (``sequencer.NATIVE.epoch_fields``) if built, else each field gathered by map."""
        found = cls.of_records_native(records)
        return cls.of_records_py(records) if found is None else found[0]

    @classmethod
    def of_records_native(cls, records: Sequence[EpochRecord]
                          ) -> tuple[EpochColumns, np.ndarray] | None:
        """The columns of ``records`` and their domain ids (uint64), read in one C pass;
        None if the extension is not built or a record is of another shape."""
        fields = _EPOCH_FIELDS(records) if _EPOCH_FIELDS is not None else None
        if fields is None:
            return None
        return cls._of_fields(len(records), *fields)

    @classmethod
    def _of_fields(cls, n: int, ints: bytes, quiescent: bytes, digests: bytes, kinds: bytes,
                   table_lengths: bytes, table_names: list[str], table_counts: bytes
                   ) -> tuple[EpochColumns, np.ndarray]:
        columns = np.frombuffer(ints, dtype=np.uint64).reshape(5, n)
        return cls(
            columns[0], columns[1], columns[2], columns[3],
            np.frombuffer(quiescent, dtype=bool), np.frombuffer(digests, "<u4").reshape(n, 8),
            np.frombuffer(kinds, dtype=np.int8),
            np.concatenate(([0], np.cumsum(np.frombuffer(table_lengths, np.int64)))),
            pa.array(table_names, pa.utf8()), np.frombuffer(table_counts, dtype=np.uint64)
        ), columns[4]

    @classmethod
    def of_records_py(cls, records: Sequence[EpochRecord]) -> EpochColumns:
        """``of_records`` in Python (the reference for the C pass)."""
        n = len(records)
        lanes, kinds = _setsum_lanes([r.setsum for r in records])
        tables = [r.table_counts for r in records]
        pairs = list(itertools.chain.from_iterable(tables))
        return cls(
            np.fromiter(map(_SEQ, records), np.uint64, n),
            np.fromiter(map(_BEGIN, records), np.uint64, n),
            np.fromiter(map(_END, records), np.uint64, n),
            np.fromiter(map(_COUNT, records), np.uint64, n),
            np.fromiter(map(_QUIET, records), bool, n), lanes, kinds,
            np.concatenate(([0], np.cumsum(np.fromiter(map(len, tables), np.int64, n)))),
            pa.array([name for name, _ in pairs], pa.utf8()),
            np.array([count for _, count in pairs], dtype=np.uint64))

    @staticmethod
    def concat(parts: Sequence[EpochColumns]) -> EpochColumns:
        if len(parts) == 1:
            return parts[0]
        shifts = np.cumsum([0] + [p.table_offsets[-1] for p in parts[:-1]])
        return EpochColumns(
            np.concatenate([p.seqs for p in parts]),
            np.concatenate([p.begins for p in parts]),
            np.concatenate([p.ends for p in parts]),
            np.concatenate([p.counts for p in parts]),
            np.concatenate([p.quiescent for p in parts]),
            np.concatenate([p.lanes for p in parts]),
            np.concatenate([p.setsum_kind for p in parts]),
            np.concatenate([parts[0].table_offsets[:1]]
                           + [p.table_offsets[1:] + s for p, s in zip(parts, shifts,
                                                                      strict=True)]),
            pa.concat_arrays([p.table_names for p in parts]),
            np.concatenate([p.table_counts for p in parts]))

    def head(self, n: int) -> EpochColumns:
        """The first ``n`` records."""
        if n == len(self):
            return self
        lo, hi = 0, int(self.table_offsets[n])
        return EpochColumns(
            self.seqs[:n], self.begins[:n], self.ends[:n], self.counts[:n],
            self.quiescent[:n], self.lanes[:n], self.setsum_kind[:n],
            self.table_offsets[:n + 1], self.table_names.slice(lo, hi - lo),
            self.table_counts[lo:hi])

    def take(self, order: np.ndarray) -> EpochColumns:
        """The records at the indexes ``order``, in that order."""
        lengths = np.diff(self.table_offsets)[order]
        offsets = np.concatenate(([0], np.cumsum(lengths)))
        # Each kept record's table items, where they were: its old start plus 0, 1, ...
        items = (np.repeat(self.table_offsets[:-1][order] - offsets[:-1], lengths)
                 + np.arange(offsets[-1]))
        return EpochColumns(
            self.seqs[order], self.begins[order], self.ends[order], self.counts[order],
            self.quiescent[order], self.lanes[order], self.setsum_kind[order],
            offsets, self.table_names.take(pa.array(items, pa.int64())),
            self.table_counts[items])


_SEQ, _BEGIN, _END, _COUNT, _QUIET = map(operator.attrgetter, (
    "epoch_seq", "begin_id", "end_id", "event_count", "quiescent"))


def _setsum_lanes(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Records' setsum texts as lanes, with what each says (SETSUM_NONE/DIGEST/BOGUS)."""
    n = len(texts)
    joined = "".join(texts)
    # The usual case, checked in C: every text 64 lowercase hex digits.
    if set(map(len, texts)) == {64} and joined == joined.lower():
        try:
            raw = bytes.fromhex(joined)
        except ValueError:
            raw = b""
        if len(raw) == 32 * n:
            return (np.frombuffer(raw, dtype="<u4").reshape(n, 8),
                    np.full(n, SETSUM_DIGEST, dtype=np.int8))
    kinds = np.zeros(n, dtype=np.int8)
    digests = bytearray(32 * n)
    for k, text in enumerate(texts):
        if not text:
            continue
        if len(text) == 64 and _HEX.issuperset(text):
            kinds[k] = SETSUM_DIGEST
            digests[32 * k:32 * k + 32] = bytes.fromhex(text)
        else:
            kinds[k] = SETSUM_BOGUS
    return np.frombuffer(bytes(digests), dtype="<u4").reshape(n, 8), kinds


def first_tiling_fault(columns: EpochColumns, applied_end: int) -> int | None:
    """The first epoch that does not begin where the one before it ended."""
    expected = np.concatenate((np.array([applied_end], dtype=np.uint64), columns.ends[:-1]))
    bad = np.flatnonzero(columns.begins != expected)
    return int(bad[0]) if len(bad) else None


def first_count_fault(columns: EpochColumns, epoch_index: np.ndarray) -> int | None:
    """The first epoch whose event count is not its record's."""
    n = len(columns)
    seen = np.bincount(epoch_index, minlength=n)[:n].astype(np.uint64)
    bad = np.flatnonzero(seen != columns.counts)
    return int(bad[0]) if len(bad) else None


def first_table_fault(columns: EpochColumns, tables: pa.Array, epoch_index: np.ndarray
                      ) -> int | None:
    """The first epoch (with events) whose per-table counts are not the record's.

    ``tables`` is each event's table. As in the reference, nothing is checked when no
    record of the run lists tables, nor for an epoch whose record says no events; an
    epoch listing a table twice is flagged (the reference reads the list as a dict).
    """
    names = columns.table_names
    if not len(names):
        return None
    n = len(columns)
    checked = columns.counts != 0
    one = _one_table_fault(columns, tables, epoch_index, checked)
    if one is not _NOT_ONE_TABLE:
        return one  # type: ignore[return-value]
    item_epoch = np.repeat(np.arange(n, dtype=np.int64), np.diff(columns.table_offsets))
    encoded = pc.dictionary_encode(pa.concat_arrays([tables, names]))
    codes = encoded.indices.to_numpy().astype(np.int64)
    width = len(encoded.dictionary)
    event_codes, item_codes = codes[:len(tables)], codes[len(tables):]
    keep = checked[item_epoch]
    exp_key = item_epoch[keep] * width + item_codes[keep]
    exp_count = columns.table_counts[keep]
    faults: list[int] = []
    order = np.argsort(exp_key, kind="stable")
    exp_key, exp_count = exp_key[order], exp_count[order]
    twice = np.flatnonzero(exp_key[1:] == exp_key[:-1])
    if len(twice):
        faults.append(int(exp_key[twice[0]] // width))
    events_checked = checked[np.minimum(epoch_index, n - 1)] & (epoch_index < n)
    seen_key, seen_count = np.unique(
        epoch_index[events_checked].astype(np.int64) * width + event_codes[events_checked],
        return_counts=True)
    # Both sides sorted by key: the same keys with the same counts, or a fault at the
    # first key where they part (found on one side only, or with another count). Up to
    # there both agree, so the smaller of the two keys there is the first fault.
    m = min(len(seen_key), len(exp_key))
    bad = np.flatnonzero((seen_key[:m] != exp_key[:m])
                         | (seen_count[:m].astype(np.uint64) != exp_count[:m]))
    if len(bad):
        faults.append(int(min(seen_key[bad[0]], exp_key[bad[0]]) // width))
    elif len(seen_key) != len(exp_key):  # one side goes on: its next key is the fault
        longer = seen_key if len(seen_key) > m else exp_key
        faults.append(int(longer[m] // width))
    return min(faults) if faults else None


_NOT_ONE_TABLE: Final = object()


def _one_table_fault(columns: EpochColumns, tables: pa.Array, epoch_index: np.ndarray,
                     checked: np.ndarray) -> int | object | None:
    """``first_table_fault`` where every event is of one table, the one every record
    names, and each record with events lists it once (a one-table log): the first epoch
    with events whose count of events is not its table's count (or that count is 0, which
    the reference refuses too). ``_NOT_ONE_TABLE`` where the log is not of that kind."""
    names = columns.table_names
    if (not len(tables) or not len(names) or tables.null_count or names.null_count
            or not (np.diff(columns.table_offsets)[checked] == 1).all()):
        return _NOT_ONE_TABLE
    name = names[0]
    if not (pc.all(pc.equal(names, name)).as_py() and pc.all(pc.equal(tables, name)).as_py()):
        return _NOT_ONE_TABLE
    n = len(columns)
    seen = np.bincount(epoch_index, minlength=n)[:n].astype(np.uint64)
    expected = np.zeros(n, dtype=np.uint64)
    expected[checked] = columns.table_counts[columns.table_offsets[:-1][checked]]
    bad = np.flatnonzero(checked & ((seen != expected) | (expected == 0)))
    return int(bad[0]) if len(bad) else None


def first_setsum_fault(columns: EpochColumns, data: pa.Table | pa.RecordBatch,
                       epoch_index: np.ndarray) -> int | None:
    """The first epoch whose events' setsum is not the record's (one SHA3 per segment;
    digests summed per epoch as lanes, modulo the setsum primes, all at once)."""
    kinds = columns.setsum_kind
    wanted = np.flatnonzero(kinds != SETSUM_NONE)
    if not len(wanted):
        return None
    n = len(columns)
    starts, digests = segment_digests_at(data)
    owner = epoch_index[starts]
    if _SETSUM_FAULT is not None:  # the same sums and comparisons, one pass in C
        bad_epoch = _SETSUM_FAULT(digests, np.ascontiguousarray(owner, np.int64),
                                  np.ascontiguousarray(columns.lanes),
                                  np.ascontiguousarray(columns.setsum_kind), _PRIMES)
        return None if bad_epoch < 0 else int(bad_epoch)
    lanes = np.frombuffer(digests, dtype="<u4").reshape(-1, 8).astype(np.uint64)
    cumulative = np.zeros((len(lanes) + 1, 8), dtype=np.uint64)
    np.cumsum(lanes, axis=0, out=cumulative[1:])
    bounds = np.searchsorted(owner, np.arange(n + 1))
    sums = (cumulative[bounds[1:]] - cumulative[bounds[:-1]]) % _PRIMES
    differs = (sums[wanted] != columns.lanes[wanted]).any(axis=1)
    differs |= kinds[wanted] == SETSUM_BOGUS
    bad = wanted[differs]
    return int(bad[0]) if len(bad) else None


_SEGMENT_TYPES: Final = (pa.binary(), pa.utf8())
# Where the C helpers hash one message at a time (no AVX2), segments longer than this on
# average go to the codec: hashlib (OpenSSL) hashes a 136-byte block faster than the
# scalar Keccak (measured: 0.36 vs 0.45 us). Four at a time, the C helpers are the faster
# for items of every length (measured per item: 0.52 vs 1.63 us at 130 bytes, 3.0 vs 4.1
# at 800, 18.3 vs 20.2 at 5,000; bench.core's assembler on one log, batches of 20:
# 1.21-1.28x). A lone item over 512 KiB is hashed one at a time, a little slower.
_C_ROWS_PER_SEGMENT: Final = 4


def segment_digests_at(data: pa.Table | pa.RecordBatch) -> tuple[np.ndarray, bytes]:
    """``sinks.codec.segment_digest_array(data)``: the row each segment starts at and
    the segments' SHA3 digests. With the C extension, every item is built and hashed
    in one call (``sequencer.NATIVE.sha3_segments``, which the shipper uses too), the
    same bytes hashed as the codec's."""
    if isinstance(data, pa.Table):
        data = (data.combine_chunks().to_batches()[0] if data.num_rows
                else pa.RecordBatch.from_pylist([], schema=data.schema))
    n = data.num_rows
    if (_SHA3_SEGMENTS is None or not n
            or any(data.column(k).type not in _SEGMENT_TYPES for k in range(3, 8))):
        return segment_digest_array(data)
    domains = data.column(0).to_numpy()
    batches = data.column(1).to_numpy()
    seqs = data.column(2).to_numpy()
    segments = seqs >> SEGMENT_BITS
    change = np.flatnonzero((domains[1:] != domains[:-1]) | (batches[1:] != batches[:-1])
                            | (segments[1:] != segments[:-1])) + 1
    if n > _C_ROWS_PER_SEGMENT * (len(change) + 1) and _SHA3_LANES() == 1:
        return segment_digest_array(data)  # long items, one at a time: OpenSSL's is faster
    bounds = np.concatenate(([0], change, [n])).astype(np.int64)
    starts = bounds[:-1]
    columns = []
    for k in range(3, 8):
        column = data.column(k)
        offsets, values = column.buffers()[1:3]
        columns.append((np.frombuffer(offsets, np.int32, count=n + 1, offset=4 * column.offset),
                        values if values is not None else b""))
    digests = _SHA3_SEGMENTS(bounds, np.ascontiguousarray(domains[starts]),
                             np.ascontiguousarray(batches[starts]),
                             np.ascontiguousarray(seqs, dtype=np.uint32), tuple(columns))
    return starts, digests
