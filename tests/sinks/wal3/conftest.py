"""Fixtures for the wal3 tests: stores, a process-crash proxy, and the golden fixtures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sinks.objstore import Crash, InMemoryObjectStore, LocalStore

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "wal3"


def fixture_text(name: str) -> str:
    """A golden fixture (real manifests written by Chroma's wal3)."""
    return (FIXTURES / name).read_text()


def fixture_json(name: str) -> Any:
    return json.loads(fixture_text(name))


def no_sleep(_: float) -> None:
    """Backoff that costs no time (tests never sleep to make time pass)."""


class ProcessStore:
    """One simulated process's view of a shared store: after the first ``Crash`` every
    later call crashes too, as nothing runs in a dead process."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.dead = False

    def _call(self, name: str, *args: Any) -> Any:
        if self.dead:
            raise Crash("this process already crashed")
        try:
            return getattr(self.inner, name)(*args)
        except Crash:
            self.dead = True
            raise

    def get(self, key: str) -> tuple[bytes, str]:
        return self._call("get", key)  # type: ignore[no-any-return]

    def head(self, key: str) -> str | None:
        return self._call("head", key)  # type: ignore[no-any-return]

    def put(self, key: str, data: bytes) -> str:
        return self._call("put", key, data)  # type: ignore[no-any-return]

    def put_if_absent(self, key: str, data: bytes) -> str:
        return self._call("put_if_absent", key, data)  # type: ignore[no-any-return]

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        return self._call("put_if_match", key, data, etag)  # type: ignore[no-any-return]

    def list(self, prefix: str) -> list[str]:
        return self._call("list", prefix)  # type: ignore[no-any-return]

    def delete(self, key: str) -> None:
        self._call("delete", key)

    def describe(self) -> str:
        return str(self.inner.describe())


@pytest.fixture
def mem_store() -> InMemoryObjectStore:
    return InMemoryObjectStore("wal3-test", sleep=no_sleep)


@pytest.fixture
def local_store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "log")


class FakeClock:
    """A clock tests move by hand."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()

