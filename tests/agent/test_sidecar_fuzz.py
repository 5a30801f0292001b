"""Malformed and hostile sidecar requests: each gets exactly one documented error reply,
and the connection, with its open batches, keeps working (issue 10, item 6)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.sidecar import _protocol as p
from tests.agent._sidecar import Raw, Served, short_dir

# The error codes docs/sidecar.md documents (line_too_long closes, so it is not here).
DOCUMENTED = {p.BAD_JSON, p.UNKNOWN_OP, p.BAD_REQUEST, p.BAD_VALUE, p.INVALID_WRITE,
              p.UNKNOWN_BATCH, p.HELLO_REQUIRED, p.UNSUPPORTED_PROTOCOL}


@pytest.fixture
def folder() -> Iterator[Path]:
    with short_dir() as path:
        yield path


HOSTILE: list[bytes] = [
    b'{"op": "ping", "id": 1e400}\n',
    b'{"op": "ping", "id": -1e400}\n',
    b'{"op": "ping", "id": "\\ud800"}\n',
    b'{"op": "ping", "id": "\\udfff\\ud800x"}\n',
    b'{"op": "events", "batch": "BATCH", "events": [[["t"], 1, "c", null, 1]]}\n',
    b'{"op": "events", "batch": "BATCH", "events": [[{"t": 1}, 1, "c", null, 1]]}\n',
    b'{"op": "events", "batch": "BATCH", "events": [["t", 1, ["c"], null, 1]]}\n',
    b'{"op": "events", "batch": "BATCH", "events": [["t", 1, {"c": 2}, null, 1]]}\n',
    b'{"op": "close", "id": 1e400, "batch": "BATCH", "events": [["t", 1, 7, null, 1]]}\n',
    b'{"op": "events", "id": "\\ud800", "batch": "BATCH", "events": [[null, 1, "c", 1, 2]]}\n',
    b'{"op": "hello", "protocol": 1, "client": ["x"]}\n',
    b'{"op": "hello", "protocol": 1e400}\n',
    b'{"op": "\\ud800"}\n',
]
# Well-formed for the parser, refused by the server.
UNKNOWN = [b'{"op": "events", "batch": "\\ud800", "events": []}\n']


def _check_one_reply(raw: Raw, line: bytes) -> dict[str, Any]:
    reply = raw.call(line)
    assert type(reply["ok"]) is bool, reply
    if not reply["ok"]:
        assert reply["error"] in DOCUMENTED, reply
        assert reply["message"], reply
    return reply


def test_hostile_requests_each_get_one_error_and_the_batch_survives(folder: Path) -> None:
    served = Served(folder / "s")
    raw = Raw(folder / "s")
    batch = raw.open()
    assert raw.call({"op": "events", "batch": batch,
                     "events": [["t", 1, "a", {"absent": True}, 1]]})["events"] == 1
    for line in HOSTILE + UNKNOWN:
        reply = _check_one_reply(raw, line.replace(b"BATCH", batch.encode()))
        assert reply["ok"] is False, (line, reply)
        assert reply["error"] in (p.BAD_REQUEST, p.UNKNOWN_OP, p.UNKNOWN_BATCH), (line, reply)
        assert reply["id"] is None or type(reply["id"]) in (int, str), reply
    # Same connection, same batch: still open, with exactly the one accepted event.
    assert raw.call({"op": "ping", "id": 7}) == {"id": 7, "ok": True}
    assert raw.call({"op": "close", "batch": batch,
                     "events": [["t", 2, "a", {"absent": True}, 2]]})["events"] == 2
    raw.close()
    served.stop()
    [snap] = served.replay()
    assert snap.state == {("t", 1, "a"): 1, ("t", 2, "a"): 2}


@pytest.mark.parametrize("line", HOSTILE)
def test_the_parser_refuses_hostile_requests_with_a_protocol_error(line: bytes) -> None:
    with pytest.raises(p.ProtocolError) as info:
        p.parse_request(line.replace(b"BATCH", b"0000000000000001"))
    error = info.value
    reply = p.decode_reply(p.encode_error(error.request_id, error.code, error.message))
    assert reply["ok"] is False and reply["error"] == error.code


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70),
                     st.floats(allow_nan=False, allow_infinity=False),
                     st.text(max_size=8), st.sampled_from(["\ud800", "t", "c", "b64", "f64"]))
_json = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12)
_ids = st.one_of(_json, st.sampled_from(["1e400", "-1e400", "1e-400", "\"\\ud800\""]).map(
    lambda text: _Literal(text)))


class _Literal:
    """Raw JSON text (numbers json.dumps cannot write, e.g. 1e400)."""

    def __init__(self, text: str) -> None:
        self.text = text


_events = st.lists(st.one_of(
    st.tuples(st.one_of(st.just("t"), _json), st.one_of(st.integers(), _json),
              st.one_of(st.just("c"), _json), _json, _json).map(list),
    _json), max_size=3)


@st.composite
def _requests(draw: st.DrawFn) -> dict[str, Any]:
    message: dict[str, Any] = {}
    message["op"] = draw(st.one_of(st.sampled_from(["ping", "events", "close", "hello",
                                                    "flush", "open", "health", "bogus"]),
                                   _json))
    if draw(st.booleans()):
        message["id"] = draw(_ids)
    if draw(st.booleans()):
        message["batch"] = draw(st.one_of(st.just("BATCH"), _json))
    if draw(st.booleans()):
        message["events"] = draw(st.one_of(_events, _json))
    if draw(st.booleans()):
        message["protocol"] = draw(st.one_of(st.just(1), _json))
    if draw(st.booleans()):
        message["durable"] = draw(st.one_of(st.booleans(), _json))
    if draw(st.booleans()):
        message[draw(st.text(max_size=4))] = draw(_json)
    return message


def _encode(message: dict[str, Any], batch: str) -> bytes:
    parts = []
    for key, value in message.items():
        text = value.text if isinstance(value, _Literal) else json.dumps(value)
        parts.append(f"{json.dumps(key)}: {text}")
    line = "{" + ", ".join(parts) + "}"
    return line.replace('"BATCH"', json.dumps(batch)).encode() + b"\n"


def test_fuzzed_requests_get_one_documented_reply_and_keep_the_connection(
        folder: Path) -> None:
    """Hypothesis: any request (any JSON in any field, ids JSON cannot echo) gets exactly
    one reply, ok or a documented error; afterwards the connection and its batch work."""
    served = Served(folder / "s")
    raw = Raw(folder / "s")
    batch = raw.open()
    accepted = 0

    @settings(max_examples=300, deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(_requests())
    def check(message: dict[str, Any]) -> None:
        nonlocal batch, accepted
        if message.get("op") in ("close", "open", "hello") or message.get("op") == "flush":
            message = {**message, "op": "ping"}  # keep the one batch open, no waits
        reply = _check_one_reply(raw, _encode(message, batch))
        if reply["ok"] and message.get("op") == "events":
            accepted = reply["events"]
        assert raw.call({"op": "events", "batch": batch, "events": []}) == {
            "id": None, "ok": True, "events": accepted}

    check()
    assert raw.call({"op": "close", "batch": batch})["ok"]
    raw.close()
    served.stop()  # (fuzzed events' old values do not chain: no replay here)
