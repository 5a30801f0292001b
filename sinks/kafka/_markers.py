"""Epoch markers: how an epoch record is written into every partition of the data topic.

Each partition gets one message per epoch record, after every event of that epoch sent
to it (the idempotent producer keeps a partition's messages in order). The message has
two headers, both the codec's EPOCH messages (``sinks.codec.encode_epoch``; the layout,
header names included, is in ``sinks.codec``'s opening comment):

    cdc-agent-epoch        this partition's copy: its event count, per-table counts and
                           setsum, ``stream`` = the partition number
    cdc-agent-epoch-whole  the record the agent emitted, for the whole epoch

In the native encoding the value is the partition's EPOCH message too and the key is
empty. In the Debezium encoding the value is ``null`` (a tombstone, which Debezium
consumers skip) and the key is ``{"cdc_agent_epoch": "<domain>:<epoch_seq>"}``.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from sequencer import EpochRecord
from sinks.codec import HEADER_PARTITION, HEADER_WHOLE, encode_epoch

__all__ = ["Marker", "marker_messages"]


class Marker(NamedTuple):
    partition: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]


def marker_messages(whole: EpochRecord, per_partition: list[EpochRecord],
                    encoding: str) -> list[Marker]:
    """The marker message of ``whole`` for each partition."""
    whole_raw = encode_epoch(whole)
    key = None
    if encoding == "debezium":
        key = json.dumps({"cdc_agent_epoch": f"{whole.domain_id}:{whole.epoch_seq}"},
                         separators=(",", ":")).encode()
    out = []
    for record in per_partition:
        assert record.stream is not None
        raw = encode_epoch(record)
        value = raw if encoding == "native" else None
        out.append(Marker(record.stream, key, value,
                          [(HEADER_PARTITION, raw), (HEADER_WHOLE, whole_raw)]))
    return out
