"""Reading the Arrow IPC stream inside a message: one record batch of a known schema.

A message's stream is what ``pa.ipc.new_stream`` writes: the schema, the record
batches, the end-of-stream marker. The usual one (the schema exactly as this library
writes it, one batch) is read message by message, without parsing the schema again:
opening a stream and comparing its schema cost about 45 us, as much as the rest of
decoding a small EVENTS message. Anything else goes the general way, which says what is
wrong, so both give the same batch or the same error.
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa

_END_OF_STREAM: Final = b"\xff\xff\xff\xff\x00\x00\x00\x00"


class WrongSchema(ValueError):
    """The stream's schema is not the one expected (``found`` is the one it has)."""

    def __init__(self, found: pa.Schema) -> None:
        super().__init__(f"schema {found}")
        self.found = found


class BatchReader:
    """Reads streams of ``schema``; the batch is validated in full (the bytes are
    untrusted; Arrow's cheap checks on read let a bad offset through to a crash)."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self._empty = pa.RecordBatch.from_pylist([], schema=schema)
        # The schema message as this pyarrow writes it; a stream whose first message has
        # these bytes has this schema.
        first = pa.ipc.read_message(pa.BufferReader(schema.serialize()))
        self._schema_message = first.metadata.to_pybytes()

    def read(self, payload: memoryview | bytes) -> pa.RecordBatch:
        """The stream's records as one batch. Raises ``WrongSchema``, or Arrow's error
        (``pa.ArrowException``, ``OSError``, ``ValueError``) for bytes that do not read."""
        buffer = pa.py_buffer(payload)
        batch = self._read_usual(buffer)
        if batch is None:
            table = pa.ipc.open_stream(buffer).read_all()
            if not table.schema.equals(self.schema):
                raise WrongSchema(table.schema)
            batches = table.combine_chunks().to_batches()
            batch = batches[0] if batches else self._empty
        batch.validate(full=True)  # offsets within their data, UTF-8 in utf8 columns
        return batch

    def _read_usual(self, buffer: pa.Buffer) -> pa.RecordBatch | None:
        """The batch of a stream of this schema's bytes and one batch (None: another
        stream, or one that does not read: the general way says why)."""
        source = pa.BufferReader(buffer)
        try:
            first = pa.ipc.read_message(source)
            if first.type != "schema" or first.metadata.to_pybytes() != self._schema_message:
                return None
            second = pa.ipc.read_message(source)
            if second.type != "record batch":
                return None
            rest = buffer.size - source.tell()
            if rest and (rest != len(_END_OF_STREAM)
                         or buffer.slice(source.tell()).to_pybytes() != _END_OF_STREAM):
                return None
            return pa.ipc.read_record_batch(second, self.schema)
        except (pa.ArrowException, OSError, ValueError, EOFError):
            return None
