"""Object stores under the wal3 log: local files, memory (with faults), and S3.

A store maps keys to byte strings and offers compare-and-swap (``put_if_absent``,
``put_if_match``); wal3 needs nothing more. May import ``sinks.objstore`` modules only;
boto3 is imported when an ``S3Store`` is built. Start with ``_protocol.py`` (the
contract), then ``_local.py`` (how a filesystem keeps it across processes).
"""

from sinks.objstore._errors import (
    NotFound,
    ObjectStoreError,
    PreconditionFailed,
    StoreUnavailable,
)
from sinks.objstore._faults import Call, Crash, FaultPlan, FaultRule
from sinks.objstore._keys import check_key
from sinks.objstore._local import LocalStore
from sinks.objstore._memory import InMemoryObjectStore
from sinks.objstore._open import open_store
from sinks.objstore._protocol import ObjectStore
from sinks.objstore._s3 import S3Store

__all__ = [
    "Call",
    "Crash",
    "FaultPlan",
    "FaultRule",
    "InMemoryObjectStore",
    "LocalStore",
    "NotFound",
    "ObjectStore",
    "ObjectStoreError",
    "PreconditionFailed",
    "S3Store",
    "StoreUnavailable",
    "check_key",
    "open_store",
]
