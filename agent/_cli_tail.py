"""``cdc-agent tail kafka|wal3``: print changesets of a log as they become consistent.

One JSON object per line and per quiescence point:

    {"domain": "<hex>", "epoch": 12, "position": "<token>", "events": 7,
     "changes": [{"table": "t", "row": 1, "column": "c", "before": ..., "after": ...}]}

Values use the Debezium encoding's JSON mapping (docs/kafka.md): ``null`` is a stored
null; a change has no ``before`` when the cell was created and no ``after`` when it was
removed. Kafka: offsets are committed for ``--group`` at each quiescence point. wal3:
the log is polled for new records; after a restart, ``--position`` with the last line's
``position`` prints only what follows it (the log is replayed from its start to rebuild
the state, quietly). On a log collected below a checkpoint (``cdc-agent log gc``) the
replay starts from the checkpoint and its stripes, as ``read_log`` does (a line on
stderr says so): the first line printed then holds every cell of the checkpoint. A
``--position`` older than the checkpoint, or inside a compacted stripe, is refused
naming the positions a resume may use.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from agent._logging import configure_logging
from sinks import redact

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add ``tail kafka`` and ``tail wal3`` to the ``cdc-agent`` parser."""
    tail = subparsers.add_parser("tail", help="follow a log and print consistent changesets")
    sources = tail.add_subparsers(dest="source", metavar="SOURCE", required=True)
    kafka = sources.add_parser(
        "kafka", help="follow a Kafka topic written by the Kafka sink",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    kafka.add_argument("--bootstrap", required=True, metavar="HOST:PORT",
                       help="Kafka bootstrap servers")
    kafka.add_argument("--topic", required=True, help="the data topic")
    kafka.add_argument("--group", default="cdc-agent-tail",
                       help="consumer group whose offsets are committed (default "
                            "cdc-agent-tail)")
    kafka.add_argument("--encoding", default="native", choices=("native", "debezium"),
                       help="how the topic is encoded (default native)")
    kafka.add_argument("--position", default=None, metavar="TOKEN",
                       help="resume after this position token (default: the group's)")
    kafka.add_argument("--commit-every", type=int, default=100, metavar="N",
                       help="commit offsets after every N changesets printed (and whenever "
                            "waiting for more; default 100)")
    kafka.add_argument("--until-end", action="store_true",
                       help="stop once the topic is read up to where it ended at start")
    kafka.add_argument("--startup-timeout", type=float, default=15.0, metavar="SECONDS",
                       help="fail if no broker answers within this time (default 15)")
    kafka.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    kafka.set_defaults(run=run_kafka)
    wal3 = sources.add_parser(
        "wal3", help="follow a wal3 log (a folder or s3://bucket/prefix)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    wal3.add_argument("uri", metavar="URI",
                      help="the log: a folder (path or file:///dir) or s3://bucket/prefix")
    wal3.add_argument("--endpoint-url", default=None, metavar="URL",
                      help="S3 endpoint for s3:// logs")
    wal3.add_argument("--prefix", default="", help="the log's prefix inside the store")
    wal3.add_argument("--position", default=None, metavar="TOKEN",
                      help="resume after this position token (the last printed line's)")
    wal3.add_argument("--until-end", action="store_true",
                      help="stop at the end of the log instead of waiting for more")
    wal3.add_argument("--poll", type=float, default=1.0, metavar="SECONDS",
                      help="how often to look for new records (default 1)")
    wal3.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    wal3.set_defaults(run=run_wal3)


def run_kafka(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Follow the topic, printing each changeset; exit 1 with a message on an error."""
    from replay import InconsistentLog
    from replay.kafka import consume_consistent
    from sinks import SinkError

    configure_logging(args.verbose)
    out = out or sys.stdout
    printed = 0
    try:
        for changeset in consume_consistent(
                args.bootstrap, args.topic, group_id=args.group, position=args.position,
                encoding=args.encoding, until_end=args.until_end,
                commit_every=args.commit_every, startup_timeout=args.startup_timeout):
            out.write(json.dumps(changeset_json(changeset), ensure_ascii=False) + "\n")
            out.flush()
            printed += 1
    except (InconsistentLog, SinkError, ValueError) as exc:
        print(redact(f"cdc-agent tail kafka: {exc}"), file=sys.stderr)
        # Could not start (no broker, no topic, bad option): 2, like every command;
        # a log that turned out inconsistent or failed midway: 1.
        return 1 if printed or isinstance(exc, InconsistentLog) else 2
    except KeyboardInterrupt:
        return 130
    return 0


def run_wal3(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Follow the log, printing each changeset; exit 1 naming the problem on an
    inconsistent or damaged log."""
    from agent._config import uri_from_path
    from replay import Assembler, Frontier, InconsistentLog
    from sinks.codec import CodecError
    from sinks.wal3 import Wal3Error

    configure_logging(args.verbose)
    if args.poll <= 0:
        print("cdc-agent tail wal3: --poll must be positive", file=sys.stderr)
        return 2
    out = out or sys.stdout
    uri = uri_from_path(args.uri)
    # A position stands for a state this process does not have: replay from the log's
    # start (rebuilding it) and print only what comes after the position.
    applied = Frontier.parse(args.position) if args.position else Frontier.of([])

    def starting(delta: Any) -> None:
        check_position_against(delta, applied)
        if delta.kind == "checkpoint":
            print(f"cdc-agent tail wal3: the log's first records were collected: starting "
                  f"from its checkpoint at offset {delta.hi} (frontier "
                  f"{delta.after or 'empty'})", file=sys.stderr)

    polls = wal3_polls(uri, prefix=args.prefix, endpoint_url=args.endpoint_url,
                       follow=not args.until_end, poll=args.poll, on_state=starting)
    assembler = Assembler()
    try:
        for records in polls:  # each look ends with everything consistent so far printed
            for changeset in assembler.changesets(records):
                done = applied.get(changeset.domain_id)
                if done is not None and changeset.epoch_seq <= done.epoch_seq:
                    continue
                out.write(json.dumps(changeset_json(changeset), ensure_ascii=False) + "\n")
                out.flush()
    except (InconsistentLog, CodecError, Wal3Error) as exc:
        print(redact(f"cdc-agent tail wal3: {type(exc).__name__}: {exc}"), file=sys.stderr)
        return 1
    return 0


def check_position_against(delta: Any, applied: Any) -> None:
    """Raise ``InconsistentLog`` if the resume position ``applied`` (a ``Frontier``)
    cannot continue through ``delta`` (a checkpoint or stripe): it lies before the
    checkpoint (the events after it were collected), or strictly inside the stripe (no
    reader can stand there after compaction)."""
    from replay import Frontier, InconsistentLog

    if next(iter(applied), None) is None:
        return
    before = {p.domain_id: p.epoch_seq for p in Frontier.parse(delta.before)} \
        if delta.before else {}
    after = {p.domain_id: p.epoch_seq for p in Frontier.parse(delta.after)} \
        if delta.after else {}
    for domain_id, seq in after.items():
        mine = applied.get(domain_id)
        at = mine.epoch_seq if mine is not None else 0
        low = before.get(domain_id, 0)
        if delta.kind == "checkpoint" and at < seq:
            raise InconsistentLog(
                f"--position {applied} lies before this log's checkpoint (offset {delta.hi}, "
                f"frontier {delta.after}): the events after it were collected; start "
                "without --position (the first line then holds the checkpoint's every cell)")
        if delta.kind == "stripe" and low < at < seq:
            raise InconsistentLog(
                f"--position {applied} lies inside a compacted stripe (offsets {delta.lo} to "
                f"{delta.hi}, frontier {delta.before or 'the start'} to {delta.after}): "
                "resume from a position at one of its ends")


def wal3_polls(uri: str, *, prefix: str = "", endpoint_url: str | None = None,
               follow: bool = True, poll: float = 1.0,
               on_state: Callable[[Any], None] | None = None) -> Iterator[Iterator[Any]]:
    """One iterator of decoded records per look at the log: first the whole log, then
    (with ``follow``) what was appended since the last look, every ``poll`` seconds.
    Each record comes once: a look starts where the previous manifest ended.

    On a log collected below its checkpoint, the first look yields the checkpoint and
    the stripes (``StateDelta``, each passed to ``on_state`` first), then the records
    after the newest retained point, as ``read_log`` does."""
    from sinks.wal3 import LogReader, load_state_index

    reader = LogReader(uri, prefix, endpoint_url=endpoint_url)
    begin: int | None = None
    while True:
        manifest = reader.manifest()
        if begin is None:
            begin = manifest.oldest_offset
            index = load_state_index(reader.store, manifest)
            if index is not None and manifest.oldest_offset > index.entries[0].lo:
                # The records before the oldest retained point are gone: the state
                # there (and at each later retained point) stands for them.
                yield _from_state(reader, manifest, index, on_state)
                begin = manifest.next_offset
        if manifest.next_offset > begin:
            yield _records(reader, manifest, begin)
            begin = manifest.next_offset
        if not follow:
            return
        time.sleep(poll)


def _from_state(reader: Any, manifest: Any, index: Any,
                on_state: Callable[[Any], None] | None) -> Iterator[Any]:
    from sinks.wal3 import iter_state_deltas

    for delta in iter_state_deltas(reader.store, index):
        if on_state is not None:
            on_state(delta)
        yield delta
    yield from _records(reader, manifest, index.limit)


def _records(reader: Any, manifest: Any, begin: int) -> Iterator[Any]:
    from sinks.codec import decode, records

    for fragment in reader.scan(begin, manifest=manifest):
        for record in reader.fetch(fragment):
            if record.offset >= begin:
                yield from records(decode(record.body))  # a run of epochs: each one


def changeset_json(changeset: Any) -> dict[str, Any]:
    """The JSON-ready form of a ``replay.Changeset``."""
    from sequencer import ABSENT
    from sinks.codec import encode_debezium_key as encode_key
    from sinks.codec import encode_debezium_value as encode_value

    changes = []
    for (table, row, column), after in sorted(changeset.changes.items(), key=repr):
        before = changeset.before.get((table, row, column), ABSENT)
        change: dict[str, Any] = {"table": table, "row": encode_key(row), "column": column}
        if before is not ABSENT:
            change["before"] = encode_value(before)
        if after is not ABSENT:
            change["after"] = encode_value(after)
        changes.append(change)
    return {
        "domain": f"{changeset.domain_id:x}",
        "epoch": changeset.epoch_seq,
        "position": str(changeset.position),
        "events": changeset.event_count,
        "changes": changes,
    }
