"""Credentials inside URLs never reach a message (issue 10.9)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sinks._redact import redact
from sinks.objstore import S3Store, StoreUnavailable, open_store

ROOT = Path(__file__).parents[3]
SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCY"
userinfo_text = st.text(st.characters(blacklist_characters="/@ \t\n\r'\"<>",
                                      blacklist_categories=("Cs", "Z", "Cc")), min_size=1)


@given(key=userinfo_text, secret=userinfo_text)
def test_redact_hides_any_userinfo_and_keeps_the_rest(key: str, secret: str) -> None:
    """Whatever the user-info holds, it is gone; scheme, host and path stay."""
    for url in (f"s3://{key}:{secret}@bucket/prefix", f"http://{key}:{secret}@minio:9000/x"):
        shown = redact(f"cannot open {url!r}: refused")
        assert f"{key}:{secret}@" not in shown
        assert shown.endswith("/prefix': refused") or shown.endswith("9000/x': refused")
        assert "://***@" in shown


def test_redact_leaves_urls_without_credentials_alone() -> None:
    text = "put 'k' in s3://bucket/p/ via http://127.0.0.1:9000 (user@example.com)"
    assert redact(text) == text


def test_s3_uri_credentials_are_used_and_never_shown() -> None:
    """s3://KEY:SECRET@bucket/prefix: the bucket is the host; the key pair goes to the
    client; describe() and every error quote the URI without it."""
    store = open_store(f"s3://AKIAEXAMPLE:{SECRET}@my-bucket/cdc",
                       endpoint_url="http://127.0.0.1:9")
    assert isinstance(store, S3Store)
    assert store.bucket == "my-bucket" and store.describe() == "s3://my-bucket/cdc/"
    credentials = store.client._request_signer._credentials
    assert (credentials.access_key, credentials.secret_key) == ("AKIAEXAMPLE", SECRET)
    with pytest.raises(ValueError) as info:
        open_store(f"s3://AKIAEXAMPLE:{SECRET}@/cdc")
    assert SECRET not in str(info.value) and "name the bucket" in str(info.value)
    with pytest.raises(ValueError) as info:
        open_store(f"s3://AKIAEXAMPLE:{SECRET}@bucket/cdc?x=1")
    assert SECRET not in str(info.value)


def test_an_endpoint_url_with_a_password_is_redacted_in_errors() -> None:
    """botocore quotes the endpoint URL when it cannot connect: the password goes."""
    store = open_store("s3://bucket/cdc", endpoint_url=f"http://minio:{SECRET}@127.0.0.1:9",
                       max_attempts=1, aws_access_key_id="k", aws_secret_access_key="s")
    with pytest.raises(StoreUnavailable) as info:
        store.list("")
    assert SECRET not in str(info.value) and "cannot connect" in str(info.value)
    assert "http://***@127.0.0.1:9" in str(info.value)


def test_the_command_line_never_prints_them() -> None:
    """A demo aimed at an unreachable S3 with credentials in both URLs: one line, exit
    2, neither secret in it."""
    run = subprocess.run(
        [sys.executable, "-m", "agent.cli", "demo", "--batches", "5", "--log",
         f"s3://AKIAEXAMPLE:{SECRET}@bucket/x", "--endpoint-url",
         f"http://minio:{SECRET[::-1]}@127.0.0.1:9"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 2
    assert SECRET not in run.stderr + run.stdout
    assert SECRET[::-1] not in run.stderr + run.stdout
    assert "cannot connect" in run.stderr and "Traceback" not in run.stderr
