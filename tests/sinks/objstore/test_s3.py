"""S3Store: conditional writes on moto, error mapping, retries, lazy boto3 import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
import pytest
from botocore.config import Config
from botocore.stub import Stubber

from sinks.objstore import (
    NotFound,
    ObjectStoreError,
    PreconditionFailed,
    S3Store,
    StoreUnavailable,
    open_store,
)
from tests.services._proc import free_port

CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


def raw_client(endpoint: str) -> Any:
    return boto3.session.Session(region_name="us-east-1", **CREDENTIALS).client(
        "s3", endpoint_url=endpoint,
        config=Config(retries={"total_max_attempts": 1}, s3={"addressing_style": "path"}))


# Against moto: does the server really honour the conditions?


@pytest.mark.s3
def test_moto_honours_if_none_match(s3_endpoint: str, s3_bucket: str) -> None:
    """A second PutObject with If-None-Match: * gets 412 and leaves the first object."""
    client = raw_client(s3_endpoint)
    client.put_object(Bucket=s3_bucket, Key="k", Body=b"first", IfNoneMatch="*")
    with pytest.raises(botocore.exceptions.ClientError) as info:
        client.put_object(Bucket=s3_bucket, Key="k", Body=b"second", IfNoneMatch="*")
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert info.value.response["Error"]["Code"] == "PreconditionFailed"
    assert client.get_object(Bucket=s3_bucket, Key="k")["Body"].read() == b"first"


@pytest.mark.s3
def test_moto_honours_if_match(s3_endpoint: str, s3_bucket: str) -> None:
    """PutObject with a stale If-Match gets 412; on a missing key it gets 404 NoSuchKey."""
    client = raw_client(s3_endpoint)
    old = client.put_object(Bucket=s3_bucket, Key="k", Body=b"v1")["ETag"]
    client.put_object(Bucket=s3_bucket, Key="k", Body=b"v2", IfMatch=old)
    with pytest.raises(botocore.exceptions.ClientError) as info:
        client.put_object(Bucket=s3_bucket, Key="k", Body=b"v3", IfMatch=old)
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert client.get_object(Bucket=s3_bucket, Key="k")["Body"].read() == b"v2"
    with pytest.raises(botocore.exceptions.ClientError) as missing:
        client.put_object(Bucket=s3_bucket, Key="absent", Body=b"x", IfMatch=old)
    assert missing.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


@pytest.mark.s3
def test_store_maps_both_412s_to_precondition_failed(s3_endpoint: str, s3_bucket: str) -> None:
    """Through S3Store, both failed conditions raise PreconditionFailed chained to boto's 412."""
    store = S3Store(s3_bucket, "p", endpoint_url=s3_endpoint)
    etag = store.put_if_absent("k", b"1")
    with pytest.raises(PreconditionFailed, match="If-None-Match") as absent:
        store.put_if_absent("k", b"2")
    assert isinstance(absent.value.__cause__, botocore.exceptions.ClientError)
    store.put_if_match("k", b"2", etag)
    with pytest.raises(PreconditionFailed, match="If-Match") as match:
        store.put_if_match("k", b"3", etag)
    assert isinstance(match.value.__cause__, botocore.exceptions.ClientError)
    assert store.get("k")[0] == b"2"


@pytest.mark.s3
def test_prefixes_isolate_stores_in_one_bucket(s3_endpoint: str, s3_bucket: str) -> None:
    """Two prefixes in one bucket never see each other's keys; keys come back unprefixed."""
    one = open_store(f"s3://{s3_bucket}/tenant/one", endpoint_url=s3_endpoint)
    two = open_store(f"s3://{s3_bucket}/tenant/one-more", endpoint_url=s3_endpoint)
    one.put("x", b"1")
    two.put("x", b"2")
    assert one.list("") == ["x"] and two.list("") == ["x"]
    assert one.get("x")[0] == b"1"
    assert one.describe() == f"s3://{s3_bucket}/tenant/one/"
    keys = [o["Key"] for o in raw_client(s3_endpoint).list_objects_v2(
        Bucket=s3_bucket)["Contents"]]
    assert keys == ["tenant/one-more/x", "tenant/one/x"]


@pytest.mark.s3
def test_list_follows_pagination(s3_endpoint: str, s3_bucket: str) -> None:
    """With 7 keys per page, a 30-key listing still returns every key in order."""
    store = S3Store(s3_bucket, endpoint_url=s3_endpoint, list_page_size=7)
    keys = [f"seq/{i:020d}" for i in range(30)]
    for key in reversed(keys):
        store.put(key, b"")
    assert store.list("seq/") == keys
    assert store.list("seq/0000000000000000001") == keys[10:20]


@pytest.mark.s3
def test_missing_bucket_is_a_clear_error(s3_endpoint: str) -> None:
    """A bucket that does not exist is a permanent error naming the bucket."""
    store = S3Store("no-such-bucket-here", endpoint_url=s3_endpoint)
    with pytest.raises(ObjectStoreError, match=r"no-such-bucket-here.*does not exist") as info:
        store.put("k", b"x")
    assert not isinstance(info.value, StoreUnavailable)


def test_connection_refused_is_retried_then_unavailable() -> None:
    """Nothing listening: bounded retries with backoff, then StoreUnavailable (not applied)."""
    slept: list[float] = []
    store = S3Store("bucket", endpoint_url=f"http://127.0.0.1:{free_port()}", max_attempts=4,
                    sleep=slept.append, seed=1, aws_access_key_id="testing",
                    aws_secret_access_key="testing")
    with pytest.raises(StoreUnavailable, match="gave up after 4 attempts") as info:
        store.put_if_absent("k", b"x")
    assert not info.value.may_have_applied
    assert len(slept) == 3
    assert all(0 <= s <= 2.0 for s in slept)
    assert isinstance(info.value.__cause__.__cause__,  # type: ignore[union-attr]
                      botocore.exceptions.EndpointConnectionError)


# Unit tests of the mapping, with botocore's Stubber on a real client.


def stubbed(max_attempts: int = 3) -> tuple[S3Store, Stubber, list[float]]:
    slept: list[float] = []
    client = boto3.session.Session(region_name="us-east-1", **CREDENTIALS).client("s3")
    store = S3Store("bkt", "pre", client=client, max_attempts=max_attempts,
                    sleep=slept.append, seed=0)
    return store, Stubber(client), slept


def put_params(key: str = "pre/k", **extra: Any) -> dict[str, Any]:
    return {"Bucket": "bkt", "Key": key, "Body": b"x", **extra}


def test_stub_412_on_both_conditions() -> None:
    """412 PreconditionFailed maps to PreconditionFailed for both conditional writes."""
    store, stub, slept = stubbed()
    stub.add_client_error("put_object", "PreconditionFailed", http_status_code=412,
                          expected_params=put_params(IfNoneMatch="*"))
    stub.add_client_error("put_object", "PreconditionFailed", http_status_code=412,
                          expected_params=put_params(IfMatch='"e1"'))
    with stub:
        with pytest.raises(PreconditionFailed):
            store.put_if_absent("k", b"x")
        with pytest.raises(PreconditionFailed):
            store.put_if_match("k", b"x", '"e1"')
    stub.assert_no_pending_responses()
    assert slept == []


def test_stub_404_means_not_found_or_failed_condition() -> None:
    """404 is NotFound for get, None for head, PreconditionFailed for put_if_match."""
    store, stub, _ = stubbed()
    stub.add_client_error("get_object", "NoSuchKey", http_status_code=404)
    stub.add_client_error("head_object", "404", http_status_code=404)
    stub.add_client_error("put_object", "NoSuchKey", http_status_code=404)
    with stub:
        with pytest.raises(NotFound):
            store.get("k")
        assert store.head("k") is None
        with pytest.raises(PreconditionFailed, match="does not exist"):
            store.put_if_match("k", b"x", '"e1"')


def test_stub_throttling_and_409_are_retried() -> None:
    """503 SlowDown and 409 ConditionalRequestConflict are retried with backoff."""
    store, stub, slept = stubbed(max_attempts=4)
    stub.add_client_error("put_object", "SlowDown", http_status_code=503)
    stub.add_client_error("put_object", "ConditionalRequestConflict", http_status_code=409)
    stub.add_response("put_object", {"ETag": '"e2"'}, put_params(IfMatch='"e1"'))
    with stub:
        assert store.put_if_match("k", b"x", '"e1"') == '"e2"'
    assert len(slept) == 2


def test_stub_409_then_412_is_a_clean_loss() -> None:
    """After a 409 (nothing written), a 412 on retry is an honest PreconditionFailed."""
    store, stub, _ = stubbed()
    stub.add_client_error("put_object", "ConditionalRequestConflict", http_status_code=409)
    stub.add_client_error("put_object", "PreconditionFailed", http_status_code=412)
    with stub, pytest.raises(PreconditionFailed):
        store.put_if_absent("k", b"x")


def test_stub_500_then_412_is_an_unknown_outcome() -> None:
    """After a 500 (may have applied), a 412 on retry may be our own write: unknown."""
    store, stub, _ = stubbed()
    stub.add_client_error("put_object", "InternalError", http_status_code=500)
    stub.add_client_error("put_object", "PreconditionFailed", http_status_code=412)
    with stub, pytest.raises(StoreUnavailable, match="re-read the key") as info:
        store.put_if_absent("k", b"x")
    assert info.value.may_have_applied
    assert isinstance(info.value.__cause__, PreconditionFailed)


def test_stub_retries_are_bounded() -> None:
    """Endless throttling ends in StoreUnavailable after max_attempts, chained to boto."""
    store, stub, slept = stubbed(max_attempts=3)
    for _ in range(3):
        stub.add_client_error("get_object", "SlowDown", http_status_code=503)
    with stub, pytest.raises(StoreUnavailable, match="gave up after 3") as info:
        store.get("k")
    assert len(slept) == 2
    assert isinstance(info.value.__cause__.__cause__,  # type: ignore[union-attr]
                      botocore.exceptions.ClientError)


@pytest.mark.parametrize(("code", "status"), [("AccessDenied", 403),
                                              ("InvalidArgument", 400)])
def test_stub_permanent_errors_are_not_retried(code: str, status: int) -> None:
    """Access denied and bad requests fail at once as ObjectStoreError, not retryable."""
    store, stub, slept = stubbed()
    stub.add_client_error("put_object", code, http_status_code=status)
    with stub, pytest.raises(ObjectStoreError) as info:
        store.put("k", b"x")
    assert not isinstance(info.value, StoreUnavailable)
    assert slept == []


class FakeClient:
    """Raises the queued botocore exceptions (Stubber cannot raise transport errors)."""

    def __init__(self, *outcomes: BaseException | dict[str, Any]) -> None:
        self.outcomes = list(outcomes)
        self.calls: list[dict[str, Any]] = []

    def put_object(self, **params: Any) -> dict[str, Any]:
        self.calls.append(params)
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def client_error(code: str, status: int) -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError(
        {"Error": {"Code": code, "Message": code},
         "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")


def test_read_timeout_then_412_is_an_unknown_outcome() -> None:
    """A read timeout may hide our own write: the retry's 412 is not reported as a loss."""
    client = FakeClient(botocore.exceptions.ReadTimeoutError(endpoint_url="http://x"),
                        client_error("PreconditionFailed", 412))
    store = S3Store("bkt", client=client, sleep=lambda s: None)
    with pytest.raises(StoreUnavailable) as info:
        store.put_if_absent("k", b"x")
    assert info.value.may_have_applied
    assert [c["IfNoneMatch"] for c in client.calls] == ["*", "*"]


def test_connection_closed_then_success_returns_the_etag() -> None:
    """A retried conditional write that succeeds is a success (the first did not apply)."""
    client = FakeClient(botocore.exceptions.ConnectionClosedError(endpoint_url="http://x"),
                        {"ETag": '"e9"'})
    store = S3Store("bkt", client=client, sleep=lambda s: None)
    assert store.put_if_match("k", b"x", '"e8"') == '"e9"'


def test_no_credentials_is_a_clear_permanent_error() -> None:
    """Missing credentials say what to set."""
    client = FakeClient(botocore.exceptions.NoCredentialsError())
    store = S3Store("bkt", client=client, sleep=lambda s: None)
    with pytest.raises(ObjectStoreError, match="AWS_ACCESS_KEY_ID") as info:
        store.put("k", b"x")
    assert not isinstance(info.value, StoreUnavailable)


def test_boto3_is_imported_lazily() -> None:
    """Importing sinks.objstore (and using local stores) does not import boto3."""
    code = ("import sys, tempfile; from sinks.objstore import open_store; "
            "open_store('file://' + tempfile.mkdtemp()).put('k', b'x'); "
            "assert 'boto3' not in sys.modules and 'botocore' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True,
                   cwd=Path(__file__).resolve().parents[3])


def test_missing_boto3_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without boto3, building an S3Store says which extra to install."""
    monkeypatch.setitem(sys.modules, "boto3", None)
    with pytest.raises(ImportError, match=r"cdc-agent\[s3\]"):
        S3Store("bkt")
