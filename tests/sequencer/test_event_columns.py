"""``sequencer._native.event_columns``: a shipment's variable event columns in Arrow's
layout, built in C. The reference is ``sinks.codec`` (UTF-8 names, ``encode_value``'s
tagged bytes); whatever the codec would refuse, or C does not know, comes back as None
so the shipper encodes it in Python and the codec refuses it with its own error."""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from sequencer import ABSENT
from sinks.codec import encode_value
from tests.sequencer._impls import native

cells = st.one_of(
    st.none(), st.booleans(), st.integers(-(1 << 63), (1 << 63) - 1),
    st.floats(), st.sampled_from([math.nan, -0.0, math.inf]), st.text(max_size=6),
    st.binary(max_size=6), st.just(ABSENT))
names = st.text(max_size=6)  # any str: the encoder does not check names
events = st.tuples(names, st.one_of(st.text(max_size=4), st.integers(-(1 << 63), 1 << 62)),
                   names, cells, cells)
shipments = st.lists(st.lists(events, max_size=5), max_size=5)


def columns(encoded: Any, n: int) -> list[list[bytes]]:
    for ends, data in encoded:  # every byte of the data is a value's (nothing unset)
        assert len(ends) == 4 * (n + 1)
        assert len(data) == int.from_bytes(ends[-4:], "little")
    return [pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(ends),
                                                   pa.py_buffer(data)]).to_pylist()
            for ends, data in encoded]


@settings(max_examples=150, deadline=None)
@given(shipments)
def test_the_columns_hold_the_codecs_bytes(lists: list[list[tuple[Any, ...]]]) -> None:
    flat = [e for segment in lists for e in segment]
    got = columns(native().event_columns(lists), len(flat))
    want = [[e[0].encode() for e in flat], [encode_value(e[1]) for e in flat],
            [e[2].encode() for e in flat], [encode_value(e[3]) for e in flat],
            [encode_value(e[4]) for e in flat]]
    assert got == want


class Text(str):
    pass


# What C leaves to the codec: each would make it refuse, or is not C's to judge.
odd = st.sampled_from([1 << 63, -(1 << 63) - 1, "\ud800", Text("x"), [1], 1j, object()])


@settings(max_examples=100, deadline=None)
@given(shipments.filter(any), st.data())
def test_anything_else_is_left_to_the_codec(lists: list[list[tuple[Any, ...]]],
                                            data: st.DataObject) -> None:
    segment = data.draw(st.sampled_from([s for s in lists if s]))
    at = data.draw(st.integers(0, len(segment) - 1))
    column = data.draw(st.integers(0, 4))
    value = data.draw(odd)
    if column in (0, 2) and value in (1 << 63, -(1 << 63) - 1):
        value = 7  # a name must be a str: any int is left to the codec
    event = list(segment[at])
    event[column] = value
    segment[at] = tuple(event)
    assert native().event_columns(lists) is None


def test_shapes_other_than_lists_of_5_tuples_are_left_to_the_codec() -> None:
    encode = native().event_columns
    good = ("t", 1, "c", None, 2)
    assert encode([[good]]) is not None
    assert encode([[good[:4]]]) is None
    assert encode([[list(good)]]) is None
    assert encode([(good,)]) is None
    assert columns(encode([]), 0) == [[]] * 5
