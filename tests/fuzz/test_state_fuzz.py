"""Fuzzing the checkpoint/stripe objects and the state index: bytes read from storage
raise only ``CorruptState`` (whatever decodes re-encodes to a valid object)."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given

from sequencer import EpochRecord
from sinks.codec import encode_epoch, encode_key, encode_value
from sinks.wal3._state import (
    CorruptState,
    StateDelta,
    StateEntry,
    StateIndex,
    decode_state,
    encode_state,
    join_key,
)
from tests.fuzz._mutate import FUZZ, damaged, damaged_json

pytestmark = pytest.mark.timeout(120)


def _delta(kind: str) -> StateDelta:
    keys = tuple(join_key("t", encode_key(i), c) for i in (1, "k") for c in "ab")
    values = tuple(encode_value(v) for v in (1, "x", None, 2.5))
    befores = tuple(b"" for _ in keys) if kind == "checkpoint" else tuple(
        encode_value(v) for v in (0, "", True, b"\x00"))
    epoch = EpochRecord(domain_id=5, epoch_seq=3, begin_id=10, end_id=20, event_count=0,
                        quiescent=True)
    return StateDelta(kind, 1, 9, "" if kind == "checkpoint" else "5:2:a", "5:3:14", True,
                      keys, values, befores, (encode_epoch(epoch),), "00" * 32, 8, 12,
                      "11" * 32)


def _v2(kind: str) -> StateDelta:
    """Version 2: per-domain rows (a cell on two domains), carry, baseline, order."""
    from dataclasses import replace

    base = _delta(kind)
    keys = (*base.keys, base.keys[0])
    extra: dict[str, object] = {
        "carry": ((base.keys[1], encode_value(7), encode_value(6)),),
        "baseline": '{"chunks":1,"completed":0,"tracks":[]}', "domain_order": (9, 5)}
    if kind == "stripe":
        extra.update(domains=(5, 5, 5, 5, 9), order=((5, 3), (9, 1)))
    return replace(base, keys=keys, values=(*base.values, encode_value(3)),
                   befores=(*base.befores, base.values[0]), cells_setsum="", **extra)


OBJECTS = [encode_state(_delta("checkpoint")), encode_state(_delta("stripe")),
           encode_state(_v2("checkpoint")), encode_state(_v2("stripe"))]
ENTRY = StateEntry("checkpoint", "state/CHECKPOINT." + "a" * 64, "a" * 64, 10, 1, 9, 4,
                   "00" * 32, 8, 12, "11" * 32)
INDEX = json.loads(StateIndex((ENTRY,)).to_bytes())


def test_objects_round_trip() -> None:
    for data in OBJECTS:
        delta = decode_state(data)
        assert encode_state(delta) == data
    assert [decode_state(d).version for d in OBJECTS] == [1, 1, 2, 2]
    assert decode_state(OBJECTS[3]).rows_of(9) == [4]


@FUZZ
@given(damaged(OBJECTS))
def test_a_damaged_object_raises_only_corrupt_state(data: bytes) -> None:
    try:
        delta = decode_state(data)
    except CorruptState:
        return
    assert decode_state(encode_state(delta)) == delta


@FUZZ
@given(damaged_json(INDEX))
def test_a_damaged_index_raises_only_corrupt_state(data: bytes) -> None:
    with contextlib.suppress(CorruptState):
        index = StateIndex.from_bytes(data, "i")
        assert StateIndex.from_bytes(index.to_bytes(), "i").entries == index.entries


@pytest.mark.parametrize("setsum", ["\ud800", "zz" * 32, "00" * 31])
def test_an_index_entry_with_a_setsum_that_is_not_one_is_corrupt(setsum: str) -> None:
    # Found by the fuzz test: it decoded, then failed with ValueError when summed.
    entry = json.loads(json.dumps(INDEX["entries"][0]))
    entry["replaced"]["setsum"] = setsum
    data = json.dumps({**INDEX, "entries": [entry]}).encode()
    with pytest.raises(CorruptState, match="setsum hexdigest"):
        StateIndex.from_bytes(data, "i")
