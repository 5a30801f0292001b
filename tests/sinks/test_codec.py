"""The codec: values and keys bit for bit, messages round trip, bad bytes refused."""

from __future__ import annotations

import struct

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sequencer import ABSENT, ChangeEvent, EpochRecord
from sinks.codec import (
    EVENT_SCHEMA,
    CodecError,
    EventBatch,
    decode,
    decode_key,
    decode_value,
    encode_epoch,
    encode_events,
    encode_key,
    encode_value,
    encode_values,
    segment_digests,
)

floats_any_bits = st.integers(0, (1 << 64) - 1).map(
    lambda b: struct.unpack("<d", struct.pack("<Q", b))[0])
values = (st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 63) - 1)
          | floats_any_bits | st.text() | st.binary() | st.just(ABSENT))


@given(values)
def test_values_round_trip_bit_for_bit(value: object) -> None:
    """decode(encode(v)) has the same type and the same bits."""
    raw = encode_value(value)  # type: ignore[arg-type]
    back = decode_value(raw)
    assert type(back) is type(value)
    assert encode_value(back) == raw


@given(st.text() | st.integers(-(1 << 63), (1 << 63) - 1))
def test_row_keys_round_trip(key: str | int) -> None:
    assert decode_key(encode_key(key)) == key


events = st.builds(
    ChangeEvent, st.integers(1, (1 << 63) - 1), st.integers(1, (1 << 64) - 1),
    st.integers(0, (1 << 32) - 1), st.sampled_from(["t", "u"]), st.text() | st.integers(0, 9),
    st.sampled_from(["a", "b"]), values, values)


@settings(deadline=None)  # Arrow's first calls are slow on a loaded machine
@given(st.lists(events, max_size=20))
def test_event_messages_round_trip(batch: list[ChangeEvent]) -> None:
    """encode_events then decode gives back the same events."""
    decoded = decode(encode_events(EventBatch.from_events(batch)))
    assert isinstance(decoded, EventBatch)
    expected = [encode_value(e.new) for e in batch]
    assert [encode_value(e.new) for e in decoded.to_events()] == expected
    assert [e.identity for e in decoded.to_events()] == [e.identity for e in batch]


@given(st.builds(EpochRecord, st.integers(1, (1 << 63) - 1), st.integers(1, 1 << 40),
                 st.integers(0, (1 << 64) - 1), st.integers(1, (1 << 64) - 1),
                 st.integers(0, 1 << 40), st.booleans(),
                 st.lists(st.tuples(st.sampled_from(["t", "ü"]), st.integers(0, 99)),
                          max_size=2, unique_by=lambda x: x[0]).map(tuple),
                 st.binary(min_size=32, max_size=32).map(bytes.hex),
                 st.none() | st.integers(0, 1000)))
def test_epoch_messages_round_trip(record: EpochRecord) -> None:
    assert decode(encode_epoch(record)) == record


@pytest.mark.parametrize(("raw", "message"), [
    (b"XYZ\x01\x01", "not a cdc-agent message"),
    (b"CDC\x09\x01", "version 9"),
    (b"CDC\x01\x07", "unknown message kind"),
    (b"CDC\x01\x02\x00", "corrupt EPOCH"),
    (b"CDC\x01\x01garbage", "corrupt EVENTS"),
])
def test_bad_messages_are_refused_clearly(raw: bytes, message: str) -> None:
    with pytest.raises(CodecError, match=message):
        decode(raw)


def test_segment_digest_ignores_transport_chunking_but_not_content() -> None:
    """The same segment gives the same digest however it was encoded; any change alters it."""
    batch = [ChangeEvent(1, 5, i, "t", i, "a", ABSENT, i) for i in range(4)]
    whole = list(segment_digests(EventBatch.from_events(batch).data))
    decoded = decode(encode_events(EventBatch.from_events(batch)))
    assert isinstance(decoded, EventBatch)
    assert list(segment_digests(decoded.data)) == whole and len(whole) == 1
    altered = [*batch[:3], ChangeEvent(1, 5, 3, "t", 3, "a", ABSENT, 4)]
    assert list(segment_digests(EventBatch.from_events(altered).data)) != whole


@given(st.lists(values, max_size=30) | st.lists(floats_any_bits | st.just(ABSENT), max_size=30)
       | st.lists(st.none() | st.just(ABSENT), max_size=5)
       | st.lists(st.booleans() | st.just(ABSENT), max_size=5)
       | st.lists(st.integers(-(1 << 63), (1 << 63) - 1) | st.just(ABSENT), max_size=30)
       | st.lists(st.text() | st.just(ABSENT), max_size=30) | st.lists(st.binary(), max_size=30))
def test_vectorised_encoding_gives_the_same_bytes(batch: list[object]) -> None:
    """encode_values is encode_value over a list, bit for bit, whatever mix of types."""
    from sinks.codec import encode_values

    assert encode_values(batch).to_pylist() == [encode_value(v) for v in batch]  # type: ignore[arg-type]


@given(st.lists(st.text() | st.integers(-(1 << 63), (1 << 63) - 1), max_size=30))
def test_vectorised_key_encoding_gives_the_same_bytes(keys: list[str | int]) -> None:
    from sinks.codec import encode_keys

    assert encode_keys(keys).to_pylist() == [encode_key(k) for k in keys]


def test_an_offset_past_the_data_is_refused_at_decode_not_a_crash() -> None:
    """An Arrow offset pointing past the values (one flipped bit) is a CodecError from
    decode; before, decode passed it and to_events() read out of bounds (segfault)."""
    batch = [ChangeEvent(1, i, i, "t", i, "c", "abcd" + str(i), None) for i in range(3)]
    message = encode_events(EventBatch.from_events(batch))
    offsets = struct.pack("<4i", 0, 6, 12, 18)  # the "old" column's offsets
    assert message.count(offsets) == 1
    with pytest.raises(CodecError, match=r"corrupt EVENTS payload: .*[Oo]ffset"):
        decode(message.replace(offsets, struct.pack("<4i", 0, 6, 12, 1 << 20)))


def _raw_message(**columns: list[object]) -> bytes:
    """An EVENTS message of one event whose columns are given raw (no encoding)."""
    row: dict[str, list[object]] = {
        "domain_id": [1], "batch_id": [2], "seq": [0], "table": ["t"], "row": [b"\x02" + bytes(8)],
        "column": ["c"], "old": [b""], "new": [b"\x00"]}
    row.update(columns)
    return encode_events(pa.RecordBatch.from_pydict(row, schema=EVENT_SCHEMA))


@pytest.mark.parametrize(("columns", "message"), [
    ({"row": [b""]}, "row is not a tagged key"),
    ({"row": [b"\x05abc"]}, "row is not a tagged key"),
    ({"row": [b"\x02\x00"]}, "row is not a tagged key"),
    ({"row": [b"\x04\xff"]}, "not UTF-8"),
    ({"old": [b"\x01\x07"]}, "old is not a tagged value"),
    ({"new": [b"\x09"]}, "new is not a tagged value"),
    ({"new": [b"\x03\x00"]}, "new is not a tagged value"),
    ({"new": [b"\x00\x00"]}, "new is not a tagged value"),
    ({"old": [b"\x04\xc3"]}, "not UTF-8"),
    ({"table": [None]}, "holds nulls"),
    ({"new": [None]}, "holds nulls"),
])
def test_bad_tags_are_refused_at_decode(columns: dict[str, list[object]], message: str) -> None:
    """Row keys and cells that are not tagged keys/values fail decode with CodecError, so
    no reader of the columns (to_events, bulk replay) meets them later."""
    raw = _raw_message(**columns)
    with pytest.raises(CodecError, match=message):
        decode(raw)


def test_good_tags_pass_decode() -> None:
    """Every tag the format defines passes (the checks refuse only what is wrong)."""
    cells = [b"", b"\x00", b"\x01\x00", b"\x01\x01", b"\x02" + bytes(8), b"\x03" + bytes(8),
             b"\x04", "\x04é".encode(), b"\x05", b"\x05\xff\xfe"]
    rows = [b"\x02" + bytes(8), b"\x04", b"\x04k"] * 4
    n = len(cells)
    raw = encode_events(pa.RecordBatch.from_pydict({
        "domain_id": [1] * n, "batch_id": [2] * n, "seq": list(range(n)), "table": ["t"] * n,
        "row": rows[:n], "column": ["c"] * n, "old": cells, "new": cells[::-1]},
        schema=EVENT_SCHEMA))
    decoded = decode(raw)
    assert isinstance(decoded, EventBatch)
    assert [encode_value(e.old) for e in decoded.to_events()] == cells


def test_a_str_value_that_is_not_utf8_is_a_codec_error() -> None:
    """decode_value/decode_key raise CodecError (not UnicodeDecodeError) on bad UTF-8."""
    with pytest.raises(CodecError, match="not UTF-8"):
        decode_value(b"\x04\xff")
    with pytest.raises(CodecError, match="not UTF-8"):
        decode_key(b"\x04\xc3")


# -- golden bytes: the format on disk and on the wire must not drift ----------------------

GOLDEN_VALUES = [
    (None, "00"), (True, "0101"), (False, "0100"), (-2, "02fffffffffffffffe"),
    (1.5, "033ff8000000000000"), (-0.0, "038000000000000000"), ("é", "04c3a9"),
    (b"\xff", "05ff"), (ABSENT, ""),
]


@pytest.mark.parametrize(("value", "golden"), GOLDEN_VALUES)
def test_tagged_values_are_the_documented_bytes(value: object, golden: str) -> None:
    """Each tag and its big-endian payload, byte for byte (version 1 of the format)."""
    assert encode_value(value).hex() == golden  # type: ignore[arg-type]
    assert encode_values([value, value]).to_pylist() == [bytes.fromhex(golden)] * 2
    back = decode_value(bytes.fromhex(golden))
    assert type(back) is type(value) and encode_value(back).hex() == golden


def test_keys_and_epoch_messages_are_the_documented_bytes() -> None:
    """Row keys, and an EPOCH message field by field, as the module docstring lays out."""
    assert encode_key(7).hex() == "020000000000000007" and encode_key("k").hex() == "046b"
    record = EpochRecord(0x0102030405060708, 2, 3, 4, 5, True, (("t", 6),), "ab" * 32, 9)
    body = ("0102030405060708" "0000000000000002" "0000000000000003"
            "0000000000000004" "0000000000000005" "03" "00000009" + "ab" * 32
            + "0001" "0001" "74" "0000000000000006")
    assert encode_epoch(record).hex() == "434443" "03" "02" + body  # written as version 3
    assert decode(bytes.fromhex("434443" "02" "02" + body)) == record  # version 2 still read
    assert decode(bytes.fromhex("434443" "01" "02" + body)) == record  # version 1 still read


def test_trailing_bytes_after_an_epoch_are_refused() -> None:
    raw = encode_epoch(EpochRecord(1, 2, 3, 4, 5, False))
    with pytest.raises(CodecError, match="trailing"):
        decode(raw + b"\x00")


def reference_segment_digests(events: list[ChangeEvent]) -> list[tuple[int, int, str]]:
    """The setsum items as the module docstring defines them, written independently."""
    import hashlib

    out = []
    groups: dict[tuple[int, int, int], list[ChangeEvent]] = {}
    for e in events:
        groups.setdefault((e.domain_id, e.batch_id, e.seq >> 16), []).append(e)
    for (domain, batch, _), segment in groups.items():
        h = hashlib.sha3_256(b"CDCSEG1\x00" + struct.pack(">QQI", domain, batch, len(segment)))
        h.update(b"".join(struct.pack(">I", e.seq) for e in segment))
        columns = [[e.table.encode() for e in segment], [encode_key(e.row) for e in segment],
                   [e.column.encode() for e in segment], [encode_value(e.old) for e in segment],
                   [encode_value(e.new) for e in segment]]
        for column in columns:
            h.update(b"".join(struct.pack(">I", len(v)) for v in column) + b"".join(column))
        out.append((domain, batch, h.hexdigest()))
    return out


@settings(deadline=None)
@given(st.lists(events, max_size=12))
def test_segment_digests_follow_the_documented_layout(batch: list[ChangeEvent]) -> None:
    """segment_digests hashes exactly the documented serialisation of each segment (a
    change to it would make every stored epoch setsum disagree with its events)."""
    batch = sorted({e.identity: e for e in batch}.values(), key=lambda e: e.identity)
    got = [(d, b, h.hex()) for d, b, h in segment_digests(EventBatch.from_events(batch).data)]
    assert got == reference_segment_digests(batch)
    if batch:
        assert len(got) == len({(e.domain_id, e.batch_id, e.seq >> 16) for e in batch})


@pytest.mark.parametrize("raw", [
    b"\x01\x07", b"\x01", b"\x01\x00\x00", b"\x00\x00", b"\x02" + bytes(7),
    b"\x02" + bytes(9), b"\x03" + bytes(10), b"\x06", b"\xff\x00",
])
def test_malformed_tagged_values_are_refused(raw: bytes) -> None:
    """A bool byte other than 0/1, fixed-width payloads of the wrong length, unknown tags:
    CodecError, never a value that would re-encode differently."""
    with pytest.raises(CodecError, match="invalid tagged value"):
        decode_value(raw)
