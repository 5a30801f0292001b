"""A conformance suite every object store runs: ``check_object_store(make_store)``.

Shipped in the package so a backend written elsewhere can prove itself the same way
ours do. It needs no test framework: each check raises ``AssertionError`` saying what
broke. ``make_store()`` returns a fresh store; the checks write and read keys under
``conformance/`` only, through the store itself.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

from sinks.objstore._errors import NotFound, PreconditionFailed
from sinks.objstore._protocol import ObjectStore

__all__ = ["CHECKS", "check_object_store"]

INVALID_KEYS = ("", "/a", "a/", "a//b", ".hidden", "a/.tmp", "a/../b", "a\\b", "a\nb")


def check_object_store(make_store: Callable[[], ObjectStore], *, threads: int = 8) -> None:
    """Run every check in ``CHECKS``, each against a fresh store from ``make_store``."""
    for check in CHECKS:
        check(make_store(), threads=threads)


def check_protocol(store: ObjectStore, *, threads: int = 8) -> None:
    """The store satisfies the runtime-checkable protocol and describes itself as a URI."""
    assert isinstance(store, ObjectStore), f"{store!r} lacks ObjectStore methods"
    assert "://" in store.describe(), f"describe() gave {store.describe()!r}, not a URI"


def check_put_get_head(store: ObjectStore, *, threads: int = 8) -> None:
    """put returns the etag get and head report; get returns the exact bytes, even empty;
    an unconditional put replaces bytes and etag."""
    data = bytes(range(256)) * 3
    etag = store.put("conformance/a/b", data)
    assert store.get("conformance/a/b") == (data, etag), "get differs from what put wrote"
    assert store.head("conformance/a/b") == etag, "head's etag differs from put's"
    empty = store.put("conformance/empty", b"")
    assert store.get("conformance/empty") == (b"", empty), "empty object did not round-trip"
    second = store.put("conformance/a/b", b"two")
    assert second != etag, "new bytes kept the old etag"
    assert store.get("conformance/a/b") == (b"two", second), "put did not overwrite"


def check_missing_key(store: ObjectStore, *, threads: int = 8) -> None:
    """get of a missing key raises NotFound naming the key; head returns None."""
    try:
        store.get("conformance/nope")
    except NotFound as exc:
        assert exc.key == "conformance/nope", f"NotFound.key is {exc.key!r}"
        assert "conformance/nope" in str(exc), f"NotFound message {exc} omits the key"
    else:
        raise AssertionError("get of a missing key did not raise NotFound")
    assert store.head("conformance/nope") is None, "head of a missing key is not None"


def check_put_if_absent(store: ObjectStore, *, threads: int = 8) -> None:
    """put_if_absent creates once; then it fails and leaves the object untouched."""
    etag = store.put_if_absent("conformance/k", b"first")
    _expect_precondition(lambda: store.put_if_absent("conformance/k", b"second"),
                         "put_if_absent on an existing key")
    assert store.get("conformance/k") == (b"first", etag), "a failed put_if_absent wrote"


def check_put_if_match(store: ObjectStore, *, threads: int = 8) -> None:
    """put_if_match writes only at the expected etag; a stale etag or a missing key
    changes nothing."""
    old = store.put("conformance/k", b"v1")
    new = store.put_if_match("conformance/k", b"v2", old)
    assert new != old, "put_if_match kept the etag"
    _expect_precondition(lambda: store.put_if_match("conformance/k", b"v3", old),
                         "put_if_match with a stale etag")
    assert store.get("conformance/k") == (b"v2", new), "a failed put_if_match wrote"
    _expect_precondition(lambda: store.put_if_match("conformance/missing", b"x", new),
                         "put_if_match on a missing key")
    assert store.head("conformance/missing") is None, "put_if_match created a missing key"


def check_delete(store: ObjectStore, *, threads: int = 8) -> None:
    """delete removes the object and is idempotent; the key can then be created again."""
    store.put("conformance/d/x", b"1")
    store.delete("conformance/d/x")
    store.delete("conformance/d/x")
    store.delete("conformance/never/written")
    assert store.head("conformance/d/x") is None, "deleted object still there"
    assert store.list("conformance/d/") == [], "deleted object still listed"
    store.put_if_absent("conformance/d/x", b"again")
    assert store.get("conformance/d/x")[0] == b"again", "re-created object differs"


def check_list_order(store: ObjectStore, *, threads: int = 8) -> None:
    """list returns every key starting with the prefix (a string prefix, not a
    directory), in UTF-8 byte order, across nested levels."""
    names = [f"log/Bucket={b:016x}/FragmentSeqNo={s:016x}.parquet"
             for b in range(3) for s in range(b * 4096 + 1, b * 4096 + 4)]
    names += ["manifest/MANIFEST", "snapshot/SNAPSHOT.00ab", "a-b", "a/b", "a0", "a/bc/x",
              "a/b2", "zz/\u00e9t\u00e9"]
    keys = [f"conformance/{name}" for name in names]
    shuffled = keys[:]
    random.Random(7).shuffle(shuffled)
    for key in shuffled:
        store.put(key, key.encode())
    by_bytes = sorted(keys, key=lambda k: k.encode())

    def expect(prefix: str, wanted: list[str]) -> None:
        got = store.list(prefix)
        assert got == wanted, f"list({prefix!r}) gave {got}, expected {wanted}"

    def under(prefix: str) -> list[str]:
        return [k for k in by_bytes if k.startswith(prefix)]

    expect("conformance/", by_bytes)
    everything = [k for k in store.list("") if k.startswith("conformance/")]
    assert everything == by_bytes, f"list('') gave {everything}, expected {by_bytes}"
    expect("conformance/log/", under("conformance/log/"))
    expect("conformance/log/Bucket=000000000000000",
           under("conformance/log/Bucket=000000000000000"))
    expect("conformance/log/Bucket=0000000000000001/", keys[3:6])
    expect("conformance/a/b", ["conformance/a/b", "conformance/a/b2", "conformance/a/bc/x"])
    expect("conformance/a/bc/", ["conformance/a/bc/x"])
    expect("conformance/a", ["conformance/a-b", "conformance/a/b", "conformance/a/b2",
                             "conformance/a/bc/x", "conformance/a0"])
    expect("conformance/nothing/", [])
    expect("conformance/manifest/MANIFEST", ["conformance/manifest/MANIFEST"])


def check_invalid_keys(store: ObjectStore, *, threads: int = 8) -> None:
    """Malformed keys are refused with ValueError before storage is touched."""
    for key in INVALID_KEYS:
        _expect_value_error(store.put, key, b"x")
        _expect_value_error(store.get, key)


def check_put_if_absent_race(store: ObjectStore, *, threads: int = 8) -> None:
    """N threads racing put_if_absent on one key: exactly one wins, its bytes stay."""
    winners: list[int] = []
    losers: list[int] = []

    def contend(i: int) -> None:
        try:
            store.put_if_absent("conformance/race", f"writer {i}".encode())
            winners.append(i)
        except PreconditionFailed:
            losers.append(i)

    run_threads(threads, contend)
    assert len(winners) == 1, f"{len(winners)} threads won put_if_absent: {winners}"
    assert len(losers) == threads - 1, f"{threads - 1 - len(losers)} threads got no answer"
    stored = store.get("conformance/race")[0]
    assert stored == f"writer {winners[0]}".encode(), f"winner's bytes lost: {stored!r}"


def check_put_if_match_race(store: ObjectStore, *, threads: int = 8,
                            increments: int = 10) -> None:
    """N threads CAS-incrementing one counter: the final value counts every success."""
    store.put("conformance/counter", b"0")
    successes = [0] * threads

    def increment(i: int) -> None:
        while successes[i] < increments:
            data, etag = store.get("conformance/counter")
            try:
                store.put_if_match("conformance/counter", str(int(data) + 1).encode(), etag)
                successes[i] += 1
            except PreconditionFailed:
                pass

    run_threads(threads, increment)
    final = int(store.get("conformance/counter")[0])
    assert final == sum(successes) == threads * increments, (
        f"counter is {final} after {sum(successes)} successful CAS: updates were lost")


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

    workers = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]


def _expect_value_error(method: Callable[..., object], key: str, *args: object) -> None:
    try:
        method(key, *args)
    except ValueError:
        return
    raise AssertionError(f"{method.__name__}({key!r}) was not refused with ValueError")


def _expect_precondition(action: Callable[[], object], what: str) -> None:
    try:
        action()
    except PreconditionFailed:
        return
    raise AssertionError(f"{what} did not raise PreconditionFailed")


CHECKS: tuple[Callable[..., None], ...] = (
    check_protocol,
    check_put_get_head,
    check_missing_key,
    check_put_if_absent,
    check_put_if_match,
    check_delete,
    check_list_order,
    check_invalid_keys,
    check_put_if_absent_race,
    check_put_if_match_race,
)
