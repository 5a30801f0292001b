"""The sidecar protocol: values round-trip bit for bit; bad requests get the right code."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from agent.sidecar import _protocol as p
from sequencer import ABSENT
from sinks.codec import encode_value as tagged

INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
FLOATS = st.integers(0, (1 << 64) - 1).map(
    lambda b: struct.unpack(">d", struct.pack(">Q", b))[0]) | st.floats()
VALUES = st.none() | st.booleans() | INT64 | FLOATS | st.text() | st.binary()
NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True)
ROWS = INT64 | st.text()


def wire(obj: object) -> object:
    """Through real JSON text, as a client in another language would see it."""
    return json.loads(json.dumps(obj, allow_nan=False))


@given(VALUES | st.just(ABSENT))
def test_values_round_trip_bit_for_bit(value: object) -> None:
    """Every value, ABSENT included, decodes to exactly the bits it was encoded from."""
    decoded = p.decode_value(wire(p.encode_value(value)))  # type: ignore[arg-type]
    assert type(decoded) is type(value)
    assert tagged(decoded) == tagged(value)  # type: ignore[arg-type]


@given(INT64)
def test_ints_also_travel_as_decimal_strings(value: int) -> None:
    """{"int": "<decimal>"} is the same int (for clients whose JSON numbers are doubles)."""
    assert p.decode_value({"int": str(value)}) == value
    assert p.decode_row({"int": str(value)}) == value


@given(NAMES, ROWS, NAMES, VALUES | st.just(ABSENT), VALUES)
def test_event_requests_round_trip(table: str, row: object, column: str, old: object,
                                   new: object) -> None:
    """An events request built by the encoder parses back to the very same event."""
    event = (table, row, column, old, new)
    line = p.encode_request("events", 7, batch="00ff", events=[p.encode_event(event)])  # type: ignore[arg-type]
    request = p.parse_request(line)
    assert request == p.Events(7, "00ff", [request.events[0]])  # type: ignore[union-attr]
    got = request.events[0]  # type: ignore[union-attr]
    assert got[:3] == (table, row, column)
    assert [tagged(v) for v in got[3:]] == [tagged(old), tagged(new)]  # type: ignore[arg-type]


def test_special_floats_keep_their_bits() -> None:
    """-0.0, infinities and NaN payloads are sent as their 64-bit pattern."""
    nan = struct.unpack(">d", bytes.fromhex("7ff0000000000123"))[0]
    assert p.encode_value(nan) == {"f64": "7ff0000000000123"}
    assert p.encode_value(-0.0) == {"f64": "8000000000000000"}
    assert tagged(p.decode_value({"f64": "FFF8000000000001"})) == b"\x03" + bytes.fromhex(
        "fff8000000000001")


@pytest.mark.parametrize(("line", "code", "fragment"), [
    (b"{not json\n", p.BAD_JSON, "not valid JSON"),
    (b"[1, 2]\n", p.BAD_JSON, "JSON object"),
    (b"\xff\xfe{}\n", p.BAD_JSON, "not valid JSON"),
    (b'{"op": "drop_table"}\n', p.UNKNOWN_OP, "unknown op 'drop_table'"),
    (b'{"id": 3}\n', p.UNKNOWN_OP, "unknown op None"),
    (b'{"op": "hello"}\n', p.BAD_REQUEST, "protocol"),
    (b'{"op": "events", "batch": "1"}\n', p.BAD_REQUEST, "events"),
    (b'{"op": "close"}\n', p.BAD_REQUEST, "batch"),
    (b'{"op": "events", "batch": "1", "events": [["t", 1, "a"]]}\n', p.BAD_REQUEST,
     "event 0"),
    (b'{"op": "events", "batch": "1", "events": [["t", 1, "a", null, 1.5]]}\n', p.BAD_VALUE,
     "f64"),
    (b'{"op": "events", "batch": "1", "events": [["t", 1, "a", null, NaN]]}\n', p.BAD_JSON,
     "NaN"),
    (b'{"op": "events", "batch": "1", "events": [["t", 1, "a", null, {"f64": "12"}]]}\n',
     p.BAD_VALUE, "not a value"),
    (b'{"op": "events", "batch": "1", "events": [["t", 1, "a", null, {"b64": "%%"}]]}\n',
     p.BAD_VALUE, "base64"),
    (b'{"op": "events", "batch": "1", "events": [["t", 1, "a", null, 9223372036854775808]]}\n',
     p.BAD_VALUE, "64-bit"),
    (b'{"op": "events", "batch": "1", "events": [["t", 1, "a", null, "\\ud800"]]}\n',
     p.BAD_VALUE, "surrogate"),
    (b'{"op": "events", "batch": "1", "events": [["t", 1.5, "a", null, 1]]}\n', p.BAD_VALUE,
     "row key 1.5"),
    (b'{"op": "events", "batch": "1", "events": [["t", null, "a", null, 1]]}\n', p.BAD_VALUE,
     "row key"),
    (b'{"op": "events", "batch": "1", "events": [["no such", 1, "a", null, 1]]}\n',
     p.INVALID_WRITE, "table name"),
    (b'{"op": "events", "batch": "1", "events": [["t", 1, "a", {"absent": true}, '
     b'{"absent": true}]]}\n', p.INVALID_WRITE, "both absent"),
    (b'{"op": "events", "batch": "1", "events": [["t", 1, "a", null, 1], '
     b'["t", 1, "b", null, {"x": 1}]]}\n', p.BAD_VALUE, "event 1"),
])
def test_bad_requests_get_a_code_and_a_clear_message(line: bytes, code: str,
                                                     fragment: str) -> None:
    """Every malformed request raises ProtocolError with the reply's code, naming the fault."""
    with pytest.raises(p.ProtocolError) as info:
        p.parse_request(line)
    assert info.value.code == code
    assert fragment in info.value.message


def test_errors_keep_the_request_id() -> None:
    """A refused request's id is echoed, so a pipelining client can match the reply."""
    with pytest.raises(p.ProtocolError) as info:
        p.parse_request(b'{"op": "events", "id": "r-9", "batch": 1}')
    reply = p.decode_reply(p.encode_error(info.value.request_id, info.value.code,
                                          info.value.message))
    assert reply == {"id": "r-9", "ok": False, "error": "bad_request",
                     "message": info.value.message}


def test_replies_are_one_json_line() -> None:
    """Replies are single lines of JSON, non-ASCII text kept as UTF-8."""
    line = p.encode_reply(1, batch="é\n")
    assert line.count(b"\n") == 1 and line.endswith(b"\n")
    assert p.decode_reply(line) == {"id": 1, "ok": True, "batch": "é\n"}


def test_the_sidecar_package_exports_are_pinned() -> None:
    """agent.sidecar's public names are deliberate (and sorted)."""
    import agent.sidecar

    assert agent.sidecar.__all__ == [
        "PROTOCOL_VERSION", "ProtocolError", "Sidecar", "SidecarAddressInUse",
        "SidecarClient", "SidecarError", "SidecarSocketError", "SidecarUnavailable"]
    assert agent.sidecar.PROTOCOL_VERSION == 2


def _as_json_loads_sees_it(line: bytes) -> bool:
    """Whether json.loads (bytes: encoding detected, surrogates passed) reads a dict."""
    def refuse(name: str) -> object:
        raise ValueError(name)

    try:
        return type(json.loads(line, parse_constant=refuse)) is dict
    except (ValueError, RecursionError):
        return False


_LINES = st.one_of(
    st.binary(max_size=30),
    st.binary(max_size=30).map(lambda b: b"{" + b),
    st.sampled_from([b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff", b""]).flatmap(
        lambda bom: st.sampled_from(["utf-8", "utf-16-le", "utf-16-be", "utf-32-le"]).map(
            lambda enc: bom + '{"op": "ping", "x": "\u00e9"}'.encode(enc))),
    st.text(max_size=20).map(lambda t: json.dumps({"op": "ping", "t": t}).encode()),
    st.just(b'{"op": "ping", "s": "\xed\xa0\x80"}'),  # a lone surrogate, UTF-8 encoded
)


@given(_LINES)
def test_request_bytes_decode_exactly_as_json_loads_would(line: bytes) -> None:
    """A line is bad_json exactly when json.loads would not read an object from it (the
    UTF-8 fast path changes nothing: BOMs, UTF-16/32, encoded surrogates alike)."""
    try:
        p.parse_request(line)
        code = None
    except p.ProtocolError as exc:
        code = exc.code
    assert (code == p.BAD_JSON) == (not _as_json_loads_sees_it(line))


EDGES = st.sampled_from([1 << 63, -(1 << 63) - 1, (1 << 63) - 1, "\ud800", "x\udfff", "é"])
JSONISH = (st.none() | st.booleans() | st.integers(-(1 << 64), 1 << 64) | st.text() | EDGES
           | st.floats(allow_nan=False, allow_infinity=False)
           | st.dictionaries(st.sampled_from(["int", "f64", "b64", "absent"]),
                             st.text(max_size=20) | st.booleans(), max_size=2))
EVENTISH = st.lists(NAMES | st.text(max_size=5) | JSONISH, min_size=4, max_size=6) | st.tuples(
    NAMES | st.sampled_from(["9x", "", "a-b"]), ROWS | JSONISH, NAMES, EDGES | JSONISH,
    EDGES | JSONISH).map(list)


@given(EVENTISH, st.booleans())
@example(["t", 1, "c", 1 << 63, 1], True)
@example(["t", 1, "c", None, "\ud800"], True)
@example(["t", 1 << 63, "c", None, 1], True)
@example(["t", "\udc00", "c", None, 1], True)
def test_the_fast_event_path_agrees_with_the_full_checks(raw: list[object],
                                                         seen: bool) -> None:
    """The fast path for common events returns what the full checks return, and lets
    nothing through that they refuse (names seen before or not)."""
    if seen:  # names the full checks accepted once take the fast path
        for name in raw[:1] + raw[2:3]:
            if isinstance(name, str):
                try:
                    p._decode_event_checked(0, [name, 1, "c", None, 1])
                    p._decode_event_checked(0, ["t", 1, name, None, 1])
                except p.ProtocolError:
                    pass
    try:
        expected: object = p._decode_event_checked(0, raw)
    except p.ProtocolError as exc:
        expected = exc.code
    try:
        got: object = p._decode_event(0, raw)
    except p.ProtocolError as exc:
        got = exc.code
    assert type(got) is type(expected)
    if isinstance(got, tuple):
        assert [type(x) for x in got] == [type(x) for x in expected]  # type: ignore[attr-defined]
        assert got == expected
    else:
        assert got == expected
