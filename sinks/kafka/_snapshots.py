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
``{"cdc_agent_snapshot": "<domain>:<baseline_id>:<index>"}``; then every cell of the
chunk follows as a Debezium read record (``op: "r"``) in its cell's partition, so a
plain Debezium consumer sees the baseline's rows before any later change of them
(``sinks.codec.encode_debezium_read``; cdc-agent's consumer skips them).

A chunk is one message, so it must fit ``message.max.bytes``: the sink offers
``snapshot_max_bytes`` (``snapshot_budget``), and the agent (and the sidecar) cut a
chunk larger than that into several, of whole rows (``agent._baseline.PendingSnapshot``).
What still cannot fit is refused before any message of the chunk is handed to the
producer (``oversized``), with a ``KafkaDeliveryError`` naming it: a single row larger
than the limit, or (Debezium) one cell whose read record is larger than the limit
although its chunk fits (a bytes value is base64 in JSON: about 4/3 of its size, so a
cell over about 3/4 of ``message.max.bytes`` cannot travel as a read record).
"""

from __future__ import annotations

import json
from typing import Final, NamedTuple

from sinks.codec import (
    HEADER_READ,
    HEADER_SNAPSHOT,
    SNAPSHOT_PARTITION,
    SnapshotChunk,
    cell_key,
    encode_debezium_read,
    encode_snapshot,
    partition_of,
)
from sinks.kafka._markers import Marker

__all__ = ["MESSAGE_MAX_BYTES", "SnapshotMessage", "oversized", "snapshot_budget",
           "snapshot_message"]

MESSAGE_MAX_BYTES: Final = 1_000_000  # librdkafka's default message.max.bytes


class SnapshotMessage(NamedTuple):
    """The chunk's own message, and (Debezium) its cells' read records after it."""

    partition: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    rows: list[Marker]


def snapshot_budget(message_max_bytes: int) -> int:
    """The encoded cell bytes a chunk may hold to fit a message of ``message_max_bytes``:
    three quarters of it, leaving room for the chunk's header, Arrow's framing and the
    record batch's own overhead."""
    return max(1, message_max_bytes * 3 // 4)


def snapshot_message(chunk: SnapshotChunk, encoding: str, partitions: int = 1,
                     name: str = "cdc-agent") -> SnapshotMessage:
    """The message carrying ``chunk`` on the data topic (and its read records)."""
    raw = encode_snapshot(chunk)
    if encoding == "native":
        return SnapshotMessage(SNAPSHOT_PARTITION, None, raw, [], [])
    ident = f"{chunk.domain_id}:{chunk.baseline_id}:{chunk.index}"
    key = json.dumps({"cdc_agent_snapshot": ident}, separators=(",", ":")).encode()
    read_header = [(HEADER_READ, ident.encode())]
    data = chunk.data
    cell_keys = [cell_key(t, r, c) for t, r, c in zip(
        data.column("table").to_pylist(), data.column("row").to_pylist(),
        data.column("column").to_pylist(), strict=True)]
    rows = [Marker(partition_of(cell, partitions), row_key, row_value, read_header)
            for cell, (row_key, row_value) in zip(cell_keys, encode_debezium_read(
                chunk, name=name), strict=True)]
    return SnapshotMessage(SNAPSHOT_PARTITION, key, None, [(HEADER_SNAPSHOT, raw)], rows)


def _size(key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]] | None
          ) -> int:
    """A message's bytes as the producer counts them against ``message.max.bytes``."""
    return (len(key or b"") + len(value or b"")
            + sum(len(name) + len(raw) for name, raw in headers or ()))


def oversized(chunk: SnapshotChunk, message: SnapshotMessage, limit: int) -> str | None:
    """Why ``message`` (a chunk and its read records) cannot be sent within ``limit``
    bytes per message, or None when every part fits."""
    size = _size(message.key, message.value, message.headers)
    if size > limit:
        return (f"snapshot chunk {chunk.index} of baseline {chunk.baseline_id:#x} is {size} "
                f"bytes, more than message.max.bytes ({limit}) (chunks are cut to "
                "snapshot_max_bytes, but never within a row)")
    for row in message.rows:
        size = _size(row.key, row.value, row.headers)
        if size > limit:
            return (f"the op \"r\" read record of cell {row.key!r} in snapshot chunk "
                    f"{chunk.index} of baseline {chunk.baseline_id:#x} is {size} bytes, more "
                    f"than message.max.bytes ({limit}) although its chunk fits (a cell "
                    "travels whole in one read record, bytes as base64)")
    return None
