"""The object-store contract (``sinks.objstore.testing``) against every backend."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sinks.objstore import InMemoryObjectStore, LocalStore, ObjectStore
from sinks.objstore.testing import CHECKS, check_object_store


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
def test_backend_conforms(store: ObjectStore, check: Callable[..., None]) -> None:
    """Each conformance check passes on each backend (local, memory, S3 on moto)."""
    # moto serves one request at a time: fewer threads race just as hard, in less time.
    check(store, threads=4 if store.describe().startswith("s3://") else 8)


def test_check_object_store_runs_every_check(tmp_path: Path) -> None:
    """The one-call entry point runs every check, each on a fresh store."""
    made: list[ObjectStore] = []

    def make() -> ObjectStore:
        made.append(LocalStore(tmp_path / str(len(made)), fsync=False))
        return made[-1]

    check_object_store(make, threads=4)
    assert len(made) == len(CHECKS)


class LosesUpdates(InMemoryObjectStore):
    """A broken store whose put_if_match ignores the etag."""

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        return self.put(key, data)


def test_suite_catches_a_store_without_compare_and_swap() -> None:
    """A store whose CAS does not compare fails the suite with a message saying so."""
    with pytest.raises(AssertionError, match="stale etag"):
        check_object_store(LosesUpdates)
