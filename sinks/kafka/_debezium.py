"""The Debezium-compatible JSON encoding: change-event envelopes and transaction metadata.

The full description, with examples, is in ``docs/kafka.md``. In short:

- One message per change event, on the data topic. Key ``{"table", "row", "column"}``;
  value the Debezium envelope (no ``schema`` wrapper, as with ``schemas.enable=false``):
  ``before``/``after`` are ``null`` when the cell does not exist, else
  ``{"$row": <row key>, "<column>": <value>}``; ``op`` is ``c`` (the cell was created),
  ``u`` (changed) or ``d`` (deleted); ``ts_ms`` is the write batch's time (its id is
  32.32 fixed-point seconds), ``source`` names the connector, domain, write batch,
  seq, table, row and column, and ``transaction`` is the write batch:
  ``{"id": "<domain>:<batch_id>", "total_order": seq + 1, "data_collection_order": n}``.
- Transaction metadata, on the transaction topic: for every write batch, once the epoch
  covering it closes, a ``BEGIN`` and an ``END`` record with the same ``id``;
  ``END`` has ``event_count`` and ``data_collections``.
- Epoch records travel in the data partitions as tombstones (value ``null``) whose
  headers carry the codec's EPOCH messages (see ``sinks.kafka._markers``).

Values keep every bit. JSON numbers carry ints within +-(2**53 - 1) and finite floats
(written with a ``.`` or an exponent, so ``1.0`` stays a float); anything else is an
object with one ``$``-key: ``{"$int64": "<decimal>"}``, ``{"$float64": "<16 hex digits
of the IEEE 754 bits>"}`` (NaN, infinities), ``{"$bytes": "<base64>"}``. ``-0.0`` is the
JSON number ``-0.0``.
"""

from __future__ import annotations

import base64
import json
import math
import struct
from collections.abc import Mapping
from typing import Any, Final

from sequencer import ABSENT, Absent, ChangeEvent, RowKey, Value
from sinks.codec import CodecError

__all__ = [
    "CONNECTOR",
    "ROW_FIELD",
    "batch_transaction_id",
    "decode_event",
    "decode_key",
    "decode_value",
    "encode_event",
    "encode_key",
    "encode_value",
    "transaction_records",
    "ts_ms",
]

CONNECTOR: Final = "cdc-agent"
VERSION: Final = "0.1.0"
ROW_FIELD: Final = "$row"
_MAX_SAFE: Final = (1 << 53) - 1
_F64: Final = struct.Struct(">d")
_dumps = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode


def encode_value(value: Value) -> Any:
    """The JSON-ready form of a cell value (see the module docstring)."""
    kind = type(value)
    if kind is str or value is None or kind is bool:
        return value
    if kind is int:
        return value if -_MAX_SAFE <= value <= _MAX_SAFE else {"$int64": str(value)}  # type: ignore[operator]
    if kind is float:
        if math.isfinite(value):  # type: ignore[arg-type]
            return value
        return {"$float64": _F64.pack(value).hex()}
    if kind is bytes:
        return {"$bytes": base64.b64encode(value).decode("ascii")}  # type: ignore[arg-type]
    raise CodecError(f"cannot encode a value of type {kind.__name__}")


def decode_value(obj: Any) -> Value:
    """Inverse of ``encode_value``."""
    kind = type(obj)
    if kind in (str, bool, float) or obj is None:
        return obj  # type: ignore[no-any-return]
    if kind is int:
        return int(obj)
    if kind is dict and len(obj) == 1:
        ((tag, text),) = obj.items()
        try:
            if tag == "$int64":
                return int(text)
            if tag == "$float64" and len(text) == 16:
                return float(_F64.unpack(bytes.fromhex(text))[0])
            if tag == "$bytes":
                return base64.b64decode(text, validate=True)
        except (ValueError, TypeError) as exc:
            raise CodecError(f"invalid {tag} value {text!r:.40}") from exc
    raise CodecError(f"not a cdc-agent JSON value: {obj!r:.80}")


def encode_key(row: RowKey) -> Any:
    if type(row) not in (str, int):
        raise CodecError(f"cannot encode a row key of type {type(row).__name__}")
    return encode_value(row)


def decode_key(obj: Any) -> RowKey:
    row = decode_value(obj)
    if type(row) not in (str, int):
        raise CodecError(f"invalid row key {obj!r:.80}")
    return row  # type: ignore[return-value]


def ts_ms(batch_id: int) -> int:
    """Milliseconds since the Unix epoch of a write batch id (32.32 fixed-point seconds)."""
    return (batch_id * 1000) >> 32


def batch_transaction_id(domain_id: int, batch_id: int) -> str:
    return f"{domain_id}:{batch_id}"


def _image(row: Any, column: str, value: Value | Absent) -> dict[str, Any] | None:
    if value is ABSENT:
        return None
    return {ROW_FIELD: row, column: encode_value(value)}  # type: ignore[arg-type]


def encode_event(event: ChangeEvent, *, name: str, data_collection_order: int
                 ) -> tuple[bytes, bytes]:
    """``(key, value)`` of one change event, as UTF-8 JSON."""
    row = encode_key(event.row)
    op = "c" if event.old is ABSENT else "d" if event.new is ABSENT else "u"
    ms = ts_ms(event.batch_id)
    envelope = {
        "before": _image(row, event.column, event.old),
        "after": _image(row, event.column, event.new),
        "op": op,
        "ts_ms": ms,
        "source": {
            "version": VERSION,
            "connector": CONNECTOR,
            "name": name,
            "ts_ms": ms,
            "snapshot": "false",
            "db": str(event.domain_id),
            "table": event.table,
            "domain": str(event.domain_id),
            "batch_id": str(event.batch_id),
            "seq": event.seq,
            "row": row,
            "column": event.column,
        },
        "transaction": {
            "id": batch_transaction_id(event.domain_id, event.batch_id),
            "total_order": event.seq + 1,
            "data_collection_order": data_collection_order,
        },
    }
    key = {"table": event.table, "row": row, "column": event.column}
    return _dumps(key).encode(), _dumps(envelope).encode()


def decode_event(value: bytes | str) -> ChangeEvent:
    """The change event of one envelope written by ``encode_event``."""
    try:
        envelope = json.loads(value)
        source = envelope["source"]
        column = source["column"]
        before, after = envelope["before"], envelope["after"]
        return ChangeEvent(
            domain_id=int(source["domain"]),
            batch_id=int(source["batch_id"]),
            seq=int(source["seq"]),
            table=source["table"],
            row=decode_key(source["row"]),
            column=column,
            old=ABSENT if before is None else decode_value(before[column]),
            new=ABSENT if after is None else decode_value(after[column]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise CodecError(f"not a cdc-agent Debezium envelope: {exc}") from exc


def transaction_records(domain_id: int, batch_id: int, event_count: int,
                        tables: Mapping[str, int]) -> list[tuple[bytes, bytes]]:
    """``(key, value)`` of the BEGIN and END transaction records of one write batch."""
    txid = batch_transaction_id(domain_id, batch_id)
    ms = ts_ms(batch_id)
    key = _dumps({"id": txid}).encode()
    begin = {"status": "BEGIN", "id": txid, "ts_ms": ms, "event_count": None,
             "data_collections": None}
    end = {
        "status": "END", "id": txid, "ts_ms": ms, "event_count": event_count,
        "data_collections": [{"data_collection": table, "event_count": count}
                             for table, count in sorted(tables.items())],
    }
    return [(key, _dumps(begin).encode()), (key, _dumps(end).encode())]
