"""``cdc-agent tail kafka``: print changesets of a Kafka topic as they become consistent.

One JSON object per line and per quiescence point:

    {"domain": "<hex>", "epoch": 12, "position": "<token>", "events": 7,
     "changes": [{"table": "t", "row": 1, "column": "c", "before": ..., "after": ...}]}

Values use the Debezium encoding's JSON mapping (docs/kafka.md): ``null`` is a stored
null; a change has no ``before`` when the cell was created and no ``after`` when it was
removed. Offsets are committed for ``--group`` at each quiescence point.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from agent._logging import configure_logging

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add ``tail kafka`` to the ``cdc-agent`` parser."""
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


def run_kafka(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Follow the topic, printing each changeset; exit 1 with a message on an error."""
    from replay import InconsistentLog
    from replay.kafka import consume_consistent
    from sinks import SinkError

    configure_logging(args.verbose)
    out = out or sys.stdout
    try:
        for changeset in consume_consistent(
                args.bootstrap, args.topic, group_id=args.group, position=args.position,
                encoding=args.encoding, until_end=args.until_end,
                commit_every=args.commit_every, startup_timeout=args.startup_timeout):
            out.write(json.dumps(changeset_json(changeset), ensure_ascii=False) + "\n")
            out.flush()
    except (InconsistentLog, SinkError, ValueError) as exc:
        print(f"cdc-agent tail kafka: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def changeset_json(changeset: Any) -> dict[str, Any]:
    """The JSON-ready form of a ``replay.Changeset``."""
    from sequencer import ABSENT
    from sinks.kafka._debezium import encode_key, encode_value

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
