"""The one boundary where errors raised in Spark's Python workers come back as ours.

An executor that finds a corrupt fragment raises ``sinks.wal3.CorruptFragment``; Spark
hands the driver a ``PythonException`` holding the worker's traceback as text. The
context manager ``executor_errors`` turns it back into the error the worker raised (a
wal3 error, a codec error) with the worker's message, so callers catch what they would
catch from the Python reader.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

from pyspark.errors import PythonException

from sinks import wal3
from sinks.codec import CodecError

__all__ = ["executor_errors"]

_KNOWN: Final[dict[str, type[Exception]]] = {
    **{f"sinks.wal3._errors.{name}": getattr(wal3, name) for name in (
        "CorruptFragment", "CorruptLog", "GarbageCollected", "LogUnavailable",
        "UninitializedLog")},
    "sinks.codec.CodecError": CodecError,
}
_RAISED: Final = re.compile(r"^([\w.]+(?:Error|Fragment|Log|Collected|Unavailable)): (.*)$",
                            re.MULTILINE)


@contextmanager
def executor_errors() -> Iterator[None]:
    """Re-raise a worker's wal3 or codec error as itself (``from`` Spark's exception)."""
    try:
        yield
    except PythonException as exc:
        text = str(exc)
        for name, message in reversed(_RAISED.findall(text)):
            kind = _KNOWN.get(name)
            if kind is not None:
                raise kind(message.strip()) from exc
        raise
