"""Spark's Python workers on Python 3.11: stop re-reading zip archives before each task.

Before every task, PySpark's worker calls ``importlib.invalidate_caches()``. On Python
3.10 and 3.11 each ``zipimporter`` then re-reads its archive's whole directory at once
(CPython gh-103200; lazy from 3.12 on), and a worker holds one zipimporter per package
it imported from ``pyspark.zip``, plus one for the spark-core jar PySpark puts on its
path: about 0.2-0.3 s of CPU per task on a 2-core machine, more than most replay tasks'
own work (measured: 8 trivial ``mapInArrow`` tasks 2.0 s, 0.5 s with this).

``lazy_zip_invalidation`` keeps the meaning (an archive that changed is read again) and
drops the cost: an importer re-reads its archive only if the file's size, mtime,
change time or inode differs from when that importer last read it. This package calls
it on import inside a Spark worker only (and the points source's Python process); the
user's driver is left alone.
"""

from __future__ import annotations

import os
import sys
import zipimport
from typing import Any, Final

__all__ = ["in_spark_worker", "lazy_zip_invalidation"]

_EAGER: Final = zipimport.zipimporter.invalidate_caches
_STAMP: Final = "_cdc_agent_stamp"


def _stamp(path: str) -> tuple[int, ...] | None:
    """What changes when the archive does: a rewrite keeping its size and mtime (``cp
    -p``) still moves the inode's change time, a replacing file has another inode."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ctime_ns, st.st_ino


def _invalidate_if_changed(self: Any) -> None:
    stamp = _stamp(self.archive)
    if stamp is not None and getattr(self, _STAMP, None) == stamp:
        return
    _EAGER(self)
    setattr(self, _STAMP, stamp)


def lazy_zip_invalidation() -> bool:
    """Make ``zipimporter.invalidate_caches`` re-read only changed archives (Python
    < 3.12; later versions are lazy already). True if it is in place now."""
    if sys.version_info >= (3, 12):
        return False
    zipimport.zipimporter.invalidate_caches = _invalidate_if_changed  # type: ignore[method-assign]
    return True


def in_spark_worker() -> bool:
    """True inside a PySpark Python worker (set before the task's function is loaded)."""
    files = sys.modules.get("pyspark.core.files")
    return bool(files is not None and getattr(files.SparkFiles, "_is_running_on_worker", False))
