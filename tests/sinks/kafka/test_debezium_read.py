"""Debezium read records (op "r"): one per baseline cell, every value bit kept, the
decoder refusing anything else with a CodecError."""

from __future__ import annotations

import contextlib
import json
import math
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from sinks.codec import (
    HEADER_READ,
    CodecError,
    SnapshotChunk,
    cell_key,
    decode_debezium_read,
    encode_debezium_read,
    encode_value,
    partition_of,
)
from sinks.kafka._snapshots import snapshot_message

keys = st.text(max_size=6) | st.integers(-(1 << 63), (1 << 63) - 1)
values = (st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 63) - 1)
          | st.floats(allow_nan=True) | st.text(max_size=6) | st.binary(max_size=6))
cells = st.lists(st.tuples(st.sampled_from(["t", "u"]), keys, st.sampled_from(["a", "b"]),
                           values), max_size=12)


@settings(deadline=None, max_examples=60)
@given(cells, st.booleans())
def test_read_records_round_trip_every_cell(cell_list: list[tuple[object, ...]],
                                            last: bool) -> None:
    chunk = SnapshotChunk.build(5, 2, 77, 0xABC, 3, last, None, None, cell_list)  # type: ignore[arg-type]
    message = snapshot_message(chunk, "debezium", 4, "src")
    assert len(message.rows) == len(cell_list)
    snapshot_flags = []
    for (t, r, c, v), row in zip(chunk.cells(), message.rows, strict=True):
        assert decode_debezium_read(row.value)[:3] == (t, r, c)  # type: ignore[index]
        assert encode_value(decode_debezium_read(row.value)[3]) == encode_value(v)  # type: ignore[index]
        assert row.partition == partition_of(cell_key(t, chunk.data.column("row")[
            len(snapshot_flags)].as_py(), c), 4)
        assert row.headers == [(HEADER_READ, b"5:2748:3")]
        envelope = json.loads(row.value)  # type: ignore[arg-type]
        assert envelope["op"] == "r" and envelope["before"] is None
        assert envelope["source"]["baseline"] == f"{0xABC:016x}"
        assert envelope["source"]["chunk"] == 3 and envelope["source"]["read_version"] == 1
        snapshot_flags.append(envelope["source"]["snapshot"])
    expected = ["true"] * len(cell_list)
    if last and expected:
        expected[-1] = "last"
    assert snapshot_flags == expected
    assert snapshot_message(chunk, "native").rows == []


def test_a_nan_payload_survives() -> None:
    (nan,) = struct.unpack(">d", bytes.fromhex("7ff4000000000abc"))  # not the canonical NaN
    chunk = SnapshotChunk.build(1, 1, 1, 1, 0, True, None, None, [("t", 1, "a", nan)])
    ((_key, value),) = encode_debezium_read(chunk, name="x")
    got = decode_debezium_read(value)[3]
    assert isinstance(got, float) and math.isnan(got)
    assert encode_value(got) == encode_value(nan)


@settings(deadline=None, max_examples=200)
@given(st.binary(max_size=64) | st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["op", "before", "after", "source", "table", "row", "column", "a"]),
        inner, max_size=4), max_leaves=12).map(lambda o: json.dumps(o).encode()))
def test_fuzz_read_decoder_only_raises_codec_error(raw: bytes) -> None:
    with contextlib.suppress(CodecError):
        decode_debezium_read(raw)


def test_change_events_are_not_read_records() -> None:
    from sequencer import ChangeEvent
    from sinks.codec import encode_debezium_event

    _key, value = encode_debezium_event(ChangeEvent(1, 2, 0, "t", 1, "a", 1, 2), name="x",
                                        data_collection_order=1)
    try:
        decode_debezium_read(value)
    except CodecError as exc:
        assert "not a read record" in str(exc)
    else:
        raise AssertionError("a change event was read as a read record")
