"""Logs written by earlier codec versions still replay, bit for bit."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from replay import Assembler
from sequencer import EpochRecord
from sinks.codec import (
    FORMAT_VERSION,
    EventBatch,
    SnapshotChunk,
    decode,
    encode_epoch,
    encode_events,
    encode_snapshot,
    encode_value,
)

FIXTURES = Path(__file__).parents[1] / "fixtures/logs"


def _messages(version: str) -> list[bytes]:
    raw = (FIXTURES / version / "messages.bin").read_bytes()
    messages, pos = [], 0
    while pos < len(raw):
        (n,) = struct.unpack_from(">I", raw, pos)
        messages.append(raw[pos + 4: pos + 4 + n])
        pos += 4 + n
    return messages


def _states(records: list[object]) -> list[dict[str, object]]:
    return [{"epoch_seq": s.epoch_seq,
             "cells": sorted([t, encode_value(r).hex(), c, encode_value(v).hex()]
                             for (t, r, c), v in s.state.items())}
            for s in Assembler().replay(records)]  # type: ignore[arg-type]


def test_a_version_2_log_still_replays_bit_for_bit() -> None:
    """A log written by codec version 2 (tests/fixtures/logs/v2, made by make_v2.py with
    the version-2 code: one EPOCH message per epoch record, SNAPSHOT chunks of a
    baseline) decodes, re-encodes to the same payloads, and replays to the very states
    recorded then, every value bit for bit."""
    messages = _messages("v2")
    assert messages and all(m[:4] == b"CDC\x02" for m in messages)
    kinds = {m[4] for m in messages}
    assert kinds == {0x01, 0x02, 0x03}  # events, single epoch records, snapshot chunks
    decoded = [decode(m) for m in messages]
    for message, record in zip(messages, decoded, strict=True):
        again = (encode_events(record) if isinstance(record, EventBatch)
                 else encode_epoch(record) if isinstance(record, EpochRecord)
                 else encode_snapshot(record) if isinstance(record, SnapshotChunk) else b"")
        # Snapshot chunks are still written as version 2: their layout did not change.
        version = 2 if isinstance(record, SnapshotChunk) else FORMAT_VERSION
        assert again[3] == version and again[4:] == message[4:]
    expected = json.loads((FIXTURES / "v2" / "states.json").read_text())
    got = _states(decoded)  # type: ignore[arg-type]
    assert got == expected and len(got) > 50
