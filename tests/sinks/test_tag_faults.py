"""The C check of tagged key and value columns (``sequencer.NATIVE.tag_faults``) equals
its numpy reference (``sinks.codec.tag_faults``) on any bytes, and its UTF-8 verdict is
Python's strict decoder's (what ``decode_value`` will apply to a str)."""

from __future__ import annotations

import ctypes
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


def _check_outcome(batch: pa.RecordBatch) -> str | None:
    import sinks.codec as codec

    try:
        codec._check_tags(batch)
    except CodecError as exc:
        return str(exc)
    return None


_MAYBE_NULL = st.one_of(entries, st.none())


@settings(max_examples=400, deadline=None)
@given(rows=st.lists(st.tuples(_MAYBE_NULL, _MAYBE_NULL, _MAYBE_NULL), max_size=8),
       start=st.integers(0, 2), null_table=st.booleans())
@example(rows=[(b"\x02" + bytes(8), b"", b"\x00")], start=0, null_table=True)
@example(rows=[(b"\x02" + bytes(8), b"", b"\x00")], start=2, null_table=False)  # sliced
def test_the_batch_check_in_one_call_equals_the_column_checks(
        rows: list[tuple[bytes | None, ...]], start: int, null_table: bool) -> None:
    """``batch_faults`` (nulls and the three tagged columns of an exported batch, one C
    call) passes exactly the batches the per-column checks pass, sliced ones too; on a
    fault, the per-column checks name it (so the error is the same either way)."""
    import sinks.codec as codec
    from sinks.codec import EVENT_SCHEMA

    pad = [(b"\x05pad", b"\x05pad", b"\x05pad")] * start
    columns = list(zip(*(pad + rows), strict=True)) if pad + rows else [(), (), ()]
    n = len(pad) + len(rows)
    table = ["t"] * n
    if null_table and n:
        table[-1] = None  # type: ignore[call-overload]
    batch = pa.RecordBatch.from_arrays(
        [pa.array([1] * n, pa.uint64()), pa.array(range(n), pa.uint64()),
         pa.array([0] * n, pa.uint32()), pa.array(table, pa.utf8()),
         pa.array(columns[0], pa.binary()), pa.array(["c"] * n, pa.utf8()),
         pa.array(columns[1], pa.binary()), pa.array(columns[2], pa.binary())],
        schema=EVENT_SCHEMA).slice(start)
    batch.validate(full=True)
    with_c = _check_outcome(batch)
    verdict = native().batch_faults(batch.__arrow_c_array__()[1],
                                    codec._tag_kinds(tuple(EVENT_SCHEMA.names),
                                                     ("old", "new"), True))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(codec, "_BATCH_FAULTS", None)
        assert with_c == _check_outcome(batch)
    assert (verdict is None) == (with_c is None)
    if verdict:  # (column, entry or -2 for nulls, not UTF-8): named by the reference too
        column, entry, _ = verdict
        assert with_c is not None and EVENT_SCHEMA.names[column] in with_c
        assert ("holds nulls" in with_c) == (entry == -2)


class _ArrowArray(ctypes.Structure):
    """The head of the Arrow C data interface's ArrowArray (its ABI is fixed)."""


_ArrowArray._fields_ = [
    ("length", ctypes.c_int64), ("null_count", ctypes.c_int64), ("offset", ctypes.c_int64),
    ("n_buffers", ctypes.c_int64), ("n_children", ctypes.c_int64),
    ("buffers", ctypes.c_void_p), ("children", ctypes.POINTER(ctypes.POINTER(_ArrowArray)))]


def _with_unknown_null_counts(capsule: Any) -> Any:
    """``capsule`` (an exported record batch) with each column's null count set to -1,
    "not computed", as the C data interface allows a producer to say (pyarrow counts
    them before export): the consumer must count the validity bitmap itself."""
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    batch = _ArrowArray.from_address(get(capsule, b"arrow_array"))
    for i in range(batch.n_children):
        batch.children[i].contents.null_count = -1
    return capsule


def test_the_batch_check_counts_nulls_it_is_not_told_of_in_the_rows_it_holds() -> None:
    """Columns whose null count is not given (-1): ``batch_faults`` counts the nulls in
    each validity bitmap, over the slice's own rows only, so a null just outside a
    slice is no fault and one inside it is."""
    import sinks.codec as codec
    from sinks.codec import EVENT_SCHEMA

    n = 4
    batch = pa.RecordBatch.from_arrays(
        [pa.array([1] * n, pa.uint64()), pa.array(range(n), pa.uint64()),
         pa.array([0] * n, pa.uint32()), pa.array([None, "t", "t", None], pa.utf8()),
         pa.array([b"\x02" + bytes(8)] * n, pa.binary()), pa.array(["c"] * n, pa.utf8()),
         pa.array([b"\x00"] * n, pa.binary()), pa.array([b"\x00"] * n, pa.binary())],
        schema=EVENT_SCHEMA)
    kinds = codec._tag_kinds(tuple(EVENT_SCHEMA.names), ("old", "new"), True)

    def verdict(start: int, length: int) -> Any:
        capsule = batch.slice(start, length).__arrow_c_array__()[1]
        return native().batch_faults(_with_unknown_null_counts(capsule), kinds)

    assert verdict(1, 2) is None  # the nulls at rows 0 and 3 lie outside
    assert verdict(0, 2) == (3, -2, False)
    assert verdict(2, 2) == (3, -2, False)


@pytest.mark.parametrize("built", ["batch", "column", "numpy"])
def test_decode_refuses_a_str_that_is_not_utf8_either_way(
        built: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every check behind ``decode``: a str cell holding a surrogate is refused."""
    import sinks.codec as codec

    if built != "batch":
        monkeypatch.setattr(codec, "_BATCH_FAULTS", None)
    if built == "numpy":
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
