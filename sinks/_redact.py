"""``redact``: hide credentials written into URLs before any text is shown.

An S3 endpoint such as ``http://key:secret@minio:9000`` or a store URI such as
``s3://key:secret@bucket/prefix`` carries a password in its user-info part. Every error
message and log line that shows a URI passes it (or the whole message) through
``redact`` first, so the secret never reaches a terminal, a log file or a test report.
"""

from __future__ import annotations

import re

__all__ = ["redact"]

# scheme://user-info@ ; the user-info stops at the first character that cannot be in it
# (a slash, whitespace, a quote), so the host and path stay visible.
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/@\s'\"<>]+)@")


def redact(text: str) -> str:
    """``text`` with the user-info of every URL in it replaced by ``***``."""
    return _USERINFO.sub(r"\g<scheme>***@", text)
