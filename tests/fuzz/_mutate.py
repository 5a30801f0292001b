"""Strategies for untrusted bytes: valid inputs damaged the ways storage and wires do.

``damaged(bases)`` flips bits, overwrites, cuts, inserts, deletes and duplicates byte
ranges of a valid input; ``damaged_json(obj)`` replaces or deletes one value deep inside
a valid JSON document with a hostile one (huge numbers, 1e400, deep nesting, bad types).
``FUZZ`` bounds every fuzz test so the whole suite stays well under a minute.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

FUZZ = settings(max_examples=100, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

HOSTILE_JSON_TEXT = [
    "9" * 5000, "-" + "9" * 5000, "1e400", "-1e400", "NaN", "Infinity", "-1", "1.5",
    "18446744073709551616", "[" * 3000 + "]" * 3000, '{"a":' * 3000 + "1" + "}" * 3000,
    '"\\ud800"', '""', "null", "true", "[]", "{}", '"' + "f" * 64 + '"',
]


@st.composite
def damaged(draw: st.DrawFn, bases: list[bytes], keep: int = 0) -> bytes:
    """One of ``bases`` with 1 to 4 damages after its first ``keep`` bytes."""
    data = bytearray(draw(st.sampled_from(bases)))
    for _ in range(draw(st.integers(1, 4))):
        if len(data) <= keep:
            data += draw(st.binary(min_size=1, max_size=8))
            continue
        at = draw(st.integers(keep, len(data) - 1))
        op = draw(st.sampled_from(["flip", "set", "cut", "insert", "delete", "repeat"]))
        if op == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "set":
            data[at] = draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF, 0xFE]))
        elif op == "cut":
            del data[at:]
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del data[at:at + draw(st.integers(1, 16))]
        else:
            data[at:at] = data[at:at + draw(st.integers(1, 64))]
    return bytes(data)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(obj, dict):
        for key, value in obj.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            out += _paths(value, (*prefix, i))
    return out


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=8)


@st.composite
def damaged_json(draw: st.DrawFn, obj: Any) -> bytes:
    """``obj`` as JSON with one value replaced (or deleted) by a hostile one."""
    obj = json.loads(json.dumps(obj))
    path = draw(st.sampled_from(_paths(obj)))
    marker = "\x00HOSTILE\x00"
    hostile = draw(st.sampled_from(HOSTILE_JSON_TEXT) | json_values.map(json.dumps))
    if not path:
        return hostile.encode()
    parent = obj
    for key in path[:-1]:
        parent = parent[key]
    if draw(st.booleans()) and isinstance(parent, dict):
        del parent[path[-1]]
        return json.dumps(obj).encode()
    parent[path[-1]] = marker
    return json.dumps(obj).replace(json.dumps(marker), hostile).encode()
