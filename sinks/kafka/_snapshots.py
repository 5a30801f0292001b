"""Snapshot chunks (baselines, docs/state.md) on the data topic: one message per chunk.

A chunk is tied to a quiescence point: it must reach a consumer after that point's epoch
record and before the next epoch's. The sink writes the whole chunk, as the codec's
SNAPSHOT message, to partition ``SNAPSHOT_PARTITION`` right after the point's epoch
markers (the producer keeps a partition in order). The consumer cannot hand the next
epoch to its assembler before that partition vouched for it, which it does only after
the chunk, so the chunk is always known in time, and it is fed to the assembler right
after its quiescence point, exactly as a wal3 log would give it. The chunk's own setsum
(over its header and cells) is checked by the assembler; a lost chunk shows up as a
gap in the baseline's tiling.

In the native encoding the value is the SNAPSHOT message and the key is empty. In the
Debezium encoding the value is ``null`` (a tombstone, which Debezium consumers skip),
the SNAPSHOT message travels in the ``cdc-agent-snapshot`` header and the key is
``{"cdc_agent_snapshot": "<domain>:<baseline_id>:<index>"}``. A chunk is one message,
so it must fit the producer's and broker's ``message.max.bytes``: keep ``chunk_rows``
small enough (a refused message raises ``KafkaDeliveryError``).
"""

from __future__ import annotations

import json

from sinks.codec import HEADER_SNAPSHOT, SNAPSHOT_PARTITION, SnapshotChunk, encode_snapshot
from sinks.kafka._markers import Marker

__all__ = ["snapshot_message"]


def snapshot_message(chunk: SnapshotChunk, encoding: str) -> Marker:
    """The message carrying ``chunk`` on the data topic."""
    raw = encode_snapshot(chunk)
    if encoding == "native":
        return Marker(SNAPSHOT_PARTITION, None, raw, [])
    key = json.dumps({"cdc_agent_snapshot":
                      f"{chunk.domain_id}:{chunk.baseline_id}:{chunk.index}"},
                     separators=(",", ":")).encode()
    return Marker(SNAPSHOT_PARTITION, key, None, [(HEADER_SNAPSHOT, raw)])
