"""End-to-end 1:1 verification with variable throughput (local filesystem and S3).

A producer appends bursts of random sizes, flushing at random points; a consumer tails
the log concurrently from a named cursor (moved by compare-and-swap). Every record
written must be read exactly once, in order, and the log must scrub clean.
"""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

import pytest

from sinks.objstore import LocalStore, open_store
from sinks.wal3 import CursorStore, LogReader, LogWriter, WriterOptions
from tests.sinks.wal3.test_processes import run_contention


def one_to_one(store: Any, total: int, seed: int) -> None:
    LogWriter.initialize(store)
    rng = random.Random(seed)
    opts = WriterOptions(batch_size_records=rng.choice([16, 64]), max_in_flight=3)
    written: list[bytes] = []
    done = threading.Event()
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            with LogWriter.open(store, options=opts) as writer:
                n = 0
                while n < total:
                    burst = min(total - n, rng.choice([1, 1, 3, 10, 50, 200]))
                    bodies = [b"%08d|" % (n + i) + b"x" * rng.randint(0, 300)
                              for i in range(burst)]
                    futures = writer.submit_many(bodies)
                    written.extend(bodies)
                    n += burst
                    if rng.random() < 0.3:
                        writer.flush()
                    elif rng.random() < 0.3:
                        futures[-1].result(60)
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    producer = threading.Thread(target=produce)
    producer.start()
    cursors = CursorStore(store, writer="consumer")
    witness = cursors.init("consumer", 1)
    reader = LogReader(store)
    seen: list[bytes] = []
    while True:
        finished = done.is_set()
        position = witness.cursor.position
        for record in reader.records(position):
            assert record.offset == len(seen) + 1, "out of order"
            seen.append(record.body)
        witness = cursors.save("consumer", len(seen) + 1, witness)
        if finished:
            break
        done.wait(0.005)  # poll pacing for the tail, not a timing assertion
    producer.join(60)
    assert not errors, errors
    assert seen == written, "the log does not hold exactly the records written, in order"
    assert cursors.require("consumer").cursor.position == total + 1
    assert reader.scrub().records == total


def test_one_to_one_local_filesystem(tmp_path: Path) -> None:
    """Every record written to a local-filesystem log is read back exactly once."""
    one_to_one(LocalStore(tmp_path / "log"), 3000, seed=7)


@pytest.mark.s3
def test_one_to_one_s3(s3_endpoint: str, s3_bucket: str) -> None:
    """The same on S3 (moto): conditional PUTs, listing, 1:1 read-back."""
    one_to_one(open_store(f"s3://{s3_bucket}/e2e", endpoint_url=s3_endpoint), 800, seed=8)


@pytest.mark.s3
@pytest.mark.slow
def test_writer_processes_contend_on_s3(s3_endpoint: str, s3_bucket: str) -> None:
    """Two processes append to one log on S3: If-Match on the manifest keeps every
    acknowledged append exactly once."""
    uri = f"s3://{s3_bucket}/contention"
    store = open_store(uri, endpoint_url=s3_endpoint)
    LogWriter.initialize(store)
    run_contention(uri, store, 2, 40, endpoint=s3_endpoint)
