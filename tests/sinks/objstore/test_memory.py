"""InMemoryObjectStore: fault, latency and crash injection are exact and reproducible."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sinks.objstore import (
    Call,
    Crash,
    InMemoryObjectStore,
    NotFound,
    PreconditionFailed,
    StoreUnavailable,
    open_store,
)


def test_crash_is_not_an_exception() -> None:
    """Crash escapes `except Exception`, as a real crash escapes the process."""
    assert issubclass(Crash, BaseException)
    assert not issubclass(Crash, Exception)


def test_nth_call_fails_before_taking_effect() -> None:
    """fail(op, nth=2): only the second CAS fails, and it writes nothing."""
    store = InMemoryObjectStore()
    store.faults.fail("put_if_match", nth=2)
    etag = store.put("k", b"0")
    etag = store.put_if_match("k", b"1", etag)
    with pytest.raises(StoreUnavailable) as info:
        store.put_if_match("k", b"2", etag)
    assert not info.value.may_have_applied
    assert store.get("k") == (b"1", etag)
    store.put_if_match("k", b"2", etag)  # the third call goes through
    assert store.get("k")[0] == b"2"


def test_ambiguous_failure_takes_effect_then_raises() -> None:
    """fail(after=True): the write happens, the caller still sees StoreUnavailable."""
    store = InMemoryObjectStore()
    store.faults.fail("put_if_absent", after=True)
    with pytest.raises(StoreUnavailable) as info:
        store.put_if_absent("frag", b"data")
    assert info.value.may_have_applied
    assert store.get("frag")[0] == b"data"
    with pytest.raises(PreconditionFailed):  # a naive retry now "loses" to itself
        store.put_if_absent("frag", b"data")


def test_key_pattern_and_times() -> None:
    """Rules match op and key by fnmatch; times bounds how often they fire."""
    store = InMemoryObjectStore()
    store.faults.fail("put*", key="log/*", times=2)
    store.put("manifest/MANIFEST", b"m")  # not matched
    for _ in range(2):
        with pytest.raises(StoreUnavailable):
            store.put_if_absent("log/1", b"x")
    store.put_if_absent("log/1", b"x")  # the rule is spent
    assert store.list("") == ["log/1", "manifest/MANIFEST"]
    store.faults.fail("get", times=None)
    for _ in range(3):
        with pytest.raises(StoreUnavailable):
            store.get("log/1")
    store.faults.clear()
    assert store.get("log/1")[0] == b"x"


def _failure_pattern(seed: int) -> list[bool]:
    store = InMemoryObjectStore(seed=seed)
    store.faults.fail("put", times=None, probability=0.3)
    pattern = []
    for i in range(60):
        try:
            store.put(f"k{i}", b"x")
            pattern.append(False)
        except StoreUnavailable:
            pattern.append(True)
    return pattern


def test_probabilistic_faults_replay_from_the_seed() -> None:
    """The same seed gives the same failures; another seed gives others."""
    assert _failure_pattern(1) == _failure_pattern(1)
    assert _failure_pattern(1) != _failure_pattern(2)
    assert 0 < sum(_failure_pattern(1)) < 60


def test_delay_goes_through_the_injected_sleep() -> None:
    """Latency is a call to the injected sleep function, before the operation."""
    slept: list[float] = []
    store = InMemoryObjectStore(sleep=slept.append)
    store.faults.delay(0.25, "list")
    store.faults.delay(1.5, "put", key="slow/*", nth=1)
    store.put("slow/a", b"x")
    store.put("slow/b", b"x")
    store.list("slow/")
    assert slept == [1.5, 0.25]


@pytest.mark.parametrize("after", [False, True])
def test_crash_rule_before_or_after_the_effect(after: bool) -> None:
    """crash(): Crash propagates through `except Exception`; after=True means written."""
    store = InMemoryObjectStore()
    store.faults.crash("put_if_match", key="manifest/*", after=after)
    etag = store.put("manifest/MANIFEST", b"v1")

    def production_code() -> None:
        try:
            store.put_if_match("manifest/MANIFEST", b"v2", etag)
        except Exception:
            pytest.fail("Crash was swallowed by except Exception")

    with pytest.raises(Crash):
        production_code()
    assert store.get("manifest/MANIFEST")[0] == (b"v2" if after else b"v1")


def test_on_step_hook_sees_every_step_and_can_crash() -> None:
    """on_step is called before and after each operation with per-op call numbers."""
    seen: list[Call] = []

    def hook(call: Call) -> None:
        seen.append(call)
        if call.op == "delete" and call.phase == "before":
            raise Crash("before delete")

    store = InMemoryObjectStore(on_step=hook)
    store.put("a", b"1")
    store.put("b", b"2")
    store.head("a")
    with pytest.raises(Crash):
        store.delete("a")
    assert [(c.op, c.key, c.n, c.phase) for c in seen] == [
        ("put", "a", 1, "before"), ("put", "a", 1, "after"),
        ("put", "b", 2, "before"), ("put", "b", 2, "after"),
        ("head", "a", 1, "before"), ("head", "a", 1, "after"),
        ("delete", "a", 1, "before"),
    ]
    assert store.get("a")[0] == b"1"
    assert store.count("put") == 2
    assert [c.op for c in store.calls] == ["put", "put", "head", "delete", "get"]


def test_injected_errors_must_be_store_errors() -> None:
    """An injected plain Exception is refused: backends never raise those."""
    store = InMemoryObjectStore()
    store.faults.fail("get", error=lambda call: NotFound(f"custom {call.key}", key=call.key))
    with pytest.raises(NotFound, match="custom k"):
        store.get("k")
    store.faults.fail("get", error=lambda call: KeyError(call.key))
    with pytest.raises(TypeError, match="ObjectStoreError"):
        store.get("k")


def test_bad_rules_are_refused() -> None:
    """Typos in a fault plan fail when the rule is added, not silently never firing."""
    store = InMemoryObjectStore()
    with pytest.raises(ValueError, match="matches no operation"):
        store.faults.fail("put_if_matches")
    with pytest.raises(ValueError, match="nth"):
        store.faults.fail("get", nth=0)
    with pytest.raises(ValueError, match="probability"):
        store.faults.fail("get", probability=1.5)


def test_memory_uri_names_a_shared_store() -> None:
    """open_store('memory://name') returns the same store for the same name."""
    name = f"shared-{uuid.uuid4().hex}"
    first = open_store(f"memory://{name}")
    first.put("x", b"1")
    again = open_store(f"memory://{name}")
    assert again is first
    assert open_store(f"memory://{name}-other").list("") == []
    with pytest.raises(ValueError, match="already exists"):
        open_store(f"memory://{name}", seed=3)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), p_before=st.floats(0, 0.5), p_after=st.floats(0, 0.5))
def test_cas_loop_under_faults_counts_every_applied_write(
        seed: int, p_before: float, p_after: float) -> None:
    """Under random transient and ambiguous failures, a CAS loop that re-reads after
    every error ends with the counter equal to the writes that really applied: the
    confirmed successes plus the ambiguous failures (which applied)."""
    store = InMemoryObjectStore(seed=seed)
    store.put("counter", b"0")
    store.faults.fail("put_if_match", times=None, probability=p_before)
    store.faults.fail("put_if_match", times=None, probability=p_after, after=True)
    confirmed = ambiguous = 0
    for _ in range(40):
        data, etag = store.get("counter")
        try:
            store.put_if_match("counter", str(int(data) + 1).encode(), etag)
            confirmed += 1
        except StoreUnavailable as err:
            ambiguous += err.may_have_applied
    assert int(store.get("counter")[0]) == confirmed + ambiguous
