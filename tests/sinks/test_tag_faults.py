"""The C check of tagged key and value columns (``sequencer.NATIVE.tag_faults``) equals
its numpy reference (``sinks.codec.tag_faults``) on any bytes, and its UTF-8 verdict is
Python's strict decoder's (what ``decode_value`` will apply to a str)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sequencer import NATIVE
from sinks.codec import CodecError, decode, encode_events, tag_faults
from tests.replay.test_native_columns import native

# Entries near the tagged forms: each tag with the right and wrong lengths, bools 0..2,
# str payloads of random bytes (overlong forms, surrogates, cut sequences) and text.
_TAGS = st.integers(0, 6).map(lambda t: bytes([t]))
_UTF8_EDGES = st.sampled_from([
    b"\xc0\x80", b"\xc2\x80", b"\xe0\x80\x80", b"\xe0\xa0\x80", b"\xed\xa0\x80",
    b"\xed\x9f\xbf", b"\xef\xbf\xbf", b"\xf0\x80\x80\x80", b"\xf0\x90\x80\x80",
    b"\xf4\x8f\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xe2\x82", b"\x80",
    b"\xff",
])
entries = st.one_of(
    st.just(b""),
    st.builds(lambda t, p: t + p, _TAGS, st.binary(max_size=10)),
    st.builds(lambda t, n: t + bytes(n), st.sampled_from([b"\x02", b"\x03"]),
              st.integers(7, 9)),
    st.builds(lambda b: b"\x01" + bytes([b]), st.integers(0, 2)),
    st.builds(lambda parts: b"\x04" + b"".join(parts),
              st.lists(st.text(max_size=3).map(str.encode) | _UTF8_EDGES, max_size=4)),
)


def _column(values: list[bytes], start: int) -> tuple[np.ndarray, Any]:
    """A binary column's int32 offsets (from ``start``: a sliced Arrow array) and data."""
    column = pa.array([b"\x05pad"] * start + values, type=pa.binary()).slice(start)
    offsets = np.frombuffer(column.buffers()[1], dtype=np.int32, count=len(column) + 1,
                            offset=column.offset * 4)
    body = column.buffers()[2]
    return offsets, body if body is not None else b""


@settings(max_examples=400, deadline=None)
@given(values=st.lists(entries, max_size=12), kind=st.integers(0, 2),
       start=st.integers(0, 2))
@example(values=[b"\x04\xed\xa0\x80"], kind=1, start=0)  # a surrogate: not UTF-8
@example(values=[b"\x04\xf4\x90\x80\x80"], kind=0, start=0)  # past U+10FFFF
@example(values=[b"", b"\x01\x02"], kind=2, start=1)
def test_c_check_equals_the_reference(values: list[bytes], kind: int, start: int) -> None:
    offsets, body = _column(values, start)
    found = native().tag_faults(offsets, body, kind)
    assert found == tag_faults(offsets, body, kind)
    strict = True
    for value in values:
        if value[:1] == b"\x04":
            try:
                value[1:].decode()
            except UnicodeDecodeError:
                strict = False
    assert (found is not None and found[1]) == (not strict)


def test_c_check_refuses_offsets_outside_the_data() -> None:
    with pytest.raises(ValueError, match="not inside the data"):
        native().tag_faults(np.array([0, 5], dtype=np.int32), b"\x00", 1)
    with pytest.raises(ValueError, match="not inside the data"):
        native().tag_faults(np.array([2, 1], dtype=np.int32), b"\x00\x00\x00", 1)
    with pytest.raises(ValueError, match="int32"):
        native().tag_faults(b"\x00\x00", b"", 1)
    with pytest.raises(ValueError, match="kind"):
        native().tag_faults(np.array([0], dtype=np.int32), b"", 3)


@pytest.mark.parametrize("built", [True, False], ids=["c", "numpy"])
def test_decode_refuses_a_str_that_is_not_utf8_either_way(
        built: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both checks behind ``decode``: a str cell holding a surrogate is refused."""
    import sinks.codec as codec

    if not built:
        monkeypatch.setattr(codec, "_TAG_FAULTS", None)
    assert NATIVE is not None
    from agent import Agent, MemoryStore
    from sinks import RecordingSink

    sink = RecordingSink()
    agent = Agent(MemoryStore(), sink)
    agent.set("t", 1, "c", "é")
    agent.close()
    batch = next(i for i in sink.items if hasattr(i, "data"))
    raw = encode_events(batch)
    assert decode(raw).data.equals(batch.data)
    damaged = raw.replace("é".encode(), b"\xed\xa0")  # same length: a cut surrogate
    assert damaged != raw
    with pytest.raises(CodecError, match="not UTF-8"):
        decode(damaged)
