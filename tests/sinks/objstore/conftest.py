"""Fixtures: ``store`` is each backend in turn (local files, memory, S3 on moto)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sinks.objstore import InMemoryObjectStore, LocalStore, ObjectStore, S3Store

BACKENDS = [
    pytest.param("local", id="local"),
    pytest.param("memory", id="memory"),
    pytest.param("s3", id="s3", marks=pytest.mark.s3),
]


def make_store(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if kind == "local":
        return LocalStore(tmp_path / "store")
    if kind == "memory":
        return InMemoryObjectStore(f"test-{uuid.uuid4().hex}")
    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = request.getfixturevalue("s3_bucket")
    return S3Store(bucket, "some/prefix", endpoint_url=endpoint, max_attempts=3)


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    """A fresh, empty store of each backend."""
    yield make_store(request.param, request, tmp_path)
