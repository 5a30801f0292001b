"""Reading, scrubbing, cursors and the three-phase garbage collection."""

from __future__ import annotations

import threading

import pytest

from sinks.objstore import InMemoryObjectStore
from sinks.wal3 import (
    CorruptCursor,
    CorruptFragment,
    CorruptLog,
    CursorContention,
    CursorStore,
    GarbageCollected,
    GarbageCollectionInProgress,
    GarbageCollector,
    Limits,
    LogReader,
    LogWriter,
    Manifest,
    NoSuchCursor,
    SnapshotOptions,
    WriterOptions,
    encode_fragment,
)
from tests.sinks.wal3.conftest import no_sleep

SMALL = WriterOptions(batch_size_records=5, snapshots=SnapshotOptions(4, 3))


def fill(store: InMemoryObjectStore, n: int, prefix: str = "") -> None:
    LogWriter.initialize(store, prefix)
    with LogWriter.open(store, prefix, options=SMALL) as writer:
        for i in range(0, n, 5):
            writer.append_many([b"%d" % j for j in range(i, min(n, i + 5))])


def test_scan_limits_and_reads(mem_store: InMemoryObjectStore) -> None:
    """scan returns fragments in order within limits; read starts mid-fragment."""
    fill(mem_store, 100)
    reader = LogReader(mem_store)
    frags = reader.scan(1)
    assert [f.start for f in frags] == list(range(1, 101, 5))
    assert len(reader.scan(1, Limits(max_fragments=3))) == 3
    assert len(reader.scan(1, Limits(max_records=7))) == 2
    assert [f.start for f in reader.scan(53)][:1] == [51]
    records = reader.read(53, Limits(max_records=4))
    assert [(r.offset, r.body) for r in records] == [(53, b"52"), (54, b"53"), (55, b"54"),
                                                      (56, b"55")]
    assert reader.scan(101) == []
    assert reader.scrub().records == 100


def test_fetch_verifies_the_setsum(mem_store: InMemoryObjectStore) -> None:
    """A fragment replaced by other content fails fetch and scrub."""
    fill(mem_store, 20)
    reader = LogReader(mem_store)
    frag = reader.scan(1)[1]
    forged, _ = encode_fragment(frag.start, 1, [b"forged"] * (frag.limit - frag.start))
    mem_store.put(frag.path, forged)
    with pytest.raises(CorruptFragment, match="manifest says"):
        reader.fetch(frag)
    with pytest.raises(CorruptLog, match="problem"):
        reader.scrub()
    report = reader.scrub(raise_on_problem=False)
    assert len(report.problems) == 1 and frag.path in report.problems[0]


def test_scrub_finds_missing_objects_and_bad_snapshots(mem_store: InMemoryObjectStore) -> None:
    """A deleted fragment, a deleted snapshot, and a last limit that lies are reported."""
    fill(mem_store, 200)
    reader = LogReader(mem_store)
    assert reader.scrub().ok
    leaves = reader.scan(1)
    mem_store.delete(leaves[-1].path)
    mem_store.delete(reader.manifest().snapshots[0].path_to_snapshot)
    report = LogReader(mem_store).scrub(raise_on_problem=False)
    assert len(report.problems) == 2
    assert all("missing" in p for p in report.problems)
    # The log's end is only checkable against the fragment itself.
    fresh = InMemoryObjectStore("end")
    fill(fresh, 10)
    data, _etag = fresh.get("manifest/MANIFEST")
    manifest = Manifest.from_json(data)
    last = manifest.fragments[-1]
    lying = (*manifest.fragments[:-1],
             type(last)(last.path, last.seq_no, last.start, last.limit + 1, last.num_bytes,
                        last.setsum))
    fresh.put("manifest/MANIFEST", Manifest(
        manifest.setsum, manifest.collected, manifest.acc_bytes, manifest.writer,
        manifest.snapshots, lying).to_bytes())
    with pytest.raises(CorruptLog, match="holds"):
        LogReader(fresh).scrub()


def test_cursors_compare_and_swap(mem_store: InMemoryObjectStore) -> None:
    """init/save/load with witnesses; a stale witness loses with CursorContention."""
    cursors = CursorStore(mem_store, writer="reader-1")
    with pytest.raises(NoSuchCursor):
        cursors.require("compaction")
    first = cursors.init("compaction", 10)
    with pytest.raises(CursorContention):
        cursors.init("compaction", 11)
    moved = cursors.save("compaction", 20, first)
    with pytest.raises(CursorContention):
        cursors.save("compaction", 30, first)
    loaded = cursors.require("compaction")
    assert loaded.cursor.position == 20 and loaded.etag == moved.etag
    assert loaded.cursor.writer == "reader-1"
    cursors.upsert("emergency", 5)
    assert cursors.list() == ["compaction", "emergency"]
    assert mem_store.head("cursor/compaction.json") is not None
    with pytest.raises(ValueError, match="cursor name"):
        cursors.init("bad-name", 1)


def test_gc_collects_below_the_lowest_cursor(mem_store: InMemoryObjectStore) -> None:
    """Everything wholly below the lowest cursor goes; the setsum identity holds;
    reading below the retained prefix raises GarbageCollected."""
    fill(mem_store, 300)
    before = LogReader(mem_store).manifest()
    cursors = CursorStore(mem_store)
    cursors.init("slow", 120)
    cursors.init("fast", 250)
    report = GarbageCollector(mem_store).collect()
    assert report.applied and report.deleted > 0 and report.cutoff == 120
    reader = LogReader(mem_store)
    after = reader.manifest()
    assert after.setsum == before.setsum
    assert after.collected == report.garbage.setsum_to_discard  # type: ignore[union-attr]
    assert after.oldest_offset <= 120 and after.oldest_offset == after.initial_offset
    scrub = reader.scrub()
    assert scrub.records == 300 - after.oldest_offset + 1
    with pytest.raises(GarbageCollected, match="garbage collected"):
        reader.read(1)
    assert [r.body for r in reader.records(120)][:1] == [b"119"]
    for path in report.garbage.paths_to_delete():  # type: ignore[union-attr]
        assert mem_store.head(path) is None
    assert GarbageCollector(mem_store).load_garbage()[0].is_empty()
    # A second collection with the same cursors finds nothing more.
    assert not GarbageCollector(mem_store).collect().applied
    with LogWriter.open(mem_store) as writer:
        assert writer.append(b"more").offset == 301


def test_gc_without_cursors_needs_an_explicit_bound(mem_store: InMemoryObjectStore) -> None:
    """No cursor and no keep_at_least: nothing is collected."""
    fill(mem_store, 50)
    assert GarbageCollector(mem_store).collect().garbage is None
    report = GarbageCollector(mem_store).collect(keep_at_least=26)
    assert report.applied and LogReader(mem_store).manifest().oldest_offset == 26


def test_gc_phase3_refuses_to_delete_what_the_manifest_references(
        mem_store: InMemoryObjectStore) -> None:
    """Phase 3 before phase 2 deletes nothing: the manifest still references the garbage."""
    fill(mem_store, 60)
    gc = GarbageCollector(mem_store)
    garbage = gc.phase1_compute(keep_at_least=31)
    assert garbage is not None
    with pytest.raises(GarbageCollectionInProgress):
        gc.phase1_compute(keep_at_least=40)
    keys = set(mem_store.list(""))
    with pytest.raises(GarbageCollectionInProgress, match="nothing was deleted"):
        gc.phase3_delete()
    assert set(mem_store.list("")) == keys
    assert gc.phase2_apply()
    assert gc.phase2_apply()  # already applied: a no-op
    assert gc.phase3_delete() == len(garbage.paths_to_delete())
    LogReader(mem_store).scrub()


def test_stale_garbage_is_abandoned_without_deleting(mem_store: InMemoryObjectStore) -> None:
    """If the writer rolled the garbage's fragments into a new snapshot between phases 1
    and 2, the garbage no longer fits: the collection is abandoned, nothing deleted."""
    fill(mem_store, 40)
    data, etag = mem_store.get("manifest/MANIFEST")
    manifest = Manifest.from_json(data)
    assert len(manifest.fragments) >= 3
    gc = GarbageCollector(mem_store)
    garbage = gc.phase1_compute(keep_at_least=manifest.fragments[1].limit)
    assert garbage is not None and garbage.fragments_to_drop_limit > manifest.fragments[1].seq_no
    snap = manifest.generate_snapshot(SnapshotOptions(2, 1000), "writer")
    assert snap is not None
    mem_store.put_if_absent(snap.path, snap.to_json().encode())
    mem_store.put_if_match("manifest/MANIFEST", manifest.apply_snapshot(snap).to_bytes(), etag)
    keys = set(mem_store.list(""))
    assert not gc.phase2_apply()
    assert set(mem_store.list("")) == keys
    assert gc.load_garbage()[0].is_empty()
    LogReader(mem_store).scrub()
    assert GarbageCollector(mem_store).collect(keep_at_least=21).applied
    LogReader(mem_store).scrub()


def test_gc_runs_while_a_writer_appends(mem_store: InMemoryObjectStore) -> None:
    """Collections interleave with a writer's manifest swaps; the writer rebases; no
    acknowledged record at or above the cursor is lost."""
    LogWriter.initialize(mem_store)
    writer = LogWriter.open(mem_store, options=SMALL, sleep=no_sleep)
    cursors = CursorStore(mem_store)
    witness = cursors.init("reader", 1)
    acked: dict[int, bytes] = {}
    progress = threading.Event()

    def append() -> None:
        for i in range(600):
            body = b"%d" % i
            acked[writer.append(body, timeout=30).offset] = body
            if i % 20 == 19:
                progress.set()

    thread = threading.Thread(target=append)
    thread.start()
    collected = 0
    while thread.is_alive():
        if not progress.wait(30):
            break
        progress.clear()
        position = max(acked, default=1) // 2 + 1
        witness = cursors.save("reader", position, witness)
        collected += GarbageCollector(mem_store).collect().deleted
    thread.join(60)
    writer.close()
    reader = LogReader(mem_store)
    reader.scrub()
    oldest = reader.manifest().oldest_offset
    got = {r.offset: r.body for r in reader.records()}
    assert {o: b for o, b in acked.items() if o >= oldest} == got
    assert collected > 0 and oldest > 1


def test_a_reader_overtaken_by_gc_gets_garbage_collected(mem_store: InMemoryObjectStore) -> None:
    """A fragment deleted by a collection while a reader holds an older manifest is
    reported as GarbageCollected, not as corruption."""
    fill(mem_store, 60)
    reader = LogReader(mem_store)
    manifest = reader.manifest()
    first = reader.scan(1, manifest=manifest)[0]
    GarbageCollector(mem_store).collect(keep_at_least=40)
    with pytest.raises(GarbageCollected, match="while being read"):
        reader.fetch(first)
    records = reader.records(manifest=manifest)
    with pytest.raises(GarbageCollected):
        next(records)


@pytest.mark.parametrize("offset", [99_999_999_999, 302])
def test_gc_refuses_a_cursor_past_the_end_of_the_log(
        mem_store: InMemoryObjectStore, offset: int) -> None:
    """A cursor beyond the log's end justifies nothing: CorruptCursor naming it, and
    nothing deleted (before, GC dropped the whole log and reported success)."""
    fill(mem_store, 300)
    cursors = CursorStore(mem_store)
    cursors.init("fine", 100)
    cursors.init("bogus", offset)
    keys = set(mem_store.list(""))
    manifest = LogReader(mem_store).manifest()
    with pytest.raises(CorruptCursor, match=f"cursor 'bogus' points at offset {offset}, past "
                                            "the end .*next offset 301"):
        GarbageCollector(mem_store).collect()
    assert set(mem_store.list("")) == keys
    assert LogReader(mem_store).manifest() == manifest
    assert GarbageCollector(mem_store).load_garbage()[0].is_empty()
    cursors.delete("bogus")
    with pytest.raises(ValueError, match="keep_at_least points at offset 400"):
        GarbageCollector(mem_store).collect(keep_at_least=400)
    assert set(mem_store.list("")) == keys - {"cursor/bogus.json"}
    assert GarbageCollector(mem_store).collect().applied


def test_gc_refuses_a_negative_cursor(mem_store: InMemoryObjectStore) -> None:
    """A cursor holding a negative offset is corrupt (an offset is a u64)."""
    fill(mem_store, 30)
    mem_store.put("cursor/neg.json",
                  b'{"position":{"offset":-5},"epoch_us":1,"writer":"w"}')
    with pytest.raises(CorruptCursor, match="cursor neg holds offset -5"):
        GarbageCollector(mem_store).collect()
    mem_store.delete("cursor/neg.json")
    with pytest.raises(ValueError, match="negative"):
        GarbageCollector(mem_store).collect(keep_at_least=-1)
    assert LogReader(mem_store).manifest().oldest_offset == 1


def test_gc_up_to_a_cursor_at_the_very_end(mem_store: InMemoryObjectStore) -> None:
    """A cursor exactly at the end (a reader that read everything) collects every
    fragment, and the log goes on from the same offset and sequence number."""
    fill(mem_store, 30)
    CursorStore(mem_store).init("done", 31)
    assert GarbageCollector(mem_store).collect().applied
    reader = LogReader(mem_store)
    assert reader.manifest().oldest_offset == 31 and reader.scrub().records == 0
    with LogWriter.open(mem_store) as writer:
        assert writer.append(b"next").offset == 31
    assert [r.body for r in reader.records()] == [b"next"]


def test_reading_from_an_offset_skips_the_snapshots_below_it(
        mem_store: InMemoryObjectStore) -> None:
    """records(from) walks the tree lazily: a snapshot wholly below the start offset
    (ending exactly at it, too) is never fetched."""
    fill(mem_store, 60)
    manifest = LogReader(mem_store).manifest()
    first = manifest.snapshots[0]
    mem_store.calls.clear()
    bodies = [r.body for r in LogReader(mem_store).records(first.limit)]
    assert bodies == [b"%d" % i for i in range(first.limit - 1, 60)]
    fetched = {c.key for c in mem_store.calls if c.op == "get"}
    assert first.path_to_snapshot not in fetched
