"""Fuzzing the codec: damaged messages, values and keys raise CodecError and nothing else.

A message that decodes must then be safe to use: ``to_events()`` and
``segment_digests()`` succeed (before, one flipped bit could pass decode and crash the
process in ``to_events``). A sweep of thousands of damaged messages also runs in a
child process, so a crash fails this test instead of killing the test run.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import textwrap

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from sequencer import ABSENT, ChangeEvent, EpochRecord
from sinks.codec import (
    CodecError,
    EpochRun,
    EventBatch,
    SnapshotChunk,
    decode,
    decode_debezium_event,
    decode_key,
    decode_native_event,
    decode_value,
    encode_debezium_event,
    encode_epoch,
    encode_epochs,
    encode_events,
    encode_key,
    encode_native_events,
    encode_snapshot,
    encode_value,
    records,
    segment_digests,
)
from tests.fuzz._mutate import FUZZ, damaged, damaged_json

pytestmark = pytest.mark.timeout(120)

CELLS = [None, True, False, 0, -1, 1.5, float("nan"), "", "é", "x" * 40, b"", b"\xff", ABSENT]
EVENTS = [ChangeEvent(7, i // 3, i, "t" if i % 4 else "u", f"r{i}" if i % 2 else i, "c",
                      CELLS[i % len(CELLS)], CELLS[(i + 5) % len(CELLS)]) for i in range(26)]
MESSAGES = [
    encode_events(EventBatch.from_events(EVENTS)),
    encode_events(EventBatch.from_events(EVENTS[:1])),
    encode_events(EventBatch.from_events([])),
    encode_epoch(EpochRecord(7, 2, 3, 9, 26, True, (("t", 20), ("u", 6)), "ab" * 32, 3)),
    encode_epoch(EpochRecord(7, 3, 9, 12, 0, False)),
]
RUNS = [  # EPOCHS messages (codec version 3): runs of epoch records
    encode_epochs(EpochRun.from_records([
        EpochRecord(7, 2, 3, 9, 26, False, (("t", 20), ("u", 6)), "ab" * 32),
        EpochRecord(7, 3, 9, 12, 0, True),
        EpochRecord(7, 4, 12, 15, 1, False, (("é", 1),), "cd" * 32, 4)])),
    encode_epochs(EpochRun.from_records([])),
]
SNAPSHOTS = [
    encode_snapshot(SnapshotChunk.build(7, 2, 9, 1, 0, False, None, ("t", 5), [
        ("t", i, "c", CELLS[i % (len(CELLS) - 1)]) for i in range(12)])),
    encode_snapshot(SnapshotChunk.build(7, 2, 9, 1, 1, True, ("t", "k"), None,
                                        [("u", "k", "c", "é")])),
]


def use(message: bytes) -> None:
    """Decode and use a message as every reader does; only CodecError may come out."""
    try:
        decoded = decode(message)
    except CodecError:
        return
    if isinstance(decoded, EventBatch):
        events = decoded.to_events()
        assert len(events) == len(decoded)
        list(segment_digests(decoded.data))
    elif isinstance(decoded, SnapshotChunk):
        assert len(decoded.cells()) == decoded.cell_count
        decoded.actual_setsum()
    elif isinstance(decoded, EpochRun):
        expanded = records(decoded)
        assert len(expanded) == len(decoded)
        assert all(isinstance(r, EpochRecord) for r in expanded)
        again = EpochRun.from_records(expanded)  # type: ignore[arg-type]
        assert records(decode(encode_epochs(again))) == expanded
    else:
        assert isinstance(decoded, EpochRecord)
        assert decode(encode_epoch(decoded)) == decoded


@FUZZ
@given(damaged(MESSAGES))
def test_damaged_messages_decode_or_raise_codec_error(message: bytes) -> None:
    """Bit flips, overwrites, cuts, inserts anywhere (header included): CodecError only."""
    use(message)


@FUZZ
@given(damaged(MESSAGES[:2], keep=5))
def test_damaged_event_payloads_decode_or_raise_codec_error(message: bytes) -> None:
    """The same on the Arrow payload alone (the header kept valid, so Arrow is reached)."""
    use(message)


@FUZZ
@given(damaged(SNAPSHOTS) | damaged(SNAPSHOTS, keep=5))
def test_damaged_snapshot_chunks_decode_or_raise_codec_error(message: bytes) -> None:
    """SNAPSHOT messages (codec version 2): the same, cells and setsum used after."""
    use(message)


@FUZZ
@given(damaged(RUNS) | damaged(RUNS, keep=5))
def test_damaged_epoch_runs_decode_or_raise_codec_error(message: bytes) -> None:
    """EPOCHS messages (codec version 3): the same; a run that decodes expands into
    records that encode back to the same run."""
    use(message)


@FUZZ
@given(st.binary(max_size=300) | st.binary(max_size=300).map(lambda b: b"CDC\x01" + b))
def test_arbitrary_bytes_decode_or_raise_codec_error(message: bytes) -> None:
    use(message)


@FUZZ
@given(st.binary(max_size=40) | st.sampled_from([0, 1, 2, 3, 4, 5, 6, 255]).flatmap(
    lambda tag: st.binary(max_size=12).map(lambda b: bytes([tag]) + b)))
@example(b"\x01\x07")
@example(b"\x02" + bytes(10))
@example(b"\x03" + bytes(8))
def test_values_and_keys_decode_exactly_or_raise_codec_error(raw: bytes) -> None:
    """A tagged value/key that decodes re-encodes to the same bytes; the rest is CodecError."""
    try:
        value = decode_value(raw)
    except CodecError:
        pass
    else:
        assert encode_value(value) == raw
    try:
        key = decode_key(raw)
    except CodecError:
        pass
    else:
        assert encode_key(key) == raw


def test_a_snapshot_chunk_with_bad_utf8_is_refused_at_decode() -> None:
    """A SNAPSHOT whose table column is not UTF-8: CodecError from decode (before, it
    decoded and cells() raised UnicodeDecodeError)."""
    assert SNAPSHOTS[0].count(b"t" * 12) == 1
    with pytest.raises(CodecError, match="corrupt SNAPSHOT payload"):
        decode(SNAPSHOTS[0].replace(b"t" * 12, b"\xff" + b"t" * 11))


def test_a_snapshot_cell_never_holds_absent() -> None:
    """A chunk lists present cells: an empty (ABSENT) value is refused at decode, as is
    a value with an unknown tag."""
    chunk = SnapshotChunk.build(7, 2, 9, 1, 0, True, None, None, [("t", 1, "c", ABSENT)])
    with pytest.raises(CodecError, match="value is not a tagged value"):
        decode(encode_snapshot(chunk))
    good = encode_snapshot(SnapshotChunk.build(7, 2, 9, 1, 0, True, None, None,
                                               [("t", 1, "c", b"\x0c\x0c")]))
    assert good.count(b"\x05\x0c\x0c") == 1
    with pytest.raises(CodecError, match="value is not a tagged value"):
        decode(good.replace(b"\x05\x0c\x0c", b"\x0c\x0c\x0c"))


def test_a_crash_in_a_child_process_fails_this_test() -> None:
    """Thousands of damaged EVENTS, SNAPSHOT and EPOCHS messages decoded and used in a child: it
    exits 0 (a
    segfault, as one flipped bit caused before decode validated, would not)."""
    code = textwrap.dedent("""
        import random
        from tests.fuzz.test_codec_fuzz import MESSAGES, RUNS, SNAPSHOTS, use
        rng = random.Random(20261122)
        for n in range(4000):
            data = bytearray((MESSAGES[0], SNAPSHOTS[0], RUNS[0])[n % 3])
            for _ in range(rng.randint(1, 3)):
                data[rng.randrange(5, len(data))] ^= 1 << rng.randrange(8)
            use(bytes(data))
        print("survived")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=110)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.strip() == "survived"


NATIVE = encode_native_events(EventBatch.from_events(EVENTS).data)
DEBEZIUM = [encode_debezium_event(e, name="app", data_collection_order=1)[1]
            for e in EVENTS if e.new is not ABSENT or e.old is not ABSENT]


@FUZZ
@given(damaged(NATIVE) | st.binary(max_size=80).map(lambda b: b"CDK\x01" + b))
def test_damaged_native_kafka_events_decode_or_raise_codec_error(message: bytes) -> None:
    """Kafka native event messages: CodecError only; what decodes becomes an event."""
    try:
        raw = decode_native_event(message)
    except CodecError:
        return
    try:
        event = raw.to_event()
    except CodecError:
        return  # the frame holds, a tagged value inside it does not
    assert encode_value(event.new) == raw.new


@FUZZ
@given(st.lists(damaged(NATIVE) | st.sampled_from(NATIVE), min_size=1, max_size=6))
def test_native_events_decoded_at_once_as_one_at_a_time(messages: list[bytes]) -> None:
    """``native_events_batch`` (the consumer's bulk decode) equals decoding each message
    alone, or raises the CodecError of the first that does not decode; the head read at
    intake (``native_event_head``) refuses exactly the frames the full decode refuses,
    except for names that are not UTF-8 (left to the decode)."""
    from sinks.codec import native_event_head, native_events_batch, raw_events_batch

    alone = []
    for message in messages:
        try:
            head = native_event_head(message)
        except CodecError:
            with pytest.raises(CodecError):
                decode_native_event(message)
            head = None
        try:
            alone.append(decode_native_event(message))
        except CodecError as exc:
            assert head is not None or "UTF" not in str(exc)
            with pytest.raises(CodecError, match=re.escape(str(exc))):
                native_events_batch(messages)
            return
        assert head == alone[-1][:3]
    assert native_events_batch(messages).data.equals(raw_events_batch(alone).data)


@FUZZ
@given(damaged(DEBEZIUM) | st.sampled_from(DEBEZIUM).flatmap(
    lambda raw: damaged_json(json.loads(raw))))
@example(DEBEZIUM[0].replace(b'"seq":0', b'"seq":1e400'))  # int(inf): OverflowError
def test_damaged_debezium_envelopes_decode_or_raise_codec_error(message: bytes) -> None:
    """Debezium JSON envelopes (hostile JSON included): CodecError only."""
    with contextlib.suppress(CodecError):
        decode_debezium_event(message)
