"""The two Kafka encodings, without a broker: every value and event round-trips bit for bit."""

from __future__ import annotations

import json
import math
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sequencer import ABSENT, ChangeEvent
from sinks import codec as _codec
from sinks.codec import (
    CodecError,
    EventBatch,
    cell_key,
    encode_key,
    encode_value,
    event_keys,
    partition_of,
    partitions_of,
)
from sinks.codec import decode_native_event as decode_event
from sinks.codec import encode_native_events as encode_event_messages

names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,62}", fullmatch=True)
int64 = st.integers(-(1 << 63), (1 << 63) - 1)
text = st.text(st.characters(exclude_categories=["Cs"]), max_size=20)
floats = st.builds(lambda raw: struct.unpack(">d", raw)[0], st.binary(min_size=8, max_size=8))
values = st.one_of(st.none(), st.booleans(), int64, floats, text, st.binary(max_size=20))
rows = st.one_of(int64, text)
cell_values = st.one_of(st.just(ABSENT), values)
events = st.builds(
    ChangeEvent, st.integers(0, (1 << 63) - 1), st.integers(1, (1 << 64) - 1),
    st.integers(0, (1 << 32) - 1), names, rows, names, cell_values, cell_values,
)


def same(a: object, b: object) -> bool:
    """Bitwise equality of cell values (NaN payloads, -0.0)."""
    return encode_value(a) == encode_value(b)  # type: ignore[arg-type]


@settings(deadline=None)  # a shared, loaded machine: no per-example deadline
@given(st.lists(events, min_size=1, max_size=30))
def test_native_messages_round_trip(batch: list[ChangeEvent]) -> None:
    """encode_event_messages then decode_event gives back every event, bit for bit."""
    data = EventBatch.from_events(batch).data
    values_ = encode_event_messages(data)
    keys = event_keys(data)
    assert len(values_) == len(keys) == len(batch)
    for event, value, key in zip(batch, values_, keys, strict=True):
        raw = decode_event(value)
        back = raw.to_event()
        assert back.identity == event.identity and back.cell == event.cell
        assert same(back.old, event.old) and same(back.new, event.new)
        assert key == cell_key(event.table, encode_key(event.row), event.column)


@settings(deadline=None)  # a shared, loaded machine: no per-example deadline
@given(st.lists(events, min_size=1, max_size=30), st.integers(1, 64))
def test_a_cells_partition_does_not_depend_on_the_rest(batch: list[ChangeEvent], n: int) -> None:
    """The partition of an event is a function of its cell alone."""
    keys = event_keys(EventBatch.from_events(batch).data)
    parts = partitions_of(keys, n).tolist()
    for key, part in zip(keys, parts, strict=True):
        assert part == partition_of(key, n) < n


def test_partitioning_is_pinned() -> None:
    """crc32(key) mod n, pinned, so producers in other languages can match it."""
    key = cell_key("issues", encode_key(42), "title")
    assert key == b"issues\x00title\x00\x02" + (42).to_bytes(8, "big")
    assert [partition_of(key, n) for n in (1, 2, 3, 12, 1 << 32)] == [0, 1, 2, 11, 0x28009F2B]


@pytest.mark.parametrize("bad", [b"", b"CDK", b"XYZ" + bytes(40), b"CDK\x02" + bytes(40)])
def test_native_decode_refuses_garbage(bad: bytes) -> None:
    """Short, foreign or future-version messages are refused with CodecError."""
    with pytest.raises(CodecError):
        decode_event(bad)


def test_native_decode_refuses_truncation() -> None:
    """A message cut inside its declared lengths is refused."""
    event = ChangeEvent(1, 2, 3, "t", "row", "c", ABSENT, b"x" * 50)
    (value,) = encode_event_messages(EventBatch.from_events([event]).data)
    assert decode_event(value).to_event() == event
    with pytest.raises(CodecError, match="truncated"):
        decode_event(value[:40])


@settings(deadline=None)  # a shared, loaded machine: no per-example deadline
@given(values)
def test_json_values_round_trip_bit_for_bit(value: object) -> None:
    """Through json text and back: the same value, every bit (NaN payloads, -0.0, int64)."""
    text_ = json.dumps(_codec.encode_debezium_value(value), allow_nan=False)  # type: ignore[arg-type]
    assert same(_codec.decode_debezium_value(json.loads(text_)), value)


@pytest.mark.parametrize(("value", "json_text"), [
    (None, "null"), (True, "true"), (7, "7"), (-0.0, "-0.0"), (1.0, "1.0"), ("é", '"é"'),
    ((1 << 53), '{"$int64":"9007199254740992"}'), (-(1 << 63), '{"$int64":"-9223372036854775808"}'),
    (math.inf, '{"$float64":"7ff0000000000000"}'), (b"\x00\xff", '{"$bytes":"AP8="}'),
])
def test_json_value_mapping_is_the_documented_one(value: object, json_text: str) -> None:
    """The examples of docs/kafka.md."""
    encoded = json.dumps(_codec.encode_debezium_value(value), separators=(",", ":"),  # type: ignore[arg-type]
                         ensure_ascii=False)
    assert encoded == json_text


@settings(deadline=None)  # a shared, loaded machine: no per-example deadline
@given(events)
def test_debezium_envelopes_round_trip(event: ChangeEvent) -> None:
    """decode_event(encode_event(e)) == e bit for bit, with Debezium's fields and types."""
    key, value = _codec.encode_debezium_event(event, name="app", data_collection_order=1)
    back = _codec.decode_debezium_event(value)
    assert back.identity == event.identity and back.cell == event.cell
    assert same(back.old, event.old) and same(back.new, event.new)
    envelope = json.loads(value)
    assert set(envelope) == {"before", "after", "op", "ts_ms", "source", "transaction"}
    assert envelope["op"] == ("c" if event.old is ABSENT else "d" if event.new is ABSENT else "u")
    assert (envelope["before"] is None) == (event.old is ABSENT)
    assert (envelope["after"] is None) == (event.new is ABSENT)
    for image in (envelope["before"], envelope["after"]):
        if image is not None:
            assert set(image) == {"$row", event.column}
    assert envelope["transaction"] == {"id": f"{event.domain_id}:{event.batch_id}",
                                       "total_order": event.seq + 1,
                                       "data_collection_order": 1}
    assert envelope["source"]["connector"] == "cdc-agent"
    assert envelope["source"]["name"] == "app"
    assert isinstance(envelope["ts_ms"], int)
    assert json.loads(key) == {"table": event.table, "row": _codec.encode_debezium_key(event.row),
                               "column": event.column}


def test_transaction_records_shape() -> None:
    """BEGIN then END with the same id; END counts events per data collection."""
    (k1, begin), (k2, end) = _codec.debezium_transaction_records(5, 1 << 40, 3, {"b": 1, "a": 2})
    assert k1 == k2 and json.loads(k1) == {"id": f"5:{1 << 40}"}
    assert json.loads(begin)["status"] == "BEGIN"
    assert json.loads(end) == {
        "status": "END", "id": f"5:{1 << 40}", "ts_ms": 256000, "event_count": 3,
        "data_collections": [{"data_collection": "a", "event_count": 2},
                             {"data_collection": "b", "event_count": 1}],
    }


@settings(deadline=None)  # a shared, loaded machine: no per-example deadline
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(0, 3), cell_values, cell_values),
                min_size=1, max_size=40), st.integers(1, 5))
def test_partition_digests_match_the_codec(writes: list, partitions: int) -> None:
    """One-pass per-partition digests == codec.segment_digests on each partition's share."""
    import numpy as np
    import pyarrow as pa

    from sinks.codec import segment_digests
    from sinks.kafka._digests import partition_segment_digests

    events = []
    seqs: dict[int, int] = {}
    for batch, row, old, new in sorted(writes, key=lambda w: w[0]):
        seq = seqs.get(batch, 0)
        seqs[batch] = seq + (1 << 16 if row == 3 else 1)  # some batches span segments
        events.append(ChangeEvent(7, batch << 8, seq, "t", row, "c", old, new))
    data = EventBatch.from_events(events).data
    parts = partitions_of(event_keys(data), partitions)
    expected = sorted(
        (part, dom, bat, digest) for part in range(partitions)
        for dom, bat, digest in segment_digests(data.take(pa.array(np.flatnonzero(parts == part))))
        if (parts == part).any())
    assert sorted(partition_segment_digests(data, parts)) == expected
