"""LocalStore: compare-and-swap across processes, atomic visibility, crash safety."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sinks.objstore import (
    Crash,
    LocalStore,
    NotFound,
    ObjectStoreError,
    PreconditionFailed,
    open_store,
)
from sinks.objstore._local import local_etag

PROCESSES = 4


def _cas_worker(root: str, increments: int, start: Any,
                results: multiprocessing.Queue[tuple[int, int]]) -> None:
    """In a child process: CAS-increment the counter ``increments`` times."""
    store = LocalStore(root)
    start.wait()
    done = conflicts = 0
    while done < increments:
        data, etag = store.get("counter")
        try:
            store.put_if_match("counter", str(int(data) + 1).encode(), etag)
            done += 1
        except PreconditionFailed:
            conflicts += 1
    results.put((done, conflicts))


def _create_worker(root: str, ident: int, keys: int, start: Any,
                   results: multiprocessing.Queue[tuple[int, list[int]]]) -> None:
    """In a child process: race put_if_absent on keys 0..keys-1; report those won."""
    store = LocalStore(root)
    start.wait()
    won = []
    for k in range(keys):
        try:
            store.put_if_absent(f"seq/{k:08d}", str(ident).encode())
            won.append(k)
        except PreconditionFailed:
            pass
    results.put((ident, won))


def _run_processes(target: Callable[..., None], args_for: list[tuple[object, ...]]
                   ) -> list[Any]:
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    start = ctx.Barrier(len(args_for))  # all children start contending together
    procs = [ctx.Process(target=target, args=(*args, start, results)) for args in args_for]
    for proc in procs:
        proc.start()
    out = [results.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    return out


@pytest.mark.slow
def test_cas_counter_across_processes_loses_no_update(tmp_path: Path) -> None:
    """4 processes CAS-increment one counter: the final value counts every success."""
    store = LocalStore(tmp_path)
    store.put("counter", b"0")
    increments = 25
    results = _run_processes(_cas_worker, [(str(tmp_path), increments)] * PROCESSES)
    assert sum(done for done, _ in results) == PROCESSES * increments
    assert int(store.get("counter")[0]) == PROCESSES * increments
    print("conflicts per process:", [c for _, c in results])


@pytest.mark.slow
def test_put_if_absent_across_processes_has_one_winner_per_key(tmp_path: Path) -> None:
    """4 processes racing to create the same keys: each key has exactly one creator."""
    keys = 40
    results = _run_processes(_create_worker, [(str(tmp_path), i, keys) for i in range(PROCESSES)])
    winners: dict[int, list[int]] = {}
    for ident, won in results:
        for k in won:
            winners.setdefault(k, []).append(ident)
    assert sorted(winners) == list(range(keys))
    store = LocalStore(tmp_path)
    for k, idents in winners.items():
        assert len(idents) == 1, f"key {k} created by {idents}"
        assert store.get(f"seq/{k:08d}")[0] == str(idents[0]).encode()


def test_reader_never_sees_a_partial_object(tmp_path: Path) -> None:
    """While a writer rewrites a large object, readers see only whole versions, and
    listings never show a temporary file."""
    store = LocalStore(tmp_path, fsync=False)
    size = 1 << 21
    versions = 40
    store.put("big", bytes([0]) * size)
    done = threading.Event()
    problems: list[str] = []
    reads = [0]

    def writer() -> None:
        try:
            for v in range(1, versions + 1):
                store.put("big", bytes([v]) * size)
        finally:
            done.set()

    def reader() -> None:
        while not done.is_set():
            data, etag = store.get("big")
            reads[0] += 1
            if len(data) != size or data.count(data[:1]) != size:
                problems.append(f"partial read: {len(data)} bytes")
            if etag != local_etag(data):
                problems.append("etag does not match the bytes read")
            if (listed := store.list("")) != ["big"]:
                problems.append(f"listing showed {listed}")

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert problems == []
    assert reads[0] > 0
    assert store.get("big")[0] == bytes([versions]) * size


STEPS = ["temp-written", "locked", "renamed", "synced"]


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("op", ["put", "put_if_match"])
def test_crash_at_any_step_leaves_old_or_new(tmp_path: Path, step: str, op: str) -> None:
    """A crash at each step of a write leaves the whole old object (before the rename)
    or the whole new one (after it), and never a listed temporary file."""
    old_etag = LocalStore(tmp_path).put("m/MANIFEST", b"old" * 1000)

    def crash_at(op_: str, key: str, step_: str) -> None:
        if step_ == step:
            raise Crash(f"crash at {step_}")

    crashing = LocalStore(tmp_path, on_step=crash_at)
    with pytest.raises(Crash):
        if op == "put":
            crashing.put("m/MANIFEST", b"new" * 1000)
        else:
            crashing.put_if_match("m/MANIFEST", b"new" * 1000, old_etag)

    after = LocalStore(tmp_path)  # a fresh process's view
    expected = b"new" * 1000 if STEPS.index(step) >= STEPS.index("renamed") else b"old" * 1000
    assert after.get("m/MANIFEST")[0] == expected
    assert after.list("") == ["m/MANIFEST"]
    temps = [p.name for p in (tmp_path / "m").iterdir() if p.name.endswith(".tmp")]
    assert len(temps) == (0 if expected.startswith(b"new") else 1)
    # The lock was released by the crash: the next write goes through.
    after.put_if_match("m/MANIFEST", b"next", after.get("m/MANIFEST")[1])


def test_stale_temp_files_are_swept(tmp_path: Path) -> None:
    """remove_stale_temp_files deletes crash leftovers older than the age, nothing else."""
    store = LocalStore(tmp_path)
    store.put("a/b", b"keep")

    def crash(op: str, key: str, step: str) -> None:
        raise Crash(step)

    with pytest.raises(Crash):
        LocalStore(tmp_path, on_step=crash).put("a/c", b"lost")
    (temp,) = [p for p in (tmp_path / "a").iterdir() if p.name.endswith(".tmp")]
    mtime = temp.stat().st_mtime
    assert store.remove_stale_temp_files(60.0, now=mtime + 59.0) == []
    assert store.remove_stale_temp_files(60.0, now=mtime + 61.0) == [temp]
    assert not temp.exists()
    assert store.list("") == ["a/b"]


_KILL_WRITER = """
import sys
from sinks.objstore import LocalStore
store = LocalStore(sys.argv[1])
v = 0
while True:
    v = (v + 1) % 256
    store.put("obj", bytes([v]) * (1 << 20))
    print(v, flush=True)
"""


@pytest.mark.slow
def test_sigkill_mid_write_leaves_a_whole_object(tmp_path: Path) -> None:
    """SIGKILL a process that keeps rewriting an object: what remains is a whole version."""
    repo = Path(__file__).resolve().parents[3]
    for trial in range(3):
        root = tmp_path / f"t{trial}"
        proc = subprocess.Popen([sys.executable, "-c", _KILL_WRITER, str(root)],
                                stdout=subprocess.PIPE, cwd=repo)
        assert proc.stdout is not None
        for _ in range(3 + trial * 2):  # let some writes complete, then kill mid-stream
            assert proc.stdout.readline()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        data, etag = LocalStore(root).get("obj")
        assert len(data) == 1 << 20
        assert data.count(data[:1]) == len(data)
        assert etag == local_etag(data)
        assert LocalStore(root).list("") == ["obj"]


def test_object_file_holds_exactly_the_bytes(tmp_path: Path) -> None:
    """The file at <root>/<key> is the object itself, readable by other tools (Spark)."""
    store = open_store(f"file://{tmp_path}")
    store.put("log/Bucket=0000000000000000/FragmentSeqNo=0000000000000001.parquet", b"PAR1")
    path = tmp_path / "log/Bucket=0000000000000000/FragmentSeqNo=0000000000000001.parquet"
    assert path.read_bytes() == b"PAR1"
    assert store.describe() == f"file://{tmp_path}"


def test_hidden_files_are_never_listed(tmp_path: Path) -> None:
    """Temp files, lock files and anything else starting with '.' are not objects."""
    store = LocalStore(tmp_path)
    store.put("a/b", b"x")
    (tmp_path / "a" / ".b.123.tmp").write_bytes(b"partial")
    (tmp_path / ".other").mkdir()
    (tmp_path / ".other" / "f").write_bytes(b"x")
    assert store.list("") == ["a/b"]
    assert store.list(".locks/") == []
    assert store.list(".other/") == []
    with pytest.raises(ValueError):
        store.get(".locks/0000")


def test_key_cannot_be_both_object_and_directory(tmp_path: Path) -> None:
    """A filesystem cannot hold 'a' and 'a/b' at once: the second write fails clearly."""
    store = LocalStore(tmp_path)
    store.put("a", b"x")
    with pytest.raises(ObjectStoreError, match="cannot also hold"):
        store.put("a/b", b"y")
    store.put("c/d", b"y")
    with pytest.raises(ObjectStoreError, match="directory of other keys"):
        store.put("c", b"z")
    with pytest.raises(NotFound):
        store.get("c")
    assert store.list("") == ["a", "c/d"]


def test_unwritable_root_is_a_clear_error(tmp_path: Path) -> None:
    """A root that is a file is refused with the store's URI in the message."""
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(ObjectStoreError, match="file://"):
        LocalStore(tmp_path / "file")


def test_open_store_file_uri_rules(tmp_path: Path) -> None:
    """file:// URIs must be absolute; endpoint_url is refused outside s3://."""
    with pytest.raises(ValueError, match="three slashes"):
        open_store("file://relative/dir")
    with pytest.raises(ValueError, match="s3:// only"):
        open_store(f"file://{tmp_path}", endpoint_url="http://127.0.0.1:1")
    with pytest.raises(ValueError, match="unknown scheme"):
        open_store("gs://bucket/x")


@pytest.mark.parametrize("step", STEPS)
def test_crash_creating_a_key_leaves_it_absent_or_whole(tmp_path: Path, step: str) -> None:
    """A crash during put_if_absent leaves no object (before the rename) or the whole
    new one (after it); a retry then answers truthfully."""

    def crash_at(op: str, key: str, step_: str) -> None:
        if step_ == step:
            raise Crash(step_)

    with pytest.raises(Crash):
        LocalStore(tmp_path, on_step=crash_at).put_if_absent("frag/0001", b"F" * 5000)
    after = LocalStore(tmp_path)
    if STEPS.index(step) >= STEPS.index("renamed"):
        assert after.get("frag/0001")[0] == b"F" * 5000
        with pytest.raises(PreconditionFailed):
            after.put_if_absent("frag/0001", b"F" * 5000)
    else:
        assert after.head("frag/0001") is None
        assert after.list("") == []
        after.put_if_absent("frag/0001", b"F" * 5000)
        assert after.list("") == ["frag/0001"]
