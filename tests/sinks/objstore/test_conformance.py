"""The object-store contract, run against every backend (local, memory, S3 on moto)."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

import pytest

from sinks.objstore import NotFound, ObjectStore, PreconditionFailed

THREADS = 8


def run_threads(count: int, target: Callable[[int], None]) -> None:
    """Start ``count`` threads on ``target(i)`` behind a barrier; re-raise any failure."""
    barrier = threading.Barrier(count)
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            barrier.wait()
            target(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def test_is_an_object_store(store: ObjectStore) -> None:
    """Every backend satisfies the runtime-checkable protocol and describes itself as a URI."""
    assert isinstance(store, ObjectStore)
    assert store.describe().split("://")[0] in {"file", "memory", "s3"}


def test_put_get_head_agree_on_etag(store: ObjectStore) -> None:
    """put returns the etag that get and head report, and get returns the exact bytes."""
    data = bytes(range(256)) * 3
    etag = store.put("a/b", data)
    assert store.get("a/b") == (data, etag)
    assert store.head("a/b") == etag


def test_empty_object_round_trips(store: ObjectStore) -> None:
    """A zero-length object is an object: it exists and reads back empty."""
    etag = store.put("empty", b"")
    assert store.get("empty") == (b"", etag)


def test_missing_key(store: ObjectStore) -> None:
    """get of a missing key raises NotFound naming the key; head returns None."""
    with pytest.raises(NotFound) as info:
        store.get("nope/x")
    assert info.value.key == "nope/x"
    assert "nope/x" in str(info.value)
    assert store.head("nope/x") is None


def test_put_overwrites_and_changes_etag(store: ObjectStore) -> None:
    """An unconditional put replaces the bytes and the etag."""
    first = store.put("k", b"one")
    second = store.put("k", b"two")
    assert first != second
    assert store.get("k") == (b"two", second)


def test_put_if_absent(store: ObjectStore) -> None:
    """put_if_absent creates once; then it fails and leaves the object untouched."""
    etag = store.put_if_absent("k", b"first")
    with pytest.raises(PreconditionFailed):
        store.put_if_absent("k", b"second")
    assert store.get("k") == (b"first", etag)


def test_put_if_match(store: ObjectStore) -> None:
    """put_if_match replaces only at the expected etag; a stale etag changes nothing."""
    old = store.put("k", b"v1")
    new = store.put_if_match("k", b"v2", old)
    assert new != old
    with pytest.raises(PreconditionFailed):
        store.put_if_match("k", b"v3", old)
    assert store.get("k") == (b"v2", new)


def test_put_if_match_missing_key(store: ObjectStore) -> None:
    """put_if_match on a missing key fails and creates nothing."""
    etag = store.put("other", b"x")
    with pytest.raises(PreconditionFailed):
        store.put_if_match("missing", b"y", etag)
    assert store.head("missing") is None


def test_delete_is_idempotent(store: ObjectStore) -> None:
    """delete removes the object; deleting again, or a never-written key, is fine."""
    store.put("d/x", b"1")
    store.delete("d/x")
    store.delete("d/x")
    store.delete("never/written")
    with pytest.raises(NotFound):
        store.get("d/x")
    assert store.list("d/") == []
    store.put_if_absent("d/x", b"again")  # absent again, so creatable again
    assert store.get("d/x")[0] == b"again"


def test_list_in_byte_order_with_prefixes(store: ObjectStore) -> None:
    """list returns every key with the prefix, in byte order, across nested 'directories'."""
    keys = [f"log/Bucket={b:016x}/FragmentSeqNo={s:016x}.parquet"
            for b in range(3) for s in range(b * 4096 + 1, b * 4096 + 4)]
    keys += ["manifest/MANIFEST", "snapshot/SNAPSHOT.00ab", "a-b", "a/b", "a0", "a/bc/x",
             "a/b2", "zz/\u00e9t\u00e9"]
    shuffled = keys[:]
    random.Random(7).shuffle(shuffled)
    for key in shuffled:
        store.put(key, key.encode())
    by_bytes = sorted(keys, key=lambda k: k.encode())
    assert store.list("") == by_bytes
    assert store.list("log/") == [k for k in by_bytes if k.startswith("log/")]
    assert store.list("log/Bucket=000000000000000") == [
        k for k in by_bytes if k.startswith("log/Bucket=000000000000000")]
    assert store.list("log/Bucket=0000000000000001/") == keys[3:6]
    assert store.list("a/b") == ["a/b", "a/b2", "a/bc/x"]
    assert store.list("a/bc/") == ["a/bc/x"]
    assert store.list("a") == ["a-b", "a/b", "a/b2", "a/bc/x", "a0"]
    assert store.list("nothing/") == []
    assert store.list("manifest/MANIFEST") == ["manifest/MANIFEST"]


@pytest.mark.parametrize("key", ["", "/a", "a/", "a//b", ".hidden", "a/.tmp", "a/../b",
                                 "a\\b", "a\nb"])
def test_invalid_keys_are_refused(store: ObjectStore, key: str) -> None:
    """Every backend refuses the same malformed keys before touching storage."""
    with pytest.raises(ValueError):
        store.put(key, b"x")
    with pytest.raises(ValueError):
        store.get(key)


def test_put_if_absent_race_has_one_winner(store: ObjectStore) -> None:
    """N threads racing put_if_absent on one key: exactly one wins and its bytes stay."""
    winners: list[int] = []
    losers: list[int] = []

    def contend(i: int) -> None:
        try:
            store.put_if_absent("race/key", f"writer {i}".encode())
            winners.append(i)
        except PreconditionFailed:
            losers.append(i)

    run_threads(THREADS, contend)
    assert len(winners) == 1
    assert len(losers) == THREADS - 1
    assert store.get("race/key")[0] == f"writer {winners[0]}".encode()


def test_put_if_match_race_loses_no_update(store: ObjectStore) -> None:
    """N threads CAS-incrementing one counter: final value == number of successful CAS."""
    store.put("counter", b"0")
    successes = [0] * THREADS
    conflicts = [0] * THREADS
    per_thread = 10

    def increment(i: int) -> None:
        while successes[i] < per_thread:
            data, etag = store.get("counter")
            try:
                store.put_if_match("counter", str(int(data) + 1).encode(), etag)
                successes[i] += 1
            except PreconditionFailed:
                conflicts[i] += 1

    run_threads(THREADS, increment)
    assert int(store.get("counter")[0]) == sum(successes) == THREADS * per_thread
