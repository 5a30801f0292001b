"""The S3 backend through boto3: conditional writes, one error boundary, bounded retries.

``put_if_absent`` sends ``If-None-Match: *`` and ``put_if_match`` sends ``If-Match``
(S3 has honoured both on PutObject since 2024; so do moto and MinIO). Every boto3 call
goes through ``S3Store._attempt``, the one place vendor exceptions become ours
(``_translate``); ``S3Store._run`` retries the retryable ones with capped, jittered
exponential backoff through an injectable ``sleep``. botocore's own retries are turned
off on the clients we build: a hidden retry of a conditional write after a timeout
could turn our own success into a ``412`` and report a lost race that was a win.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

from sinks._redact import redact
from sinks.objstore._errors import NotFound, ObjectStoreError, PreconditionFailed, StoreUnavailable
from sinks.objstore._keys import check_key, check_prefix

__all__ = ["S3Store"]

_T = TypeVar("_T")

_WRITES = frozenset({"put", "put_if_absent", "put_if_match", "delete"})
_CONDITIONAL = frozenset({"put_if_absent", "put_if_match"})
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})
_THROTTLE_CODES = frozenset({
    "SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded",
    "TooManyRequests", "TooManyRequestsException", "RequestThrottled",
    "RequestThrottledException", "ServiceUnavailable", "503", "429",
})
_SERVER_ERROR_CODES = frozenset({"InternalError", "500", "502", "504"})
_CREDENTIAL_CODES = frozenset({
    "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
    "InvalidToken", "403",
})


def _import_boto() -> Any:
    try:
        import boto3
    except ImportError as exc:
        raise ImportError(
            "the S3 object store needs boto3; install the extra: pip install 'cdc-agent[s3]'"
        ) from exc
    return boto3


class S3Store:
    """Objects under ``s3://bucket/prefix``, with S3's conditional writes as compare-and-swap.

    Credentials and region come from the usual AWS chain (environment variables,
    ``~/.aws``, instance roles) unless given here. ``endpoint_url`` points at an
    S3-compatible service (moto, MinIO); boto3 also reads ``AWS_ENDPOINT_URL_S3``.

    Pass ``client`` to use your own boto3 S3 client (then the connection options
    here are ignored; turn botocore retries off on it, see the module docstring).

    Retries: up to ``max_attempts`` attempts per operation for throttling, timeouts,
    connection errors and ``409 ConditionalRequestConflict``, sleeping
    ``uniform(0, min(backoff_cap, backoff_base * 2**attempt))`` between them via
    ``sleep`` (``seed`` fixes the jitter). If an attempt of a conditional write failed
    ambiguously (timeout after sending) and a retry then meets ``412``, the outcome is
    unknown: that raises ``StoreUnavailable(may_have_applied=True)``, never
    ``PreconditionFailed``. ``list_page_size`` is the number of keys per listing
    request (S3's maximum is 1000).
    """

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None,
                 client: Any = None, region_name: str | None = None,
                 aws_access_key_id: str | None = None, aws_secret_access_key: str | None = None,
                 aws_session_token: str | None = None, profile_name: str | None = None,
                 addressing_style: str | None = None, connect_timeout: float = 10.0,
                 read_timeout: float = 60.0, max_pool_connections: int = 32,
                 max_attempts: int = 6, backoff_base: float = 0.05, backoff_cap: float = 2.0,
                 list_page_size: int = 1000, sleep: Callable[[float], None] = time.sleep,
                 seed: int | None = None) -> None:
        if not bucket or "/" in bucket:
            raise ValueError(f"invalid bucket name {bucket!r}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        prefix = prefix.strip("/")
        if prefix:
            check_key(prefix)
        self._bucket = bucket
        self._prefix = f"{prefix}/" if prefix else ""
        self._max_attempts = max_attempts
        self._page_size = list_page_size
        self._backoff_base = backoff_base
        self._backoff_cap = backoff_cap
        self._sleep = sleep
        self._rng = random.Random(seed)
        boto3 = _import_boto()
        import botocore.exceptions

        self._exc = botocore.exceptions
        if client is None:
            client = self._make_client(
                boto3, endpoint_url=endpoint_url, region_name=region_name,
                aws_access_key_id=aws_access_key_id,
                aws_secret_access_key=aws_secret_access_key,
                aws_session_token=aws_session_token, profile_name=profile_name,
                addressing_style=addressing_style, connect_timeout=connect_timeout,
                read_timeout=read_timeout, max_pool_connections=max_pool_connections)
        self._client = client

    @staticmethod
    def _make_client(boto3: Any, *, endpoint_url: str | None, region_name: str | None,
                     aws_access_key_id: str | None, aws_secret_access_key: str | None,
                     aws_session_token: str | None, profile_name: str | None,
                     addressing_style: str | None, connect_timeout: float,
                     read_timeout: float, max_pool_connections: int) -> Any:
        from botocore.config import Config

        session = boto3.session.Session(
            aws_access_key_id=aws_access_key_id, aws_secret_access_key=aws_secret_access_key,
            aws_session_token=aws_session_token, profile_name=profile_name,
            region_name=region_name)
        style = addressing_style or ("path" if endpoint_url else "auto")
        config = Config(
            retries={"total_max_attempts": 1},  # we retry, knowing which calls are safe to
            connect_timeout=connect_timeout, read_timeout=read_timeout,
            max_pool_connections=max_pool_connections, s3={"addressing_style": style})
        try:
            return session.client("s3", endpoint_url=endpoint_url,
                                  region_name=session.region_name or "us-east-1", config=config)
        except ValueError as exc:  # botocore quotes a bad endpoint URL, secret and all
            raise ValueError(redact(str(exc))) from None

    @property
    def client(self) -> Any:
        """The boto3 S3 client (for set-up such as creating the bucket)."""
        return self._client

    @property
    def bucket(self) -> str:
        return self._bucket

    def describe(self) -> str:
        return f"s3://{self._bucket}/{self._prefix}"

    def get(self, key: str) -> tuple[bytes, str]:
        full = self._full(check_key(key))

        def call() -> tuple[bytes, str]:
            response = self._client.get_object(Bucket=self._bucket, Key=full)
            return response["Body"].read(), str(response["ETag"])
        return self._run("get", key, call)

    def head(self, key: str) -> str | None:
        full = self._full(check_key(key))
        try:
            response = self._run("head", key, lambda: self._client.head_object(
                Bucket=self._bucket, Key=full))
        except NotFound:
            return None
        return str(response["ETag"])

    def put(self, key: str, data: bytes) -> str:
        full = self._full(check_key(key))
        data = _as_bytes(data)
        return self._put("put", key, lambda: self._client.put_object(
            Bucket=self._bucket, Key=full, Body=data))

    def put_if_absent(self, key: str, data: bytes) -> str:
        full = self._full(check_key(key))
        data = _as_bytes(data)
        return self._put("put_if_absent", key, lambda: self._client.put_object(
            Bucket=self._bucket, Key=full, Body=data, IfNoneMatch="*"))

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        full = self._full(check_key(key))
        data = _as_bytes(data)
        return self._put("put_if_match", key, lambda: self._client.put_object(
            Bucket=self._bucket, Key=full, Body=data, IfMatch=etag))

    def list(self, prefix: str) -> list[str]:
        full = self._prefix + check_prefix(prefix)
        strip = len(self._prefix)

        def call() -> list[str]:
            keys: list[str] = []
            paginator = self._client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self._bucket, Prefix=full,
                                           PaginationConfig={"PageSize": self._page_size}):
                keys.extend(str(item["Key"])[strip:] for item in page.get("Contents", ()))
            return keys
        keys = self._run("list", prefix, call)
        keys.sort()  # S3 lists in UTF-8 byte order already; this keeps fakes honest too
        return keys

    def delete(self, key: str) -> None:
        full = self._full(check_key(key))
        self._run("delete", key, lambda: self._client.delete_object(
            Bucket=self._bucket, Key=full))

    # Internals.

    def _full(self, key: str) -> str:
        return self._prefix + key

    def _put(self, op: str, key: str, call: Callable[[], Any]) -> str:
        return str(self._run(op, key, call)["ETag"])

    def _run(self, op: str, key: str, call: Callable[[], _T]) -> _T:
        """Call ``call`` with retries; only our errors escape.

        # Step 1. Attempt the call through the error boundary.
        # Step 2. On a retryable error, remember whether the attempt may have applied,
        #         back off and retry, up to ``max_attempts`` attempts in all.
        # Step 3. A conditional write that meets 412 after an ambiguous attempt cannot
        #         tell its own earlier write from a rival's: report the outcome unknown.
        """
        maybe_applied = False
        for attempt in range(1, self._max_attempts + 1):
            try:
                return self._attempt(op, key, call)  # Step 1.
            except StoreUnavailable as err:  # Step 2.
                maybe_applied = maybe_applied or err.may_have_applied
                if attempt == self._max_attempts:
                    raise StoreUnavailable(
                        f"{err} (gave up after {attempt} attempts; retry later)", key=key,
                        may_have_applied=maybe_applied) from err
                self._sleep(self._backoff(attempt))
            except PreconditionFailed as err:  # Step 3.
                if maybe_applied and op in _CONDITIONAL:
                    raise StoreUnavailable(
                        f"{op} {key!r} in {self.describe()}: an earlier attempt timed out "
                        "and the retry found the condition false, so the earlier attempt "
                        "may have written it; re-read the key to learn which write won",
                        key=key, may_have_applied=True) from err
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _backoff(self, attempt: int) -> float:
        return self._rng.uniform(0.0, min(self._backoff_cap, self._backoff_base * 2**attempt))

    def _attempt(self, op: str, key: str, call: Callable[[], _T]) -> _T:
        """The error boundary: every boto3 call runs here."""
        try:
            return call()
        except (self._exc.ClientError, self._exc.BotoCoreError) as exc:
            raise self._translate(exc, op, key) from exc

    def _translate(self, exc: Exception, op: str, key: str) -> ObjectStoreError:
        """Map one botocore exception to ours (called only by ``_attempt``)."""
        what = f"{op} {key!r} in {self.describe()}"
        write = op in _WRITES
        e = self._exc
        if isinstance(exc, e.ClientError):
            error = exc.response.get("Error", {})
            code = str(error.get("Code", ""))
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
            message = error.get("Message") or code
            if code == "PreconditionFailed" or status == 412:
                return PreconditionFailed(
                    f"{what}: {_condition(op)} did not hold (412); nothing was written",
                    key=key)
            if code == "NoSuchBucket":
                return ObjectStoreError(
                    f"{what}: bucket {self._bucket!r} does not exist; create it or fix the "
                    "store URI", key=key)
            if code in _NOT_FOUND_CODES or status == 404:
                if op == "put_if_match":
                    return PreconditionFailed(
                        f"{what}: the key does not exist (404); nothing was written", key=key)
                return NotFound(f"no object {key!r} in {self.describe()}", key=key)
            if code == "ConditionalRequestConflict" or status == 409:
                return StoreUnavailable(
                    f"{what}: a concurrent conditional write conflicted (409 {code}); "
                    "nothing was written, retry", key=key)
            if code in _THROTTLE_CODES or status in (429, 503):
                return StoreUnavailable(f"{what}: throttled ({status} {code}); retry later",
                                        key=key)
            if code == "RequestTimeout":
                return StoreUnavailable(
                    f"{what}: S3 timed out reading the request ({code}); retry", key=key)
            if code in _SERVER_ERROR_CODES or status >= 500:
                return StoreUnavailable(
                    f"{what}: server error ({status} {code}: {message})", key=key,
                    may_have_applied=write)
            if code in _CREDENTIAL_CODES or status == 403:
                return ObjectStoreError(
                    f"{what}: access denied ({code}: {message}); check the credentials and "
                    "the bucket policy", key=key)
            return ObjectStoreError(f"{what}: {status} {code}: {message}", key=key)
        shown = redact(str(exc))  # botocore's text may quote an endpoint URL with a secret
        if isinstance(exc, e.NoCredentialsError | e.PartialCredentialsError):
            return ObjectStoreError(
                f"{what}: no usable AWS credentials ({shown}); set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, a profile, or pass them to the store", key=key)
        if isinstance(exc, e.ConnectionError):
            # Connecting failed (refused, DNS, connect timeout): the request never left.
            return StoreUnavailable(f"{what}: cannot connect ({shown}); retry", key=key)
        if isinstance(exc, e.HTTPClientError | e.IncompleteReadError):
            # Read timeout, connection closed mid-response: the request may have applied.
            return StoreUnavailable(f"{what}: connection failed mid-request ({shown})",
                                    key=key, may_have_applied=write)
        return ObjectStoreError(f"{what}: {type(exc).__name__}: {shown}", key=key)


def _condition(op: str) -> str:
    if op == "put_if_absent":
        return "If-None-Match: * (the key must not exist)"
    if op == "put_if_match":
        return "If-Match (the key must hold the given etag)"
    return "a precondition"


def _as_bytes(data: bytes) -> bytes:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"object data must be bytes, not {type(data).__name__}")
    return bytes(data)
