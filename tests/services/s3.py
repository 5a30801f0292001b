"""Session fixture for the S3 service: moto_server on a free loopback port.

``s3_endpoint`` starts moto's S3-compatible server (PyPI ``moto[server]``) once per
session and yields its URL; ``s3_bucket`` makes a fresh bucket per test. Fake AWS
credentials are set in the environment; nothing ever talks to real AWS.

moto_server is started through this module (``python -m tests.services.s3 PORT``)
so that it serves ONE REQUEST AT A TIME. Stock ``moto_server`` serves requests on
threads and checks If-None-Match / If-Match before writing without a lock, so two
racing conditional PUTs can both succeed (we saw a lost update with a 1 us GIL switch
interval) and concurrent requests sometimes fail with 500s. Serialising requests
makes each conditional PUT atomic, as S3 is; the client code under test is unchanged.
"""

from __future__ import annotations

import os
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.services._proc import ServiceProcess, free_port, wait_for_port

__all__ = ["s3_bucket", "s3_endpoint", "serve", "start_moto"]

FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}
_REPO = Path(__file__).resolve().parents[2]


def serve(port: int, *, serial: bool = True) -> None:
    """Run moto's S3 server on 127.0.0.1:port, one request at a time (see above).

    ``serial=False`` runs stock moto_server (threaded), for comparison only.
    """
    import moto.server

    if not serial:
        moto.server.main(["-H", "127.0.0.1", "-p", str(port)])
        return
    run_simple = moto.server.run_simple  # type: ignore[attr-defined]

    def serial_run_simple(*args: Any, **kwargs: Any) -> None:
        kwargs["threaded"] = False
        run_simple(*args, **kwargs)

    moto.server.run_simple = serial_run_simple  # type: ignore[attr-defined]
    moto.server.main(["-H", "127.0.0.1", "-p", str(port)])


def start_moto(log_dir: Path, timeout: float = 60.0, *, serial: bool = True
               ) -> tuple[ServiceProcess, str]:
    """Start moto on a free loopback port; return the process and its endpoint URL.

    Stop it with ``process.stop()`` (by PID).

    Raises (with the server's log) if it does not answer S3 requests within ``timeout``.
    """
    port = free_port()
    env = {**os.environ, **FAKE_CREDENTIALS, "PYTHONPATH": str(_REPO)}
    proc = ServiceProcess([sys.executable, "-m", "tests.services.s3", str(port),
                           "serial" if serial else "threaded"],
                          log_dir / "moto.log", env=env, cwd=_REPO)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_for_port(port, timeout, proc.proc)
        _client(endpoint).list_buckets()
    except Exception as exc:
        proc.stop()
        raise RuntimeError(f"moto_server did not start on {endpoint}: {exc}\n"
                           f"--- moto.log ---\n{proc.tail()}") from exc
    return proc, endpoint


def _client(endpoint: str) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.session.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing",
        region_name="us-east-1",
    ).client("s3", endpoint_url=endpoint,
             config=Config(retries={"total_max_attempts": 3}, s3={"addressing_style": "path"}))


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """The URL of a moto S3 server on loopback, with fake credentials in the env."""
    patch = pytest.MonkeyPatch()
    for name, value in FAKE_CREDENTIALS.items():
        patch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        patch.delenv(name, raising=False)
    log_dir = Path(tempfile.mkdtemp(prefix="cdc-moto-"))
    proc, endpoint = start_moto(log_dir)
    try:
        yield endpoint
    finally:
        proc.stop()
        patch.undo()


@pytest.fixture
def s3_bucket(s3_endpoint: str) -> Iterator[str]:
    """A fresh, empty bucket on the moto server; emptied and removed after the test."""
    client = _client(s3_endpoint)
    name = f"cdc-test-{uuid.uuid4().hex[:20]}"
    client.create_bucket(Bucket=name)
    try:
        yield name
    finally:
        paginator = client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=name):
            for item in page.get("Contents", ()):
                client.delete_object(Bucket=name, Key=item["Key"])
        client.delete_bucket(Bucket=name)


if __name__ == "__main__":
    serve(int(sys.argv[1]), serial=sys.argv[2:] != ["threaded"])
