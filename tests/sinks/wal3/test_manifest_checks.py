"""Readers, writers and the collector refuse a manifest (or snapshot) that fails scrub."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import structlog

from agent.cli import main
from sinks.objstore import InMemoryObjectStore, LocalStore
from sinks.wal3 import (
    CorruptManifest,
    CursorStore,
    GarbageCollector,
    LogReader,
    LogWriter,
    Setsum,
    SnapshotOptions,
    WriterOptions,
    read_log,
    seal_log,
)

SMALL = WriterOptions(batch_size_records=5, snapshots=SnapshotOptions(4, 3))


def fill(store: Any, n: int) -> None:
    LogWriter.initialize(store)
    with LogWriter.open(store, options=SMALL) as writer:
        for i in range(0, n, 5):
            writer.append_many([b"%d" % j for j in range(i, min(n, i + 5))])


def drop_last_fragment(obj: dict[str, Any]) -> None:
    """The last fragment pointer removed, everything else (the setsum) left alone."""
    obj["fragments"].pop()


def wrong_setsum(obj: dict[str, Any]) -> None:
    obj["setsum"] = Setsum.of([b"not this log"]).hexdigest()


def gap_between_fragments(obj: dict[str, Any]) -> None:
    """A middle fragment removed: the others no longer follow on."""
    del obj["fragments"][1]


def rewrite_manifest(store: Any, change: Callable[[dict[str, Any]], None]) -> None:
    data, etag = store.get("manifest/MANIFEST")
    obj = json.loads(data)
    change(obj)
    store.put_if_match("manifest/MANIFEST", json.dumps(obj).encode(), etag)


@pytest.fixture(autouse=True)
def _reset_logging() -> Iterator[None]:
    """main() configures logging to the captured stdout; undo it for later tests."""
    yield
    structlog.reset_defaults()


@pytest.fixture
def store() -> InMemoryObjectStore:
    store = InMemoryObjectStore("checks")
    fill(store, 60)
    return store


@pytest.mark.parametrize("change", [drop_last_fragment, wrong_setsum, gap_between_fragments])
def test_an_inconsistent_manifest_is_refused_by_every_reader_and_writer(
        store: InMemoryObjectStore, change: Callable[[dict[str, Any]], None]) -> None:
    """read_log, LogReader, LogWriter.open, GC and sealing raise CorruptManifest naming the
    manifest; before, a dropped last fragment was read silently (records missing)."""
    assert len(LogReader(store).manifest().fragments) >= 3
    rewrite_manifest(store, change)
    named = "manifest/MANIFEST on memory://checks: manifest fails scrub"
    with pytest.raises(CorruptManifest, match=named):
        list(read_log(store))
    with pytest.raises(CorruptManifest, match=named):
        list(LogReader(store).records())
    with pytest.raises(CorruptManifest, match=named):
        LogReader(store).read(1)
    with pytest.raises(CorruptManifest, match=named):
        LogWriter.open(store)
    CursorStore(store).init("reader", 30)
    with pytest.raises(CorruptManifest, match=named):
        GarbageCollector(store).collect()
    with pytest.raises(CorruptManifest, match=named):
        seal_log(store)
    # The tools that report problems still open it, and report them.
    report = LogReader(store).scrub(raise_on_problem=False)
    assert not report.ok and any("manifest" in p for p in report.problems)
    assert LogReader(store).manifest(check=False).problems()


def test_a_snapshot_whose_children_do_not_sum_to_it_is_refused(
        store: InMemoryObjectStore) -> None:
    """A snapshot that matches its pointer but whose fragments do not add up to its
    setsum (a child pointer altered) is refused on load, not walked."""
    manifest = LogReader(store).manifest()
    assert manifest.snapshots
    path = manifest.snapshots[0].path_to_snapshot
    leaf = json.loads(store.get(path)[0])
    while leaf["snapshots"]:  # down to a snapshot of fragments
        leaf = json.loads(store.get(leaf["snapshots"][0]["path_to_snapshot"])[0])
    leaf["fragments"][0]["setsum"] = Setsum.of([b"other"]).hexdigest()
    store.put(leaf["path"], json.dumps(leaf).encode())
    with pytest.raises(CorruptManifest, match="snapshot fails scrub"):
        list(LogReader(store).records())
    with pytest.raises(CorruptManifest, match="snapshot fails scrub"):
        list(read_log(store))
    assert not LogReader(store).scrub(raise_on_problem=False).ok


def test_log_inspect_reports_an_inconsistent_manifest(
        tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """inspect shows the problems (exit 1) rather than failing to open (exit 2)."""
    store = LocalStore(tmp_path / "log")
    fill(store, 30)
    rewrite_manifest(store, drop_last_fragment)
    uri = f"file://{tmp_path / 'log'}"
    assert main(["log", "inspect", uri, "--json"]) == 1
    info = json.loads(capsys.readouterr().out)
    assert info["manifest_problems"]
    assert main(["log", "verify", uri]) == 1
    assert "Traceback" not in capsys.readouterr().err


def test_fragment_numbers_must_follow_on() -> None:
    """Fragments 1, 2, 4 (canonical paths, contiguous offsets, setsums balancing) fail
    scrub: a missing sequence number is a lost fragment."""
    from sinks.wal3 import Fragment, Manifest, fragment_path

    frags = [Fragment(fragment_path(n), n, 10 * i + 1, 10 * i + 11, 5, Setsum.of([b"%d" % n]))
             for i, n in enumerate((1, 2, 4))]
    manifest = Manifest(Setsum.of([b"1", b"2", b"4"]), Setsum(), 15, "w", (), tuple(frags))
    with pytest.raises(CorruptManifest, match="seq_no 4 does not follow 2"):
        manifest.scrub()


def test_a_snapshot_that_does_not_match_its_pointer_is_refused(
        store: InMemoryObjectStore) -> None:
    """A manifest whose snapshot pointer disagrees with the snapshot it names (here its
    byte count, which no setsum covers) is refused when the snapshot is loaded."""
    manifest = LogReader(store).manifest()
    assert manifest.snapshots

    def change(obj: dict[str, Any]) -> None:
        obj["snapshots"][0]["num_bytes"] += 1

    rewrite_manifest(store, change)
    with pytest.raises(CorruptManifest, match="does not match its pointer"):
        list(LogReader(store).records())
