"""Raw PUT rate of the object stores: local filesystem vs moto S3 on loopback.

For 4 KiB and 1 MiB objects, measures ``put`` (the baseline), ``put_if_absent`` and
``put_if_match`` on new keys, one thread, and prints ops/s, MB/s and the ratio of each
conditional write to the plain put of the same backend and size (and S3 to local).

    python3 -m bench.objstore_puts [--seconds 2] [--max-ops 2000] [--no-s3]

moto is started here on a free loopback port (one request at a time, like the test
fixture; ``--threaded-moto`` for stock moto_server) and stopped by PID. Figures from
moto measure the client and moto's Python server, not S3: use them to compare our
operations with each other, not to predict AWS throughput.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sinks.objstore import LocalStore, ObjectStore, S3Store

SIZES = {"4KiB": 4 << 10, "1MiB": 1 << 20}
OPS = ("put", "put_if_absent", "put_if_match")


@dataclass
class Result:
    backend: str
    size: str
    op: str
    count: int
    seconds: float
    nbytes: int

    @property
    def rate(self) -> float:
        return self.count / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.count * self.nbytes / self.seconds / 1e6


def measure(store: ObjectStore, backend: str, size: str, op: str, seconds: float,
            max_ops: int, round_: int) -> Result:
    """Run ``op`` on fresh keys until ``seconds`` pass or ``max_ops`` are done."""
    nbytes = SIZES[size]
    data = os.urandom(nbytes)
    base = f"bench/{size}/{op}/{round_}"
    prepare: Callable[[int], str | None] = lambda i: None  # noqa: E731
    if op == "put_if_match":
        # Each CAS replaces an object written beforehand (not timed).
        etags = {i: store.put(f"{base}/{i:08d}", b"seed") for i in range(max_ops)}
        prepare = etags.get
    done = 0
    started = time.perf_counter()
    deadline = started + seconds
    while done < max_ops and time.perf_counter() < deadline:
        key = f"{base}/{done:08d}"
        if op == "put":
            store.put(key, data)
        elif op == "put_if_absent":
            store.put_if_absent(key, data)
        else:
            etag = prepare(done)
            assert etag is not None
            store.put_if_match(key, data, etag)
        done += 1
    return Result(backend, size, op, done, time.perf_counter() - started, nbytes)


def run_backend(store: ObjectStore, backend: str, seconds: float, max_ops: int,
                prepare_cap: int, rounds: int = 3) -> list[Result]:
    """Each case in ``rounds`` short rounds, the operations interleaved, so that disk
    write-back and a busy machine weigh on every operation alike; rounds are summed."""
    results = []
    for size in SIZES:
        totals = {op: Result(backend, size, op, 0, 0.0, SIZES[size]) for op in OPS}
        for round_ in range(rounds):
            for op in OPS:
                cap = min(max_ops, prepare_cap) if op == "put_if_match" else max_ops
                one = measure(store, backend, size, op, seconds / rounds, cap // rounds,
                              round_)
                totals[op].count += one.count
                totals[op].seconds += one.seconds
        results.extend(totals.values())
    return results


def report(results: list[Result]) -> None:
    baseline = {(r.backend, r.size): r for r in results if r.op == "put"}
    local = {(r.size, r.op): r for r in results if r.backend.startswith("local (fsync)")}
    print(f"{'backend':<16} {'size':<5} {'op':<14} {'ops':>6} {'ops/s':>9} {'MB/s':>8} "
          f"{'vs put':>7} {'vs local(fsync)':>16}")
    for r in results:
        vs_put = r.rate / baseline[(r.backend, r.size)].rate
        ref = local.get((r.size, r.op))
        vs_local = f"{r.rate / ref.rate:16.2f}" if ref and ref is not r else ""
        print(f"{r.backend:<16} {r.size:<5} {r.op:<14} {r.count:>6} {r.rate:>9.0f} "
              f"{r.mb_per_s:>8.1f} {vs_put:>7.2f} {vs_local}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="time per case")
    parser.add_argument("--max-ops", type=int, default=2000, help="operations per case")
    parser.add_argument("--no-s3", action="store_true", help="skip moto")
    parser.add_argument("--threaded-moto", action="store_true",
                        help="stock threaded moto_server instead of one request at a time")
    args = parser.parse_args(argv)

    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="objstore-bench-") as tmp:
        root = Path(tmp)
        results += run_backend(LocalStore(root / "fsync"), "local (fsync)", args.seconds,
                               args.max_ops, args.max_ops)
        results += run_backend(LocalStore(root / "nofsync", fsync=False), "local (no fsync)",
                               args.seconds, args.max_ops, args.max_ops)
        if not args.no_s3:
            results += run_s3(root, args.seconds, args.max_ops, args.threaded_moto)
    report(results)


def run_s3(root: Path, seconds: float, max_ops: int, threaded: bool) -> list[Result]:
    from tests.services.s3 import FAKE_CREDENTIALS, start_moto

    os.environ.update(FAKE_CREDENTIALS)
    proc, endpoint = start_moto(root, serial=not threaded)
    try:
        store = S3Store("bench", endpoint_url=endpoint, aws_access_key_id="testing",
                        aws_secret_access_key="testing")
        store.client.create_bucket(Bucket="bench")
        # CAS needs its objects written first; cap them so set-up stays short.
        return run_backend(store, "moto s3", seconds, max_ops, prepare_cap=600)
    finally:
        proc.stop()


if __name__ == "__main__":
    main()
