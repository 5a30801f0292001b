"""On-storage formats: Chroma's golden manifests, paths, fragments, cursors, garbage."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import sinks.wal3
from sinks.wal3 import (
    CorruptFragment,
    CorruptManifest,
    Cursor,
    Fragment,
    Garbage,
    Manifest,
    Setsum,
    Snapshot,
    SnapshotOptions,
    decode_fragment,
    encode_fragment,
    fragment_path,
    parse_fragment_path,
)
from tests.sinks.wal3.conftest import fixture_json, fixture_text

GOLDEN = ["real_manifest_AA.json", "manifest_nested_snapshots.json"]


def test_public_surface() -> None:
    """``from sinks.wal3 import Manifest, Setsum`` works and __all__ is sorted."""
    from sinks.wal3 import Manifest as M
    from sinks.wal3 import Setsum as S

    assert M is Manifest and S is Setsum
    assert list(sinks.wal3.__all__) == sorted(sinks.wal3.__all__)
    for name in sinks.wal3.__all__:
        assert hasattr(sinks.wal3, name), name


@pytest.mark.parametrize("name", GOLDEN)
def test_golden_manifests_parse_scrub_and_round_trip(name: str) -> None:
    """Chroma's manifests parse, pass scrub, and re-serialise to the same compact JSON."""
    text = fixture_text(name)
    manifest = Manifest.from_json(text)
    ok = manifest.scrub()
    assert ok.calculated_setsum + manifest.collected == manifest.setsum
    compact = json.dumps(json.loads(text), separators=(",", ":"))
    assert manifest.to_json() == compact
    assert Manifest.from_json(manifest.to_bytes()) == manifest


def test_real_manifest_shape() -> None:
    """The production-like manifest: 693 snapshots, 1,059 fragments, next positions."""
    manifest = Manifest.from_json(fixture_text("real_manifest_AA.json").encode())
    assert len(manifest.snapshots) == 693
    assert len(manifest.fragments) == 1059
    assert manifest.next_offset == manifest.fragments[-1].limit == 3521399
    assert manifest.next_seq_no == manifest.fragments[-1].seq_no + 1
    assert manifest.oldest_offset == 1


def test_real_manifest_prefix_setsum() -> None:
    """Summing the pointers below offset 900883 gives the value the fixture README quotes."""
    manifest = Manifest.from_json(fixture_text("real_manifest_AA.json"))
    total = Setsum()
    for snap in manifest.snapshots:
        if snap.limit <= 900883:
            total = total + snap.setsum
    assert total.hexdigest() == (
        "c921d21a0820be5d3b6f2d90942648f2853188bb0e3c6a22fe3dbd81c1e1c380")


def test_nested_snapshots_fixture() -> None:
    """Each snapshot sums to its children, names its setsum, and re-serialises exactly."""
    objects = fixture_json("snapshots_nested.json")
    assert len(objects) == 13
    for obj in objects:
        snap = Snapshot.from_obj(obj)
        snap.scrub()
        assert json.loads(snap.to_json()) == obj
        assert snap.to_json() == json.dumps(obj, separators=(",", ":"))


def _mutations(obj: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every single-field corruption of a manifest: each setsum, offset and path."""
    out = []
    flip = "0123456789abcdef"

    def bump_hex(text: str) -> str:
        return text[:-1] + flip[(flip.index(text[-1]) + 1) % 16]

    top = copy.deepcopy(obj)
    top["setsum"] = bump_hex(top["setsum"])
    out.append(("setsum", top))
    top = copy.deepcopy(obj)
    top["collected"] = bump_hex(top["collected"])
    out.append(("collected", top))
    for kind, path_key in (("snapshots", "path_to_snapshot"), ("fragments", "path")):
        for i in range(len(obj[kind])):
            for field in ("setsum", "start", "limit", path_key):
                bad = copy.deepcopy(obj)
                item = bad[kind][i]
                if field == "setsum":
                    item["setsum"] = bump_hex(item["setsum"])
                elif field in ("start", "limit"):
                    item[field]["offset"] += 1
                else:
                    item[field] = item[field].replace("0", "1", 1) if kind == "fragments" \
                        else bump_hex(item[field])
                out.append((f"{kind}[{i}].{field}", bad))
    for i in range(len(obj["fragments"])):
        bad = copy.deepcopy(obj)
        bad["fragments"][i]["seq_no"] += 1
        out.append((f"fragments[{i}].seq_no", bad))
    return out


def test_every_altered_field_of_the_nested_manifest_fails_scrub() -> None:
    """Altering any setsum, offset, path or seq_no makes scrub raise CorruptManifest.

    The one exception is the last fragment's limit (the log's end), which only the
    fragment itself can confirm: the full log scrub checks it (see test_reader).
    """
    obj = fixture_json("manifest_nested_snapshots.json")
    last_limit = f"fragments[{len(obj['fragments']) - 1}].limit"
    mutations = [(w, b) for w, b in _mutations(obj) if w != last_limit]
    assert len(mutations) == 2 + 5 * 4 + 2 - 1
    for what, bad in mutations:
        manifest = Manifest.from_json(json.dumps(bad))
        with pytest.raises(CorruptManifest):
            manifest.scrub()
            pytest.fail(f"scrub passed with {what} altered")


def test_altered_fields_of_the_real_manifest_fail_scrub() -> None:
    """A sample of corruptions across the big manifest (first, middle, last pointers)."""
    obj = fixture_json("real_manifest_AA.json")
    for kind in ("snapshots", "fragments"):
        for i in (0, len(obj[kind]) // 2, len(obj[kind]) - 1):
            for field in ("setsum", "start", "limit"):
                if kind == "fragments" and field == "limit" and i == len(obj[kind]) - 1:
                    continue  # the log's end: only the fragment can confirm it
                bad = copy.deepcopy(obj)
                item = bad[kind][i]
                if field == "setsum":
                    item["setsum"] = ("0" if item["setsum"][0] != "0" else "1") + item["setsum"][1:]
                else:
                    item[field]["offset"] -= 1
                with pytest.raises(CorruptManifest):
                    Manifest.from_json(json.dumps(bad)).scrub()


def test_altered_snapshot_fails_its_scrub() -> None:
    """A snapshot whose child setsum or own path changes no longer scrubs."""
    obj = fixture_json("snapshots_nested.json")[2]
    bad = copy.deepcopy(obj)
    bad["snapshots"][0]["setsum"] = "0" * 64
    with pytest.raises(CorruptManifest, match="sum of its children"):
        Snapshot.from_obj(bad).scrub()
    bad = copy.deepcopy(obj)
    bad["path"] = "snapshot/SNAPSHOT." + "0" * 64
    with pytest.raises(CorruptManifest, match="does not name"):
        Snapshot.from_obj(bad).scrub()


@pytest.mark.parametrize("text, error", [
    ("not json", "not valid JSON"),
    ("[]", "JSON object"),
    ('{"setsum": "zz"}', "setsum"),
    ('{"setsum":"' + "0" * 64 + '","acc_bytes":-1,"writer":"w","snapshots":[],"fragments":[]}',
     "acc_bytes"),
    ('{"setsum":"' + "0" * 64 + '","acc_bytes":0,"writer":"w","snapshots":{},"fragments":[]}',
     "snapshots"),
])
def test_unparseable_manifests_are_corrupt(text: str, error: str) -> None:
    """Bad JSON or bad field types raise CorruptManifest naming what is wrong."""
    with pytest.raises(CorruptManifest, match=error):
        Manifest.from_json(text)


def test_pruned_is_read_as_collected_and_unknown_fields_survive() -> None:
    """The README's ``pruned`` name is accepted; unknown fields round-trip in place."""
    obj = fixture_json("manifest_nested_snapshots.json")
    obj["pruned"] = obj.pop("collected")
    obj["future_field"] = {"x": [1, 2]}
    manifest = Manifest.from_json(json.dumps(obj))
    manifest.scrub()
    assert json.loads(manifest.to_json())["future_field"] == {"x": [1, 2]}
    assert "collected" in json.loads(manifest.to_json())


def test_initial_positions_and_seal_serialise_after_the_fragments() -> None:
    """initial_offset/initial_seq_no appear only when set, after fragments; then sealed."""
    empty = Manifest.new_empty("w")
    assert list(json.loads(empty.to_json())) == [
        "setsum", "collected", "acc_bytes", "writer", "snapshots", "fragments"]
    assert empty.next_offset == 1 and empty.next_seq_no == 1
    cont = Manifest.new_empty("w", initial_offset=100, initial_seq_no=10).seal("s")
    keys = list(json.loads(cont.to_json()))
    assert keys[-3:] == ["initial_offset", "initial_seq_no", "sealed"]
    assert json.loads(cont.to_json())["initial_offset"] == {"offset": 100}
    again = Manifest.from_json(cont.to_json())
    assert again.sealed and again.next_offset == 100 and again.next_seq_no == 10


def test_fragment_paths() -> None:
    """16 hex digits, buckets of 4096, and the parser rejects anything else."""
    assert fragment_path(1) == "log/Bucket=0000000000000000/FragmentSeqNo=0000000000000001.parquet"
    assert fragment_path(0x15AC1E) == (
        "log/Bucket=000000000015a000/FragmentSeqNo=000000000015ac1e.parquet")
    assert fragment_path(4096).startswith("log/Bucket=0000000000001000/")
    for seq in (1, 4095, 4096, 1 << 40):
        assert parse_fragment_path(fragment_path(seq)) == seq
    wrong_bucket = "log/Bucket=0000000000000000/FragmentSeqNo=0000000000001000.parquet"
    assert parse_fragment_path(wrong_bucket) is None
    assert parse_fragment_path("log/Bucket=0/FragmentSeqNo=1.parquet") is None


def test_manifest_apply_matches_chroma_vectors() -> None:
    """Applying two fragments sums setsums and bytes as Chroma's own test expects."""
    a = "4eec78e0b5cd15df7b36fd42cdc3aecb1986ffa3655c338201db88f80d855465"
    b = "dd901afef0e5d336aaa52a2df7f785c909091fd0aa011980de443a61a889d3e1"
    frags = [
        Fragment(fragment_path(1), 1, 1, 22, 41, Setsum.from_hexdigest(a)),
        Fragment(fragment_path(2), 2, 22, 42, 42, Setsum.from_hexdigest(b)),
    ]
    manifest = Manifest.new_empty("w").apply_fragments(frags, "w")
    assert manifest.setsum.hexdigest() == (
        "307d93deb6b3e91525dc277027bc34958d8f1e74965e4c027820c3596e0f2847")
    assert manifest.acc_bytes == 83
    manifest.scrub()
    with pytest.raises(CorruptManifest, match="does not follow"):
        manifest.apply_fragments([frags[0]], "w")


def test_fragment_parquet_layout_and_setsum() -> None:
    """Snappy Parquet with offset/timestamp_us/body; setsum over be64||be64||body."""
    bodies = [b"alpha", b"", b"\x00" * 1000]
    data, setsum = encode_fragment(7, 123456, bodies)
    parquet = pq.ParquetFile(pa.BufferReader(data))
    schema = parquet.schema_arrow
    assert [f.name for f in schema] == ["offset", "timestamp_us", "body"]
    assert [f.type for f in schema] == [pa.uint64(), pa.uint64(), pa.binary()]
    assert parquet.metadata.row_group(0).column(2).compression == "SNAPPY"
    expected = Setsum()
    for i, body in enumerate(bodies):
        expected.insert((7 + i).to_bytes(8, "big") + (123456).to_bytes(8, "big") + body)
    assert setsum == expected
    decoded = decode_fragment(data)
    assert (decoded.start, decoded.limit, decoded.bodies) == (7, 10, bodies)
    assert decoded.setsum == setsum == decoded.stored_setsum


def test_fragment_without_our_metadata_still_decodes() -> None:
    """A Chroma-written fragment (no wal3.setsum metadata) decodes; setsum recomputed."""
    table = pa.table({"offset": pa.array([5, 6], pa.uint64()),
                      "timestamp_us": pa.array([9, 9], pa.uint64()),
                      "body": pa.array([b"a", b"b"], pa.binary())})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="snappy")
    decoded = decode_fragment(sink.getvalue().to_pybytes())
    assert decoded.stored_setsum is None
    assert decoded.setsum == Setsum.of([
        (5).to_bytes(8, "big") + (9).to_bytes(8, "big") + b"a",
        (6).to_bytes(8, "big") + (9).to_bytes(8, "big") + b"b"])


def test_chroma_relative_offsets_count_from_the_pointer_start() -> None:
    """A fragment with a relative_offset column holds records start, start + 1, ..."""
    table = pa.table({"relative_offset": pa.array([0, 1, 2], pa.uint64()),
                      "timestamp_us": pa.array([9, 9, 9], pa.uint64()),
                      "body": pa.array([b"a", b"b", b"c"], pa.binary())})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    decoded = decode_fragment(sink.getvalue().to_pybytes(), start=40)
    assert decoded.offsets == [40, 41, 42] and (decoded.start, decoded.limit) == (40, 43)


def test_corrupt_fragments_are_rejected() -> None:
    """Garbage bytes, gaps in offsets, and a stored setsum that disagrees all raise."""
    with pytest.raises(CorruptFragment):
        decode_fragment(b"PAR1 nope")
    table = pa.table({"offset": pa.array([5, 7], pa.uint64()),
                      "timestamp_us": pa.array([9, 9], pa.uint64()),
                      "body": pa.array([b"a", b"b"], pa.binary())})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    with pytest.raises(CorruptFragment, match="contiguous"):
        decode_fragment(sink.getvalue().to_pybytes())
    data, _ = encode_fragment(1, 1, [b"x"])
    table = pq.read_table(pa.BufferReader(data))
    forged = table.replace_schema_metadata({b"wal3.setsum": ("ab" * 32).encode()})
    sink = pa.BufferOutputStream()
    pq.write_table(forged, sink)
    with pytest.raises(CorruptFragment, match="the file says"):
        decode_fragment(sink.getvalue().to_pybytes())


def test_cursor_and_garbage_json() -> None:
    """Cursor and garbage files use Chroma's fields and round-trip."""
    cursor = Cursor(42, 12345, "reader")
    assert json.loads(cursor.to_json()) == {
        "position": {"offset": 42}, "epoch_us": 12345, "writer": "reader"}
    assert Cursor.from_json(cursor.to_json()) == cursor
    empty = Garbage()
    assert list(json.loads(empty.to_json())) == [
        "snapshots_to_drop", "snapshots_to_make", "snapshot_for_root",
        "fragments_to_drop_start", "fragments_to_drop_limit", "setsum_to_discard",
        "first_to_keep"]
    assert Garbage.from_json(empty.to_json()).is_empty()
    assert Garbage.from_json(b"").is_empty()
    manifest = Manifest.from_json(fixture_text("manifest_nested_snapshots.json"))
    snap = Snapshot.build(1, "gc", fragments=manifest.fragments)
    full = Garbage(manifest.snapshots[:1], (snap,), snap.to_pointer(), 3, 9,
                   manifest.snapshots[0].setsum, 5034)
    assert Garbage.from_json(full.to_json()) == full


def test_generate_and_apply_snapshot_keep_the_setsum() -> None:
    """Rolling fragments into a snapshot keeps setsum and offsets, leaves one fragment."""
    frags = []
    for seq in range(1, 8):
        setsum = Setsum.of([bytes([seq])])
        frags.append(Fragment(fragment_path(seq), seq, seq * 10, seq * 10 + 10, 5, setsum))
    manifest = Manifest.new_empty("w", initial_offset=10).apply_fragments(frags, "w")
    options = SnapshotOptions(fragment_rollover_threshold=3, snapshot_rollover_threshold=2)
    snap = manifest.generate_snapshot(options, "w")
    assert snap is not None and len(snap.fragments) == 3 and snap.depth == 1
    rolled = manifest.apply_snapshot(snap)
    assert rolled.setsum == manifest.setsum and rolled.next_offset == manifest.next_offset
    assert rolled.next_seq_no == manifest.next_seq_no
    snap2 = rolled.generate_snapshot(options, "w")
    assert snap2 is not None
    rolled = rolled.apply_snapshot(snap2)
    deeper = rolled.generate_snapshot(options, "w")
    assert deeper is not None and deeper.depth == 2
    rolled = rolled.apply_snapshot(deeper)
    assert [s.depth for s in rolled.snapshots] == [2] and len(rolled.fragments) == 1
    rolled.scrub()


def test_setsum_vectors_for_wal3_manifests() -> None:
    """The shared vectors' manifest sums: a manifest of fragments a, b sums to a + b."""
    path = Path(__file__).resolve().parents[2] / "fixtures" / "setsum" / "vectors.json"
    vectors = json.loads(path.read_text())
    for case in vectors["wal3_manifest_sums"]:
        a, b = Setsum.from_hexdigest(case["a"]), Setsum.from_hexdigest(case["b"])
        assert (a + b).hexdigest() == case["a_plus_b"]
        frags = [Fragment(fragment_path(1), 1, 1, 5, 10, a),
                 Fragment(fragment_path(2), 2, 5, 9, 10, b)]
        manifest = Manifest.new_empty("v").apply_fragments(frags, "v")
        assert manifest.setsum.hexdigest() == case["a_plus_b"]
        manifest.scrub()


def test_fragments_are_plain_snappy_with_statistics_only_for_offsets() -> None:
    """A fragment is Snappy Parquet without dictionary pages, with min/max for offset and
    timestamp_us but none for the bodies (cheaper to write), and decodes as written."""
    bodies = [b"x" * 3000, b"y" * 3000, b"x" * 3000]
    data, setsum = encode_fragment(41, 7, bodies)
    meta = pq.ParquetFile(pa.BufferReader(data)).metadata
    assert meta.num_row_groups == 1
    columns = {meta.row_group(0).column(i).path_in_schema: meta.row_group(0).column(i)
               for i in range(meta.num_columns)}
    for column in columns.values():
        assert column.compression == "SNAPPY"
        assert not any("DICTIONARY" in e for e in column.encodings), column.encodings
    assert (columns["offset"].statistics.min, columns["offset"].statistics.max) == (41, 43)
    assert columns["timestamp_us"].statistics.has_min_max
    assert columns["body"].statistics is None or not columns["body"].statistics.has_min_max
    decoded = decode_fragment(data)
    assert (decoded.start, decoded.bodies, decoded.setsum) == (41, bodies, setsum)
