"""``sinks._ipc.BatchReader``: its usual-stream path gives what the general path gives.

The usual stream (this library's schema message, one batch) is read message by message;
everything else goes through ``pa.ipc.open_stream``. For any bytes, sound or damaged,
both must give the same batch, or both refuse them.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given

from sinks._ipc import BatchReader, WrongSchema
from sinks.codec import EVENT_SCHEMA, EventBatch
from tests.fuzz._mutate import FUZZ, damaged
from tests.fuzz.test_codec_fuzz import EVENTS

pytestmark = pytest.mark.timeout(120)


def _stream(schema: pa.Schema, *batches: pa.RecordBatch, end: bool = True) -> bytes:
    sink = pa.BufferOutputStream()
    writer = pa.ipc.new_stream(sink, schema)
    for batch in batches:
        writer.write_batch(batch)
    if end:
        writer.close()
    return bytes(sink.getvalue().to_pybytes())


_DATA = EventBatch.from_events(EVENTS).data
_OTHER_METADATA = EVENT_SCHEMA.with_metadata({b"cdc-agent.format": b"9"})
_RENAMED = pa.schema([f.with_name(f"{f.name}_") if f.name == "seq" else f
                      for f in EVENT_SCHEMA])
STREAMS = [
    _stream(EVENT_SCHEMA, _DATA),  # the usual one
    _stream(EVENT_SCHEMA, _DATA.slice(0, 0)),
    _stream(EVENT_SCHEMA),  # no batch
    _stream(EVENT_SCHEMA, _DATA.slice(0, 5), _DATA.slice(5)),  # two batches
    _stream(EVENT_SCHEMA, _DATA, end=False),  # no end-of-stream marker
    _stream(_OTHER_METADATA, _DATA.replace_schema_metadata(_OTHER_METADATA.metadata)),
    _stream(_RENAMED, pa.RecordBatch.from_arrays(_DATA.columns, schema=_RENAMED)),
]


def _general(payload: bytes) -> pa.RecordBatch:
    """The general way alone: ``open_stream``, the schema compared, batches joined."""
    table = pa.ipc.open_stream(pa.py_buffer(payload)).read_all()
    if not table.schema.equals(EVENT_SCHEMA):
        raise WrongSchema(table.schema)
    batches = table.combine_chunks().to_batches()
    batch = batches[0] if batches else pa.RecordBatch.from_pylist([], schema=EVENT_SCHEMA)
    batch.validate(full=True)
    return batch


def _outcome(read: object, payload: bytes) -> tuple[str, object]:
    try:
        batch = read(payload)  # type: ignore[operator]
    except WrongSchema as exc:
        return "wrong schema", str(exc.found)
    except (pa.ArrowException, OSError, ValueError):
        return "refused", None
    return "batch", batch.to_pylist()


def test_sound_streams_read_as_the_general_path_reads_them() -> None:
    reader = BatchReader(EVENT_SCHEMA)
    outcomes = [_outcome(reader.read, s) for s in STREAMS]
    assert outcomes == [_outcome(_general, s) for s in STREAMS]
    # Metadata aside, the sixth has the schema (as Schema.equals says); the seventh not.
    assert [kind for kind, _ in outcomes] == ["batch"] * 6 + ["wrong schema"]
    assert outcomes[0][1] == _DATA.to_pylist() == outcomes[3][1] == outcomes[4][1]


def test_the_usual_stream_is_read_without_opening_a_stream(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The speed of the usual stream is the point: it must not fall back."""
    reader = BatchReader(EVENT_SCHEMA)

    def refuse(*args: object) -> None:
        raise AssertionError("the general path read the usual stream")

    monkeypatch.setattr(pa.ipc, "open_stream", refuse)
    assert reader.read(STREAMS[0]).to_pylist() == _DATA.to_pylist()
    assert reader.read(memoryview(STREAMS[4])).to_pylist() == _DATA.to_pylist()
    with pytest.raises(AssertionError):
        reader.read(STREAMS[3])  # two batches: the general path's job


@FUZZ
@given(damaged(STREAMS))
def test_damaged_streams_read_as_the_general_path_reads_them(payload: bytes) -> None:
    assert _outcome(BatchReader(EVENT_SCHEMA).read, payload) == _outcome(_general, payload)
