"""The Kafka encodings in ``sinks.codec`` write exactly the bytes earlier releases wrote.

The expected bytes below were produced by the modules the layouts lived in before they
were folded into the codec (``sinks.kafka._native`` and ``sinks.kafka._debezium``), so
topics written before still read, and new messages look the same to old readers.
"""

from __future__ import annotations

from sequencer import ABSENT, ChangeEvent, EpochRecord
from sinks.codec import (
    HEADER_PARTITION,
    HEADER_SNAPSHOT,
    HEADER_WHOLE,
    NATIVE_MAGIC,
    NATIVE_VERSION,
    SNAPSHOT_PARTITION,
    EventBatch,
    debezium_transaction_records,
    decode_debezium_event,
    decode_native_event,
    encode_debezium_event,
    encode_epoch,
    encode_native_events,
    event_keys,
    partition_of,
)
from sinks.kafka._markers import marker_messages

EVENTS = [
    ChangeEvent(7, 1 << 40, 3, "issues", 42, "title", ABSENT, "h\u00e9llo"),
    ChangeEvent(7, (1 << 40) + 1, 65537, "t", "k\u00e9y", "c", b"\x00\xff", -0.0),
]
NATIVE_VALUES = [
    "43444b01000000000000000700000100000000000000000306050000000900000000000000076973737565"
    "737469746c6502000000000000002a0468c3a96c6c6f",
    "43444b010000000000000007000001000000000100010001010100000005000000030000000974630"
    "46bc3a9790500ff038000000000000000",
]
NATIVE_KEYS = ["697373756573007469746c650002000000000000002a", "74006300046bc3a979"]
DEBEZIUM = [
    (b'{"table":"issues","row":42,"column":"title"}',
     b'{"before":null,"after":{"$row":42,"title":"h\xc3\xa9llo"},"op":"c","ts_ms":256000,'
     b'"source":{"version":"0.1.0","connector":"cdc-agent","name":"app","ts_ms":256000,'
     b'"snapshot":"false","db":"7","table":"issues","domain":"7","batch_id":"1099511627776",'
     b'"seq":3,"row":42,"column":"title"},"transaction":{"id":"7:1099511627776",'
     b'"total_order":4,"data_collection_order":2}}'),
    (b'{"table":"t","row":"k\xc3\xa9y","column":"c"}',
     b'{"before":{"$row":"k\xc3\xa9y","c":{"$bytes":"AP8="}},"after":{"$row":"k\xc3\xa9y",'
     b'"c":-0.0},"op":"u","ts_ms":256000,"source":{"version":"0.1.0","connector":'
     b'"cdc-agent","name":"app","ts_ms":256000,"snapshot":"false","db":"7","table":"t",'
     b'"domain":"7","batch_id":"1099511627777","seq":65537,"row":"k\xc3\xa9y","column":"c"},'
     b'"transaction":{"id":"7:1099511627777","total_order":65538,'
     b'"data_collection_order":2}}'),
]


def test_native_event_messages_keep_their_bytes() -> None:
    """Native values and keys are byte-identical to version 1 as first released."""
    data = EventBatch.from_events(EVENTS).data
    assert [v.hex() for v in encode_native_events(data)] == NATIVE_VALUES
    assert [k.hex() for k in event_keys(data)] == NATIVE_KEYS
    assert (NATIVE_MAGIC, NATIVE_VERSION) == (b"CDK", 1)


def test_native_messages_written_before_still_decode() -> None:
    """The committed bytes decode to the events they were written from."""
    back = [decode_native_event(bytes.fromhex(v)).to_event() for v in NATIVE_VALUES]
    assert [repr(e) for e in back] == [repr(e) for e in EVENTS]  # repr: -0.0 stays -0.0


def test_partitioning_is_unchanged() -> None:
    """crc32(key) mod partitions: a cell keeps its partition across versions."""
    keys = [bytes.fromhex(k) for k in NATIVE_KEYS]
    assert [partition_of(k, 1 << 32) for k in keys] == [671129387, 759881964]
    assert [partition_of(k, 12) for k in keys] == [671129387 % 12, 759881964 % 12]


def test_debezium_envelopes_keep_their_bytes() -> None:
    """Debezium keys and envelopes are byte-identical, and the old bytes decode."""
    for event, expected in zip(EVENTS, DEBEZIUM, strict=True):
        assert encode_debezium_event(event, name="app", data_collection_order=2) == expected
        assert repr(decode_debezium_event(expected[1])) == repr(event)
    assert debezium_transaction_records(7, 1 << 40, 3, {"b": 1, "a": 2}) == [
        (b'{"id":"7:1099511627776"}',
         b'{"status":"BEGIN","id":"7:1099511627776","ts_ms":256000,"event_count":null,'
         b'"data_collections":null}'),
        (b'{"id":"7:1099511627776"}',
         b'{"status":"END","id":"7:1099511627776","ts_ms":256000,"event_count":3,'
         b'"data_collections":[{"data_collection":"a","event_count":2},'
         b'{"data_collection":"b","event_count":1}]}'),
    ]


def test_epoch_markers_keep_their_layout() -> None:
    """Marker headers keep their names and carry the codec's EPOCH messages."""
    assert (HEADER_PARTITION, HEADER_WHOLE, HEADER_SNAPSHOT, SNAPSHOT_PARTITION) == (
        "cdc-agent-epoch", "cdc-agent-epoch-whole", "cdc-agent-snapshot", 0)
    whole = EpochRecord(7, 5, 1, 1 << 41, 3, True, (("issues", 2), ("t", 1)), "ab" * 32)
    shares = [EpochRecord(7, 5, 1, 1 << 41, 2, True, (("issues", 2),), "cd" * 32, stream=0),
              EpochRecord(7, 5, 1, 1 << 41, 1, True, (("t", 1),), "00" * 32, stream=1)]
    native = marker_messages(whole, shares, "native")
    assert [(m.partition, m.key, m.value) for m in native] == [
        (0, None, encode_epoch(shares[0])), (1, None, encode_epoch(shares[1]))]
    assert native[1].headers == [(HEADER_PARTITION, encode_epoch(shares[1])),
                                 (HEADER_WHOLE, encode_epoch(whole))]
    debezium = marker_messages(whole, shares, "debezium")
    assert [(m.key, m.value) for m in debezium] == [(b'{"cdc_agent_epoch":"7:5"}', None)] * 2
