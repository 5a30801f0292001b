"""The sidecar's wire protocol, sans-IO: JSON lines in, JSON lines out (versions 1, 2).

Each message is one JSON object on one line (UTF-8, ended by ``\\n``). A request names
its ``op``; an optional ``id`` (any JSON scalar) is echoed in the reply. Replies come
in request order, one per request (version 2: none for a successful ``events`` or
non-durable ``close``): ``{"id": ..., "ok": true, ...}`` or
``{"id": ..., "ok": false, "error": CODE, "message": TEXT}``. The full description,
with an example session, is ``docs/sidecar.md``.

Values keep every bit (the ``sequencer`` value model):

    null                      None
    true / false              bool
    -12 or {"int": "-12"}     64-bit signed int (the string form for languages whose
                              JSON numbers are doubles); a JSON number with a fraction
                              or exponent is refused
    {"f64": "7ff8000000000001"}  float, its IEEE 754 bit pattern as 16 hex digits,
                              big-endian (NaN payloads, -0.0, infinities)
    "text"                    str (valid Unicode: no lone surrogates)
    {"b64": "AAE="}           bytes, standard base64 with padding
    {"absent": true}          ABSENT: the cell does not exist (only as old or new)

Row keys are a JSON string or a 64-bit int (either form above). Nothing here does I/O:
``parse_request`` turns a line into a request or raises ``ProtocolError`` carrying the
error code to answer; the encoders turn values and replies into lines.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import struct
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from sequencer import (
    ABSENT,
    Absent,
    InvalidWrite,
    RowKey,
    Value,
    check_name,
    check_row,
    check_value,
)

__all__ = [
    "PROTOCOL_VERSION",
    "SUPPORTED_PROTOCOLS",
    "Close",
    "Event",
    "Events",
    "Flush",
    "Health",
    "Hello",
    "Open",
    "Ping",
    "ProtocolError",
    "Request",
    "decode_reply",
    "decode_row",
    "decode_value",
    "encode_error",
    "encode_event",
    "encode_reply",
    "encode_request",
    "encode_row",
    "encode_value",
    "parse_request",
]

PROTOCOL_VERSION: Final = 2
# Version 2 (asked for in hello) differs from 1 in one way: a successful ``events`` or
# non-durable ``close`` gets no reply (a failure still does, echoing the request's id),
# so a client tells replies apart by the ids it gives the requests it waits for.
SUPPORTED_PROTOCOLS: Final = (1, 2)
INT64_MIN: Final = -(1 << 63)
INT64_MAX: Final = (1 << 63) - 1

Event: TypeAlias = tuple[str, RowKey, str, Value | Absent, Value | Absent]
RequestId: TypeAlias = str | int | float | bool | None

# Error codes (the "error" field of a failed reply).
BAD_JSON: Final = "bad_json"              # the line is not a JSON object
BAD_REQUEST: Final = "bad_request"        # a field is missing or has the wrong type
UNKNOWN_OP: Final = "unknown_op"          # "op" names no operation
BAD_VALUE: Final = "bad_value"            # a value or row key is not in the encoding
INVALID_WRITE: Final = "invalid_write"    # refused by the value model (names, ranges)
UNKNOWN_BATCH: Final = "unknown_batch"    # not a batch open on this connection
HELLO_REQUIRED: Final = "hello_required"  # the first request must be hello
UNSUPPORTED_PROTOCOL: Final = "unsupported_protocol"
CLOSING: Final = "closing"                # the sidecar is shutting down: no new batch
QUIESCENCE_TIMEOUT: Final = "quiescence_timeout"  # forced quiescence held the batch back
SHIPPING_FAILED: Final = "shipping_failed"  # the sink failed; the log misses records
BACKPRESSURE: Final = "backpressure"      # the sink is behind: no new batch for now
UNHEALTHY: Final = "unhealthy"            # health: the sidecar cannot capture (says why)
LINE_TOO_LONG: Final = "line_too_long"    # over the line limit; the connection closes
MEMORY_LIMIT: Final = "memory_limit"      # the global request budget is spent; closes
INTERNAL: Final = "internal"              # a sidecar bug (logged); the connection stays


class ProtocolError(ValueError):
    """A request the sidecar refuses; ``code`` is the error code of the reply."""

    def __init__(self, code: str, message: str, request_id: RequestId = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id


# -- requests -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    id: RequestId
    protocol: int
    client: str
    durable: bool = False  # this connection's closes answer once durable in the sink


@dataclass(frozen=True, slots=True)
class Ping:
    id: RequestId


@dataclass(frozen=True, slots=True)
class Open:
    id: RequestId


@dataclass(frozen=True, slots=True)
class Events:
    id: RequestId
    batch: str
    events: list[Event]


@dataclass(frozen=True, slots=True)
class Close:
    id: RequestId
    batch: str
    events: list[Event]
    durable: bool | None = None  # None: the connection's choice (hello's "durable")


@dataclass(frozen=True, slots=True)
class Flush:
    id: RequestId


@dataclass(frozen=True, slots=True)
class Health:
    """A liveness probe (allowed before ``hello``): ok when the sidecar can capture."""

    id: RequestId


Request: TypeAlias = Hello | Ping | Open | Events | Close | Flush | Health

_OPS: Final = ("hello", "ping", "open", "events", "close", "flush", "health")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# Made once: json.loads and json.dumps with options build a new decoder or encoder per
# call, a measurable share of a request's cost.
_DECODER: Final = json.JSONDecoder(parse_constant=_refuse_constant)
_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def parse_request(line: bytes | str) -> Request:
    """Decode and check one request line; raise ``ProtocolError`` with the reply's code."""
    try:
        if not isinstance(line, str):  # as json.loads decodes bytes
            # A line opening with two non-NUL bytes other than a BOM is UTF-8 to
            # json.detect_encoding too: skip asking it (the common case).
            utf8 = len(line) > 1 and line[0] == 0x7B and line[1] != 0
            line = line.decode("utf-8" if utf8 else json.detect_encoding(line),
                               "surrogatepass")
        message = _DECODER.decode(line)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise ProtocolError(BAD_JSON, f"the line is not valid JSON: {exc}") from None
    if type(message) is not dict:
        raise ProtocolError(BAD_JSON, "a request is a JSON object, one per line")
    request_id = _request_id(message.get("id"))
    op = message.get("op")
    if op in ("snapshot_hold", "snapshot_chunk"):  # baselines: agent.sidecar._snapshot_ops
        from agent.sidecar._snapshot_ops import parse_snapshot_request

        try:
            return parse_snapshot_request(op, message, request_id)  # type: ignore[return-value]
        except ProtocolError as exc:
            exc.request_id = request_id
            raise
    if op not in _OPS:
        raise ProtocolError(UNKNOWN_OP, f"unknown op {op!r}; known: {', '.join(_OPS)}",
                            request_id)
    try:
        if op == "events" or op == "close":
            batch = message.get("batch")
            if type(batch) is not str:
                raise ProtocolError(BAD_REQUEST, f"{op} needs \"batch\": the string that "
                                    "open returned")
            raw_events = message.get("events", [] if op == "close" else None)
            if type(raw_events) is not list:
                raise ProtocolError(BAD_REQUEST, f"{op} needs \"events\": a list of "
                                    "[table, row, column, old, new]")
            events = [_decode_event(i, raw) for i, raw in enumerate(raw_events)]
            if op == "events":
                return Events(request_id, batch, events)
            return Close(request_id, batch, events, _optional_bool(message, "durable"))
        if op == "hello":
            protocol = message.get("protocol")
            client = message.get("client", "")
            if type(protocol) is not int or type(client) is not str:
                raise ProtocolError(BAD_REQUEST, "hello needs \"protocol\": an integer "
                                    f"(this sidecar speaks {PROTOCOL_VERSION}) and an "
                                    "optional \"client\" string")
            return Hello(request_id, protocol, client,
                         _optional_bool(message, "durable") or False)
        if op == "ping":
            return Ping(request_id)
        if op == "open":
            return Open(request_id)
        if op == "health":
            return Health(request_id)
        return Flush(request_id)
    except ProtocolError as exc:
        exc.request_id = request_id
        raise


def _optional_bool(message: dict[str, Any], name: str) -> bool | None:
    value = message.get(name)
    if value is not None and type(value) is not bool:
        raise ProtocolError(BAD_REQUEST, f"\"{name}\" must be true or false")
    return value


def _request_id(raw: object) -> RequestId:
    """The request's ``id``, if the reply can echo it (else ``bad_request``, id null)."""
    if raw is None:
        return None
    kind = type(raw)
    if kind not in (str, int, float, bool):
        raise ProtocolError(BAD_REQUEST, "\"id\" must be a JSON scalar (string or number)")
    if kind is float and not math.isfinite(raw):  # type: ignore[arg-type]
        raise ProtocolError(BAD_REQUEST, "\"id\" is a number out of the double range "
                            "(e.g. 1e400); use a smaller number or a string")
    if kind is str:
        try:
            raw.encode("utf-8")  # type: ignore[attr-defined]
        except UnicodeEncodeError:
            raise ProtocolError(BAD_REQUEST, "\"id\" holds a lone surrogate; strings must "
                                "be valid Unicode") from None
    return raw  # type: ignore[return-value]


_NAMES: set[str] = set()  # table and column names that passed check_name (bounded)
_NAMES_MAX: Final = 100_000


def _decode_event(index: int, raw: object) -> Event:
    # The common event first: names seen before, an ASCII str or in-range int row, and
    # values that are JSON literals decoding to themselves (null, a bool, an in-range
    # int, an ASCII str: a lone surrogate needs a non-ASCII escape). These need none
    # of the checks below; anything else takes them all.
    if type(raw) is list and len(raw) == 5:
        table, row, column, old, new = raw
        kind, old_kind, new_kind = type(row), type(old), type(new)
        if (type(table) is str and table in _NAMES and type(column) is str
                and column in _NAMES
                and ((kind is int and INT64_MIN <= row <= INT64_MAX)
                     or (kind is str and row.isascii()))
                and (old is None or old_kind is bool
                     or (old_kind is int and INT64_MIN <= old <= INT64_MAX)
                     or (old_kind is str and old.isascii()))
                and (new is None or new_kind is bool
                     or (new_kind is int and INT64_MIN <= new <= INT64_MAX)
                     or (new_kind is str and new.isascii()))):
            return (table, row, column, old, new)
    return _decode_event_checked(index, raw)


def _decode_event_checked(index: int, raw: object) -> Event:
    if type(raw) is not list or len(raw) != 5:
        raise ProtocolError(BAD_REQUEST, f"event {index}: an event is a list "
                            "[table, row, column, old, new]")
    table, row, column, old, new = raw
    for kind, name in (("table", table), ("column", column)):
        if type(name) is not str:
            raise ProtocolError(BAD_REQUEST, f"event {index}: the {kind} must be a string "
                                f"(an identifier), not a JSON {_json_type(name)}")
    try:
        check_name("table", table)
        row_key = check_row(decode_row(row))
        check_name("column", column)
        old_value = decode_value(old)
        new_value = decode_value(new)
        if old_value is not ABSENT:
            check_value(old_value)
        if new_value is not ABSENT:
            check_value(new_value)
    except ProtocolError as exc:
        raise ProtocolError(exc.code, f"event {index}: {exc.message}") from None
    except InvalidWrite as exc:
        raise ProtocolError(INVALID_WRITE, f"event {index}: {exc}") from None
    if old_value is ABSENT and new_value is ABSENT:
        raise ProtocolError(INVALID_WRITE, f"event {index}: old and new are both absent: "
                            "nothing changed, so there is no event to report")
    if len(_NAMES) < _NAMES_MAX:  # checked: the next event naming them is fast
        _NAMES.add(table)
        _NAMES.add(column)
    return (table, row_key, column, old_value, new_value)


def _json_type(obj: object) -> str:
    return {list: "array", dict: "object", bool: "boolean", int: "number",
            float: "number", type(None): "null"}.get(type(obj), type(obj).__name__)


# -- values ---------------------------------------------------------------------------

_F64: Final = struct.Struct(">d")
_HEX16: Final = re.compile(r"[0-9a-fA-F]{16}\Z")
_DECIMAL: Final = re.compile(r"-?(0|[1-9][0-9]{0,18})\Z")


def encode_value(value: Value | Absent) -> Any:
    """The JSON form of a cell value (see the module docstring)."""
    kind = type(value)
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        return value
    if kind is float:
        return {"f64": _F64.pack(value).hex()}
    if kind is bytes:
        return {"b64": base64.b64encode(value).decode("ascii")}  # type: ignore[arg-type]
    if value is ABSENT:
        return {"absent": True}
    raise InvalidWrite(f"value {value!r:.80} has type {kind.__name__}; a cell holds None, "
                       "bool, 64-bit int, float, str or bytes")


def decode_value(obj: object) -> Value | Absent:
    """Inverse of ``encode_value``; raise ``ProtocolError`` (``bad_value``) otherwise."""
    kind = type(obj)
    if obj is None or kind is bool:
        return obj  # type: ignore[return-value]
    if kind is str:
        return _checked_str(obj)  # type: ignore[arg-type]
    if kind is int:
        return _checked_int(obj)  # type: ignore[arg-type]
    if kind is float:
        raise ProtocolError(BAD_VALUE, f"{obj!r}: a float is sent as "
                            "{\"f64\": \"<16 hex digits of its bits>\"}, never as a JSON "
                            "number (which would lose bits)")
    if kind is dict and len(obj) == 1:  # type: ignore[arg-type]
        ((tag, body),) = obj.items()  # type: ignore[attr-defined]
        if tag == "f64" and type(body) is str and _HEX16.match(body):
            return float(_F64.unpack(bytes.fromhex(body))[0])
        if tag == "int" and type(body) is str and _DECIMAL.match(body):
            return _checked_int(int(body))
        if tag == "b64" and type(body) is str:
            try:
                return base64.b64decode(body.encode("ascii"), validate=True)
            except (binascii.Error, UnicodeEncodeError):
                raise ProtocolError(BAD_VALUE, f"{body[:40]!r} is not standard base64 "
                                    "(A-Z a-z 0-9 + /, padded with =)") from None
        if tag == "absent" and body is True:
            return ABSENT
    raise ProtocolError(BAD_VALUE, f"{json.dumps(obj)[:80]} is not a value: use null, "
                        "true/false, an integer, a string, {\"int\": \"<decimal>\"}, "
                        "{\"f64\": \"<16 hex>\"}, {\"b64\": \"<base64>\"} or "
                        "{\"absent\": true}")


def _checked_int(value: int) -> int:
    if not INT64_MIN <= value <= INT64_MAX:
        raise ProtocolError(BAD_VALUE, f"{value} does not fit in a signed 64-bit integer")
    return value


def _checked_str(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ProtocolError(BAD_VALUE, f"string {value[:40]!r} holds a lone surrogate; "
                            "strings must be valid Unicode") from None
    return value


def encode_row(row: RowKey) -> Any:
    """The JSON form of a row key: a string or an integer."""
    return row


def decode_row(obj: object) -> RowKey:
    """A row key: a JSON string, an integer, or ``{"int": "<decimal>"}``."""
    kind = type(obj)
    if kind is str:
        return _checked_str(obj)  # type: ignore[arg-type]
    if kind is int or kind is dict:
        value = decode_value(obj)
        if type(value) is int:
            return value
    raise ProtocolError(BAD_VALUE, f"row key {json.dumps(obj)[:80]} is not a string or a "
                        "64-bit integer")


def encode_event(event: Event) -> list[Any]:
    table, row, column, old, new = event
    return [table, encode_row(row), column, encode_value(old), encode_value(new)]


# -- lines ----------------------------------------------------------------------------


def _line(message: dict[str, Any]) -> bytes:
    return _ENCODER.encode(message).encode("utf-8") + b"\n"


def encode_request(op: str, request_id: RequestId = None, **fields: Any) -> bytes:
    """One request line: ``{"op": op, "id": request_id, **fields}``."""
    message: dict[str, Any] = {"op": op}
    if request_id is not None:
        message["id"] = request_id
    message.update(fields)
    return _line(message)


def encode_reply(request_id: RequestId, **fields: Any) -> bytes:
    """A success reply line."""
    return _line({"id": request_id, "ok": True, **fields})


def encode_error(request_id: RequestId, code: str, message: str) -> bytes:
    """A failure reply line (always one: what cannot be encoded is escaped or dropped)."""
    try:
        return _line({"id": request_id, "ok": False, "error": code, "message": message})
    except (ValueError, TypeError):  # an id or message JSON cannot carry (UnicodeError too)
        safe = message.encode("utf-8", "backslashreplace").decode("utf-8")
        return _line({"id": None, "ok": False, "error": code, "message": safe})


def decode_reply(line: bytes) -> dict[str, Any]:
    """A reply line as a dict (``ok``, then ``error`` and ``message`` or the fields)."""
    try:
        reply = json.loads(line)
    except ValueError as exc:
        raise ProtocolError(BAD_JSON, f"the sidecar's reply is not JSON: {exc}") from None
    if type(reply) is not dict or type(reply.get("ok")) is not bool:
        raise ProtocolError(BAD_JSON, f"the sidecar's reply {line[:80]!r} has no \"ok\"")
    return reply
