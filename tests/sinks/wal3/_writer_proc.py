"""A writer process for the multi-process tests: appends and prints what was acknowledged.

    python -m tests.sinks.wal3._writer_proc STORE_URI NAME COUNT CHUNK

prints one line per record, as soon as its append resolves: ``ack OFFSET BODY`` or
``fail BODY ERROR``; then ``done``.
"""

from __future__ import annotations

import sys

from sinks.objstore import open_store
from sinks.wal3 import LogWriter, Wal3Error, WriterOptions


def main(argv: list[str]) -> int:
    uri, name, count, chunk = argv[0], argv[1], int(argv[2]), int(argv[3])
    endpoint = argv[4] if len(argv) > 4 else None
    store = open_store(uri, endpoint_url=endpoint) if endpoint else open_store(uri)
    opts = WriterOptions(batch_size_records=8, max_in_flight=3, max_contention_retries=10_000)
    writer = LogWriter.open(store, options=opts, writer_name=name)
    out = sys.stdout
    for start in range(0, count, chunk):
        bodies = [f"{name}-{i}".encode() for i in range(start, min(count, start + chunk))]
        for body, fut in zip(bodies, writer.submit_many(bodies), strict=True):
            try:
                out.write(f"ack {fut.result(120).offset} {body.decode()}\n")
            except Wal3Error as exc:
                out.write(f"fail {body.decode()} {type(exc).__name__}\n")
        out.flush()
    writer.close()
    out.write("done\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
