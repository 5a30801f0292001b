"""Fuzzing wal3's stored formats: each decoder raises only its documented error.

Manifests and snapshots (the golden fixtures, damaged as bytes and as JSON), cursors,
the garbage file, fragments (Parquet bytes) and object paths. Whatever parses must also
survive what readers do next (scrub, re-encode, read back).
"""

from __future__ import annotations

import contextlib
import functools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sinks.objstore import InMemoryObjectStore
from sinks.wal3 import (
    CorruptCursor,
    CorruptFragment,
    CorruptGarbage,
    CorruptLog,
    CorruptManifest,
    Garbage,
    GarbageCollected,
    LogReader,
    LogWriter,
    Manifest,
    Snapshot,
    SnapshotOptions,
    WriterOptions,
    decode_fragment,
    encode_fragment,
    parse_fragment_path,
)
from sinks.wal3._cursors import Cursor
from sinks.wal3._paths import parse_snapshot_path
from tests.fuzz._mutate import FUZZ, damaged, damaged_json
from tests.sinks.wal3.conftest import fixture_json, fixture_text

pytestmark = pytest.mark.timeout(120)

MANIFESTS = [fixture_text("manifest_nested_snapshots.json"), fixture_text("real_manifest_AA.json")]
SNAPSHOTS = [json.dumps(s) for s in fixture_json("snapshots_nested.json")]
CURSOR = {"position": {"offset": 42}, "epoch_us": 1_700_000_000_000_000, "writer": "r"}
GARBAGE = json.loads(Garbage(fragments_to_drop_start=1, fragments_to_drop_limit=3,
                             first_to_keep=9).to_json())
FRAGMENTS = [encode_fragment(7, 1_700_000_000_000_000, [b"a" * i for i in range(12)])[0],
             encode_fragment(1, 5, [b""])[0]]


def parse_manifest(raw: bytes) -> None:
    try:
        manifest = Manifest.from_json(raw)
    except CorruptManifest:
        return
    with contextlib.suppress(CorruptManifest):
        manifest.scrub()
    assert Manifest.from_json(manifest.to_json()).to_json() == manifest.to_json()


def parse_snapshot(raw: bytes) -> None:
    try:
        snapshot = Snapshot.from_json(raw)
    except CorruptManifest:
        return
    with contextlib.suppress(CorruptManifest):
        snapshot.scrub()
    assert Snapshot.from_json(snapshot.to_json()) == snapshot


@FUZZ
@given(damaged([m.encode() for m in MANIFESTS]) | st.sampled_from(MANIFESTS).flatmap(
    lambda m: damaged_json(json.loads(m))))
def test_damaged_manifests_raise_corrupt_manifest_only(raw: bytes) -> None:
    parse_manifest(raw)


@FUZZ
@given(damaged([s.encode() for s in SNAPSHOTS]) | st.sampled_from(SNAPSHOTS).flatmap(
    lambda s: damaged_json(json.loads(s))))
def test_damaged_snapshots_raise_corrupt_manifest_only(raw: bytes) -> None:
    parse_snapshot(raw)


@FUZZ
@given(damaged([json.dumps(CURSOR).encode()]) | damaged_json(CURSOR) | st.binary(max_size=64))
def test_damaged_cursors_raise_corrupt_cursor_only(raw: bytes) -> None:
    try:
        cursor = Cursor.from_json(raw, "c")
    except CorruptCursor:
        return
    assert 0 <= cursor.position < 1 << 64
    assert Cursor.from_json(cursor.to_json()) == cursor


@FUZZ
@given(damaged([json.dumps(GARBAGE).encode()]) | damaged_json(GARBAGE) | st.binary(max_size=64))
def test_damaged_garbage_files_raise_corrupt_garbage_only(raw: bytes) -> None:
    try:
        garbage = Garbage.from_json(raw)
    except CorruptGarbage:
        return
    assert Garbage.from_json(garbage.to_json()) == garbage


def renamed(data: bytes, name: bytes, new: bytes) -> bytes:
    """A column's name replaced everywhere in the file (footer and schema metadata)."""
    return data.replace(name, new)


column_names = st.builds(renamed, st.sampled_from(FRAGMENTS),
                         st.sampled_from([b"offset", b"timestamp_us", b"body"]),
                         st.binary(min_size=1, max_size=6))


@FUZZ
@given(damaged(FRAGMENTS) | column_names | st.binary(max_size=200))
def test_damaged_fragments_raise_corrupt_fragment_only(data: bytes) -> None:
    """Parquet bytes damaged anywhere: CorruptFragment, or records that are contiguous
    and sum to the setsum the file states."""
    try:
        decoded = decode_fragment(data, path="log/f", start=7)
    except CorruptFragment:
        return
    assert decoded.offsets == list(range(decoded.start, decoded.limit))
    assert decoded.stored_setsum in (None, decoded.setsum)


@FUZZ
@given(st.text(max_size=120) | st.sampled_from([
    "log/Bucket=0000000000000000/FragmentSeqNo=0000000000000001.parquet",
    "snapshot/SNAPSHOT." + "0" * 64]).flatmap(
    lambda p: st.integers(0, len(p)).map(lambda i: p[:i] + "\ud800" + p[i:]) | st.just(p)))
def test_paths_parse_or_are_none(path: str) -> None:
    """Object keys (listed, or named in manifests) parse to a number/setsum or None."""
    seq_no = parse_fragment_path(path)
    assert seq_no is None or 0 <= seq_no < 1 << 64
    parse_snapshot_path(path)


@functools.cache
def small_log() -> dict[str, bytes]:
    """A log of 40 records in 10 fragments and a few snapshots, as stored objects (built
    once: each example damages a copy, so what it draws never depends on timing)."""
    store = InMemoryObjectStore("fuzz")
    LogWriter.initialize(store)
    options = WriterOptions(batch_size_records=4, snapshots=SnapshotOptions(3, 2))
    with LogWriter.open(store, options=options) as writer:
        for i in range(0, 40, 4):
            writer.append_many([b"%d" % j for j in range(i, i + 4)])
    return {key: store.get(key)[0] for key in store.list("")}


@FUZZ
@given(st.sampled_from(["manifest/", "snapshot/", "log/"]), st.data())
def test_a_reader_of_a_damaged_log_raises_only_wal3_errors(kind: str, data: st.DataObject) -> None:
    """A whole log with one object damaged: reading it raises a CorruptLog, never a
    foreign exception; if it raises nothing, every record is there, unaltered."""
    objects = small_log()
    key = data.draw(st.sampled_from(sorted(k for k in objects if k.startswith(kind))))
    store = InMemoryObjectStore("fuzz")
    for name, value in objects.items():
        store.put(name, value)
    store.put(key, data.draw(damaged([objects[key]])))
    try:
        records = list(LogReader(store).records())
    except (CorruptLog, GarbageCollected):
        return
    # Read without an error: then it is the whole log, unaltered (no silent loss).
    assert [(r.offset, r.body) for r in records] == [(i + 1, b"%d" % i) for i in range(40)]
