"""Codec version 2: SNAPSHOT chunks round trip, bad bytes refused, version-1 logs still read."""

from __future__ import annotations

import contextlib
import json
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay import Assembler
from sequencer import EpochRecord
from sinks.codec import (
    FORMAT_VERSION,
    CodecError,
    EventBatch,
    SnapshotChunk,
    decode,
    encode_epoch,
    encode_events,
    encode_snapshot,
    encode_value,
)

FIXTURE = Path(__file__).parents[1] / "fixtures/logs/v1"

keys = st.text(max_size=8) | st.integers(-(1 << 63), (1 << 63) - 1)
values = (st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 63) - 1)
          | st.floats(allow_nan=True) | st.text(max_size=8) | st.binary(max_size=8))
bounds = st.none() | st.tuples(st.text(max_size=5), st.none() | keys)
cells = st.lists(st.tuples(st.text(max_size=5), keys, st.text(max_size=5), values),
                 max_size=20)


@settings(deadline=None)
@given(cells, bounds, bounds, st.booleans(), st.integers(0, (1 << 32) - 1))
def test_snapshot_chunks_round_trip_bit_for_bit(cell_list: list[tuple[object, ...]],
                                                lo: object, hi: object, last: bool,
                                                index: int) -> None:
    chunk = SnapshotChunk.build(7, 3, 99, 1234, index, last, lo, hi, cell_list)  # type: ignore[arg-type]
    raw = encode_snapshot(chunk)
    assert raw[:5] == b"CDC\x02\x03"
    back = decode(raw)
    assert isinstance(back, SnapshotChunk)
    assert (back.domain_id, back.epoch_seq, back.end_id, back.baseline_id, back.index,
            back.last, back.lo, back.hi, back.cell_count, back.setsum) == (
        7, 3, 99, 1234, index, last, lo, hi, len(cell_list), chunk.setsum)
    assert back.data.equals(chunk.data)
    assert back.actual_setsum() == chunk.setsum
    assert [(t, r, c, encode_value(v)) for t, r, c, v in back.cells()] == [
        (t, r, c, encode_value(v)) for t, r, c, v in cell_list]  # type: ignore[arg-type]
    assert encode_snapshot(back) == raw


def test_the_setsum_covers_header_and_cells() -> None:
    base = SnapshotChunk.build(1, 2, 3, 4, 0, False, None, ("t", 5), [("t", 1, "a", 1)])
    others = [
        SnapshotChunk.build(1, 2, 3, 4, 0, False, None, ("t", 6), [("t", 1, "a", 1)]),
        SnapshotChunk.build(1, 2, 3, 4, 1, False, None, ("t", 5), [("t", 1, "a", 1)]),
        SnapshotChunk.build(1, 3, 3, 4, 0, False, None, ("t", 5), [("t", 1, "a", 1)]),
        SnapshotChunk.build(1, 2, 3, 4, 0, True, None, ("t", 5), [("t", 1, "a", 1)]),
        SnapshotChunk.build(1, 2, 3, 4, 0, False, None, ("t", 5), [("t", 1, "a", True)]),
        SnapshotChunk.build(1, 2, 3, 4, 0, False, None, ("t", 5), [("t", 1, "b", 1)]),
    ]
    assert all(o.setsum != base.setsum for o in others)


@settings(suppress_health_check=list(HealthCheck), max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 400))
def test_fuzz_snapshot_decoder_only_raises_codec_error(noise: bytes, cut: int) -> None:
    """Untrusted bytes: a valid chunk cut short or overwritten, or noise, decodes or
    raises CodecError, nothing else."""
    good = encode_snapshot(SnapshotChunk.build(1, 2, 3, 4, 0, False, ("t", None), ("u", "k"),
                                               [("t", 1, "a", 1.5), ("t", "x", "b", b"z")]))
    for raw in (b"CDC\x02\x03" + noise, good[:cut], good[:cut] + noise + good[cut + len(noise):]):
        with contextlib.suppress(CodecError):
            decode(raw)


def test_kind_3_needs_version_2_and_unknown_versions_are_refused() -> None:
    good = encode_snapshot(SnapshotChunk.build(1, 2, 3, 4, 0, True, None, None, []))
    with pytest.raises(CodecError, match="unknown message kind"):
        decode(b"CDC\x01" + good[4:])
    with pytest.raises(CodecError, match="version 4; this reader knows versions 1, 2, 3"):
        decode(b"CDC\x04" + good[4:])


def _fixture_messages() -> list[bytes]:
    raw = (FIXTURE / "messages.bin").read_bytes()
    messages, pos = [], 0
    while pos < len(raw):
        (n,) = struct.unpack_from(">I", raw, pos)
        messages.append(raw[pos + 4: pos + 4 + n])
        pos += 4 + n
    return messages


def test_a_version_1_log_still_replays_bit_for_bit() -> None:
    """A log written by codec version 1 (tests/fixtures/logs/v1, made by make_v1.py with
    the version-1 code) decodes, re-encodes to the same payloads under this version, and
    replays to the very states recorded then, every value bit for bit."""
    messages = _fixture_messages()
    assert messages and all(m[:4] == b"CDC\x01" for m in messages)
    decoded = [decode(m) for m in messages]
    for message, record in zip(messages, decoded, strict=True):
        again = (encode_events(record) if isinstance(record, EventBatch)
                 else encode_epoch(record) if isinstance(record, EpochRecord) else b"")
        assert again[3] == FORMAT_VERSION and again[4:] == message[4:]
    expected = json.loads((FIXTURE / "states.json").read_text())
    got = [{"epoch_seq": s.epoch_seq,
            "cells": sorted([t, encode_value(r).hex(), c, encode_value(v).hex()]
                            for (t, r, c), v in s.state.items())}
           for s in Assembler().replay(decoded)]  # type: ignore[arg-type]
    assert got == expected and len(got) > 50


ints = st.integers(-(1 << 63), (1 << 63) - 1)
floats = st.floats(allow_nan=True) | st.integers(0, (1 << 64) - 1).map(
    lambda bits: struct.unpack(">d", bits.to_bytes(8, "big"))[0])  # any NaN payload


@settings(deadline=None)
@given(st.lists(ints, min_size=1, max_size=30) | st.lists(floats, min_size=1, max_size=30),
       st.lists(ints, min_size=1, max_size=30) | st.lists(keys, min_size=1, max_size=30))
def test_single_kind_columns_are_laid_out_like_encode_value(vals: list[object],
                                                             rows: list[object]) -> None:
    """A chunk whose values (or row keys) are all ints or all floats takes the direct
    layout: it must be encode_value's bytes exactly, every float bit included."""
    n = min(len(vals), len(rows))
    cell_list = [("t", rows[i], "c", vals[i]) for i in range(n)]
    chunk = SnapshotChunk.build(1, 2, 3, 4, 0, True, None, None, cell_list)  # type: ignore[arg-type]
    assert chunk.data.column("value").to_pylist() == [encode_value(v) for v in vals[:n]]  # type: ignore[arg-type]
    assert chunk.data.column("row").to_pylist() == [encode_value(r) for r in rows[:n]]  # type: ignore[arg-type]
