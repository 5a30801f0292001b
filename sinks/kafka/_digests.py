"""Segment digests per partition in one pass: what ``sinks.codec.segment_digests`` gives
for each partition's share of a shipment, without splitting the shipment first.

A partition's segment is the events of one write batch in one partition whose
``seq >> SEGMENT_BITS`` agree, in seq order; its digest is SHA3-256 of exactly the item
``sinks.codec`` defines (magic, domain, batch, count, seqs, then lengths and bytes of
table, row, column, old, new). Tests check the two agree bit for bit.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Final

import numpy as np
import pyarrow as pa

from sinks.codec import _SEGMENT_MAGIC, SEGMENT_BITS

__all__ = ["partition_segment_digests"]

_HEAD: Final = struct.Struct(">QQI")
_VAR_COLUMNS: Final = ("table", "row", "column", "old", "new")


def partition_segment_digests(data: pa.RecordBatch, parts: np.ndarray
                              ) -> list[tuple[int, int, int, bytes]]:
    """``(partition, domain_id, batch_id, digest)`` for every segment of every partition.

    ``data`` holds whole segments, each contiguous and in seq order; event i goes to
    partition ``parts[i]``.
    """
    n = data.num_rows
    if n == 0:
        return []
    if n > 1 and (parts[1:] < parts[:-1]).any():
        order = np.argsort(parts, kind="stable")  # keeps each partition's events in order
        data = data.take(pa.array(order))
        parts = parts[order]
    domains = data.column("domain_id").to_numpy()
    batches = data.column("batch_id").to_numpy()
    seqs = data.column("seq").to_numpy()
    segments = seqs >> SEGMENT_BITS
    change = np.flatnonzero(
        (parts[1:] != parts[:-1]) | (domains[1:] != domains[:-1])
        | (batches[1:] != batches[:-1]) | (segments[1:] != segments[:-1])
    ) + 1
    starts_np = np.concatenate(([0], change))
    ends_np = np.concatenate((change, [n]))
    starts, ends = starts_np.tolist(), ends_np.tolist()
    seq_be = memoryview(seqs.astype(">u4").tobytes())
    columns = []
    for name in _VAR_COLUMNS:
        col = data.column(name)
        offsets = np.frombuffer(col.buffers()[1], dtype=np.int32, count=len(col) + 1,
                                offset=col.offset * 4)
        lengths = memoryview((offsets[1:] - offsets[:-1]).astype(">u4").tobytes())
        values = col.buffers()[2]
        # only the offsets where segments start and end are needed
        columns.append((offsets[starts_np].tolist(), offsets[ends_np].tolist(), lengths,
                        memoryview(values) if values is not None else memoryview(b"")))
    (s0, e0, l0, v0), (s1, e1, l1, v1), (s2, e2, l2, v2), (s3, e3, l3, v3), (s4, e4, l4, v4) = (
        columns)
    part_list = parts[starts_np].tolist()
    dom_list, bat_list = domains[starts_np].tolist(), batches[starts_np].tolist()
    sha3, pack, join = hashlib.sha3_256, _HEAD.pack, b"".join
    out = []
    for k, (i, j) in enumerate(zip(starts, ends, strict=True)):
        a, b = 4 * i, 4 * j
        item = join((
            _SEGMENT_MAGIC, pack(dom_list[k], bat_list[k], j - i), seq_be[a:b],
            l0[a:b], v0[s0[k]:e0[k]], l1[a:b], v1[s1[k]:e1[k]], l2[a:b], v2[s2[k]:e2[k]],
            l3[a:b], v3[s3[k]:e3[k]], l4[a:b], v4[s4[k]:e4[k]],
        ))
        out.append((part_list[k], dom_list[k], bat_list[k], sha3(item).digest()))
    return out
