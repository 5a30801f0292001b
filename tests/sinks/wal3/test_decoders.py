"""Every wal3 decoder of stored bytes raises only its documented error, naming the object.

Huge numbers (Python refuses to convert more than 4,300 digits), 1e400 (a float that is
infinite), deep nesting (RecursionError in the parser) and damaged Parquet column names
used to escape as ValueError, OverflowError, RecursionError or UnicodeDecodeError.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from agent.cli import main
from sinks.objstore import LocalStore
from sinks.wal3 import (
    CorruptCursor,
    CorruptFragment,
    CorruptGarbage,
    CorruptManifest,
    CursorStore,
    Garbage,
    GarbageCollector,
    LogReader,
    LogWriter,
    Manifest,
    Snapshot,
    decode_fragment,
    encode_fragment,
)
from sinks.wal3._cursors import Cursor

HUGE = b"9" * 5000
DEEP = b"[" * 50_000 + b"]" * 50_000
ZEROS = '"' + "0" * 64 + '"'


def garbage_json(start: str = "1", first: str = "1") -> bytes:
    return ('{"snapshots_to_drop":[],"snapshots_to_make":[],"snapshot_for_root":null,'
            f'"fragments_to_drop_start":{start},"fragments_to_drop_limit":2,'
            f'"setsum_to_discard":{ZEROS},"first_to_keep":{{"offset":{first}}}}}').encode()


def manifest_json(acc_bytes: str) -> bytes:
    return (f'{{"setsum":{ZEROS},"collected":{ZEROS},"acc_bytes":{acc_bytes},"writer":"w",'
            '"snapshots":[],"fragments":[]}').encode()


def cursor_json(offset: str) -> bytes:
    return f'{{"position":{{"offset":{offset}}},"epoch_us":1,"writer":"w"}}'.encode()


DECODERS: list[tuple[str, Callable[[bytes], Any], type[Exception], str]] = [
    ("manifest", Manifest.from_json, CorruptManifest, "manifest"),
    ("snapshot", Snapshot.from_json, CorruptManifest, "snapshot"),
    ("garbage", Garbage.from_json, CorruptGarbage, "garbage file"),
    ("cursor", lambda raw: Cursor.from_json(raw, "c1"), CorruptCursor, "cursor c1"),
]
BAD_INPUTS = {
    "5000 digits": b'{"x":' + HUGE + b"}",
    "deep nesting": DEEP,
    "deep nesting in a field": b'{"setsum":' + DEEP + b"}",
    "not UTF-8": b'{"\xff":1}',
    "1e400": b'{"setsum":1e400}',
}


@pytest.mark.parametrize("decoder", DECODERS, ids=[d[0] for d in DECODERS])
@pytest.mark.parametrize("raw", list(BAD_INPUTS.values()), ids=list(BAD_INPUTS))
def test_json_decoders_raise_only_their_error(
        decoder: tuple[str, Callable[[bytes], Any], type[Exception], str], raw: bytes) -> None:
    """Bad JSON of every kind: the decoder's own error, naming the object."""
    _, decode, error, named = decoder
    with pytest.raises(error, match=named):
        decode(raw)


@pytest.mark.parametrize(("raw", "decode", "error"), [
    (garbage_json(start="1e400"), Garbage.from_json, CorruptGarbage),
    (garbage_json(start="-1"), Garbage.from_json, CorruptGarbage),
    (garbage_json(start='"7"'), Garbage.from_json, CorruptGarbage),
    (garbage_json(first="1.5"), Garbage.from_json, CorruptGarbage),
    (garbage_json(first=HUGE.decode()), Garbage.from_json, CorruptGarbage),
    (manifest_json("1e400"), Manifest.from_json, CorruptManifest),
    (manifest_json(HUGE.decode()), Manifest.from_json, CorruptManifest),
    (cursor_json("1e400"), Cursor.from_json, CorruptCursor),
    (cursor_json(HUGE.decode()), Cursor.from_json, CorruptCursor),
])
def test_numbers_out_of_range_are_the_documented_error(
        raw: bytes, decode: Callable[[bytes], Any], error: type[Exception]) -> None:
    """A garbage file with 1e400 (OverflowError before), -1, a string or 1.5 where an
    offset belongs, and huge numbers anywhere, are refused as corrupt."""
    with pytest.raises(error):
        decode(raw)


def test_a_fragment_with_a_damaged_column_name_is_corrupt() -> None:
    """A column name that is not UTF-8 is CorruptFragment naming the file (before: a bare
    UnicodeDecodeError from pyarrow)."""
    data, _ = encode_fragment(1, 5, [b"a", b"b"])
    for name in (b"timestamp_us", b"body", b"offset"):
        damaged = data.replace(name, b"\xff\xfe" + name[2:])
        with pytest.raises(CorruptFragment, match="log/f1"):
            decode_fragment(damaged, path="log/f1")


@pytest.mark.parametrize("column", ["offset", "timestamp_us", "body"])
def test_a_fragment_column_of_the_wrong_type_is_corrupt(column: str) -> None:
    """Columns of the wrong type (or holding nulls) are refused, not met as a TypeError."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns: dict[str, Any] = {"offset": pa.array([1, 2], pa.uint64()),
                               "timestamp_us": pa.array([5, 5], pa.uint64()),
                               "body": pa.array([b"a", b"b"])}
    columns[column] = pa.array(["x", None])
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table(columns), sink)
    with pytest.raises(CorruptFragment, match=f"f1: column '{column}'"):
        decode_fragment(sink.getvalue().to_pybytes(), path="f1")


# -- the command line: one clear line, a non-zero exit, no traceback ------------------------


@pytest.fixture(autouse=True)
def _reset_logging() -> Iterator[None]:
    yield
    structlog.reset_defaults()


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    store = LocalStore(tmp_path / "log")
    LogWriter.initialize(store)
    with LogWriter.open(store) as writer:
        for i in range(3):
            writer.append(b"%d" % i)
    CursorStore(store).init("fine", 2)  # so that gc reads the manifest
    return tmp_path / "log"


@pytest.mark.parametrize(("path", "raw", "commands"), [
    ("gc/GARBAGE", garbage_json(start="1e400"), ["inspect", "gc"]),
    ("gc/GARBAGE", DEEP, ["inspect", "gc"]),
    ("manifest/MANIFEST", b'{"setsum":' + HUGE + b"}", ["inspect", "gc", "scrub", "verify"]),
    ("manifest/MANIFEST", DEEP, ["inspect", "gc", "scrub", "verify"]),
    ("cursor/c.json", cursor_json(HUGE.decode()), ["inspect", "gc"]),
])
def test_log_commands_report_damaged_files_in_one_line(
        log_dir: Path, path: str, raw: bytes, commands: list[str],
        capsys: pytest.CaptureFixture[str]) -> None:
    """inspect/gc/scrub on a damaged garbage file, manifest or cursor: exit non-zero, one
    line on stderr naming the object, no traceback."""
    (log_dir / path).parent.mkdir(parents=True, exist_ok=True)
    (log_dir / path).write_bytes(raw)
    name = path.split("/")[-1].removesuffix(".json")
    for command in commands:
        status = main(["log", command, f"file://{log_dir}"])
        err = capsys.readouterr().err
        assert status != 0, command
        assert "Traceback" not in err
        problems = [line for line in err.splitlines()
                    if not line.startswith("scrubbing")]
        assert len(problems) == 1 and name.lower() in problems[0].lower(), (command, err)


def test_readers_name_the_damaged_cursor(log_dir: Path) -> None:
    """A damaged cursor file surfaces as CorruptCursor from the cursor store."""
    (log_dir / "cursor" / "c.json").write_bytes(DEEP)
    with pytest.raises(CorruptCursor, match="cursor c "):
        CursorStore(str(f"file://{log_dir}")).load("c")
    with pytest.raises(CorruptCursor):
        GarbageCollector(f"file://{log_dir}").collect(keep_at_least=2)
    assert LogReader(f"file://{log_dir}").scrub().records == 3
    (log_dir / "cursor" / "c.json").unlink()
    assert GarbageCollector(f"file://{log_dir}").collect().applied
