"""Spark workers stop re-reading zip archives before each task (``_worker_imports``)."""

from __future__ import annotations

import os
import sys
import zipfile
import zipimport
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from replay.spark import _worker_imports
from replay.spark._worker_imports import lazy_zip_invalidation

old_python = pytest.mark.skipif(sys.version_info >= (3, 12),
                                reason="zipimport is lazy from Python 3.12 on")


@pytest.fixture()
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every archive directory zipimport reads, while the lazy invalidation is in place."""
    seen: list[str] = []
    original = zipimport._read_directory  # type: ignore[attr-defined]

    def counting(archive: str) -> Any:
        seen.append(archive)
        return original(archive)

    monkeypatch.setattr(zipimport, "_read_directory", counting)
    monkeypatch.setattr(zipimport.zipimporter, "invalidate_caches",
                        zipimport.zipimporter.invalidate_caches)  # restored afterwards
    assert lazy_zip_invalidation()
    return seen


def _archive(path: Path, **modules: str) -> str:
    with zipfile.ZipFile(path, "w") as z:
        for name, source in modules.items():
            z.writestr(f"{name}.py", source)
    return str(path)


@old_python
def test_an_unchanged_archive_is_read_once_a_changed_one_again(
        tmp_path: Path, reads: list[str]) -> None:
    archive = _archive(tmp_path / "lib.zip", first="X = 1\n")
    importer = zipimport.zipimporter(archive)
    reads.clear()
    for _ in range(5):
        importer.invalidate_caches()
    assert reads == [archive]  # the first call reads: the importer had no stamp yet
    assert importer.find_spec("second") is None
    stat = os.stat(archive)
    _archive(tmp_path / "lib.zip", first="X = 1\n", second="Y = 2\n")
    os.utime(archive, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    importer.invalidate_caches()
    assert reads == [archive, archive]
    assert importer.find_spec("second") is not None  # the new module is importable
    importer.invalidate_caches()
    assert reads == [archive, archive]


@old_python
def test_an_archive_rewritten_with_its_size_and_mtime_is_read_again(
        tmp_path: Path, reads: list[str]) -> None:
    """``cp -p`` of a same-size archive: the change time tells (offsets inside differ)."""
    archive = _archive(tmp_path / "lib.zip", first="X = 1\n")
    importer = zipimport.zipimporter(archive)
    importer.invalidate_caches()
    stat = os.stat(archive)
    _archive(tmp_path / "lib.zip", other="X = 1\n")  # same length, another module
    os.utime(archive, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert os.stat(archive).st_size == stat.st_size
    reads.clear()
    importer.invalidate_caches()
    assert reads == [archive]
    assert importer.find_spec("other") is not None and importer.find_spec("first") is None


@old_python
def test_an_archive_that_disappeared_is_emptied(tmp_path: Path, reads: list[str]) -> None:
    archive = _archive(tmp_path / "gone.zip", first="X = 1\n")
    importer = zipimport.zipimporter(archive)
    importer.invalidate_caches()
    os.remove(archive)
    importer.invalidate_caches()  # as Python does: no error, nothing importable
    assert importer.find_spec("first") is None


def _report(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    import zipimport

    import replay.spark  # noqa: F401  (as an executor-side function's module would)

    for batch in batches:
        name = zipimport.zipimporter.invalidate_caches.__name__
        yield pa.RecordBatch.from_pydict({"name": [name] * batch.num_rows})


@pytest.mark.spark
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@old_python
def test_spark_workers_use_it_and_the_driver_does_not(spark: Any) -> None:
    names = {r["name"] for r in spark.range(4, numPartitions=2)
             .mapInArrow(_report, "name string").collect()}
    assert names == {"_invalidate_if_changed"}
    assert zipimport.zipimporter.invalidate_caches is _worker_imports._EAGER
