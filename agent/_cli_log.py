"""``cdc-agent log inspect|scrub|verify|gc|checkpoint|compact URI``: look after a wal3 log.

- ``inspect``: the manifest at a glance (offsets, setsums, snapshot tree, cursors, GC).
- ``scrub``: read every snapshot and fragment and check every setsum and invariant.
- ``verify``: scrub, then replay the log through the Assembler (counts, setsums, the
  cancel-out check at every quiescence point).
- ``gc``: write a checkpoint at the lowest cursor, then run (or resume) a three-phase
  garbage collection below it: a new consumer or ``verify`` starts from the checkpoint.
- ``checkpoint``: write a checkpoint (the state at the lowest cursor, or ``--at``).
- ``compact``: every cursor is a retained point: a checkpoint at the lowest, one stripe
  of net changes between each two, the fragments below the newest collected.

URIs: a folder (``file:///dir`` or a plain path), ``s3://bucket/prefix`` (with
``--endpoint-url`` for S3-compatible servers). Progress goes to stderr; the exit status
is 1 when a problem is found, 2 when the log cannot be opened.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from agent._cli_progress import Progress
from agent._config import uri_from_path
from agent._logging import configure_logging
from sinks import redact

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add ``cdc-agent log ...`` to the parser."""
    parser = subparsers.add_parser(
        "log", help="inspect, scrub, verify or garbage-collect a wal3 log",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="log_command", metavar="ACTION", required=True)
    for name, run, help_text in (
        ("inspect", _inspect, "summarise the manifest"),
        ("scrub", _scrub, "check every snapshot and fragment against the setsums"),
        ("verify", _verify, "scrub, then replay the log through the Assembler"),
        ("gc", _gc, "checkpoint at the lowest cursor, then garbage-collect below it"),
        ("checkpoint", _checkpoint, "write a checkpoint beside the log"),
        ("compact", _compact, "compact the log against its cursors, then collect"),
    ):
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("uri", metavar="URI",
                         help="the log: a folder (path or file:///dir) or s3://bucket/prefix")
        sub.add_argument("--endpoint-url", default=None, help="S3 endpoint for s3:// URIs")
        sub.add_argument("--prefix", default="", help="the log's prefix inside the store")
        sub.add_argument("-v", "--verbose", action="store_true", help="log details to stderr")
        if name == "inspect":
            sub.add_argument("--json", action="store_true", help="print JSON")
        if name == "gc":
            sub.add_argument("--keep-at-least", type=int, default=None, metavar="OFFSET",
                             help="collect only below this offset too (needed if no cursor)")
        if name == "checkpoint":
            sub.add_argument("--at", type=int, default=None, metavar="OFFSET",
                             help="the offset it stands for (default: the lowest cursor, "
                                  "else the log's end)")
        sub.set_defaults(run=run)


def _open(args: argparse.Namespace) -> Any:
    from sinks.wal3 import LogReader

    configure_logging(args.verbose)
    args.uri = uri_from_path(args.uri)  # a plain path means that folder
    return LogReader(args.uri, args.prefix, endpoint_url=args.endpoint_url)


def _fail_open(args: argparse.Namespace, exc: Exception) -> int:
    # Errors that already name the log are printed as they are, the rest get its URI.
    where = "" if str(args.uri) in str(exc) else f"cannot open {args.uri}: "
    print(redact(f"cdc-agent log {args.log_command}: {where}{exc}"), file=sys.stderr)
    return 2


def _inspect(args: argparse.Namespace) -> int:
    from sinks.wal3 import CursorStore, GarbageCollector, Wal3Error

    try:
        reader = _open(args)
        manifest = reader.manifest(check=False)  # inspect reports its problems
        cursors = CursorStore(reader.store)
        positions = {name: w.cursor.position for name in cursors.list()
                     if (w := cursors.load(name)) is not None}
        garbage, _ = GarbageCollector(reader.store).load_garbage()
        state = _state_summary(reader, manifest)
    except (Wal3Error, ValueError) as exc:
        return _fail_open(args, exc)
    problems = manifest.problems()
    depths = Counter(s.depth for s in manifest.snapshots)
    info = {
        "log": reader.store.describe(),
        "writer": manifest.writer,
        "sealed": manifest.sealed,
        "oldest_offset": manifest.oldest_offset,
        "next_offset": manifest.next_offset,
        "next_seq_no": manifest.next_seq_no,
        "records": manifest.next_offset - manifest.oldest_offset,
        "acc_bytes": manifest.acc_bytes,
        "setsum": manifest.setsum.hexdigest(),
        "collected": manifest.collected.hexdigest(),
        "snapshot_pointers": {str(d): n for d, n in sorted(depths.items())},
        "root_fragments": len(manifest.fragments),
        "cursors": positions,
        "gc_in_progress": not garbage.is_empty(),
        "state": state,
        "manifest_problems": problems,
    }
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        for key, value in info.items():
            print(f"{key:<18} {value}")
    return 1 if problems else 0


def _state_summary(reader: Any, manifest: Any) -> dict[str, Any] | None:
    """The published checkpoint and stripes at a glance (None: there are none)."""
    from sinks.wal3 import load_state_index

    index = load_state_index(reader.store, manifest)
    if index is None:
        return None
    return {"index": index.path, "retained_points": index.points,
            "checkpoint_cells": index.entries[0].cells,
            "stripe_cells": [e.cells for e in index.entries[1:]],
            "bytes": sum(e.num_bytes for e in index.entries)}


def _progress(started: float) -> Any:
    def report(rep: Any) -> None:
        print(f"  ... {rep.fragments:,} fragments, {rep.records:,} records "
              f"({time.perf_counter() - started:.1f} s)", file=sys.stderr)
    return report


def _run_scrub(args: argparse.Namespace) -> tuple[Any, int]:
    from sinks.wal3 import Wal3Error

    try:
        reader = _open(args)
        print(f"scrubbing {reader.store.describe()}", file=sys.stderr)
        report = reader.scrub(raise_on_problem=False, progress=_progress(time.perf_counter()))
    except (Wal3Error, ValueError) as exc:
        return None, _fail_open(args, exc)
    print(f"log               {report.log}")
    print(f"offsets           [{report.oldest_offset}, {report.next_offset})")
    print(f"snapshots read    {report.snapshots:,}")
    print(f"fragments read    {report.fragments:,}")
    print(f"records           {report.records:,}")
    print(f"bytes             {report.bytes:,}")
    print(f"setsum            {report.manifest_setsum}")
    if not report.problems:  # the checkpoint and stripes of a sound log
        report.problems += _state_problems(reader)
    for problem in report.problems:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    return report, 1 if report.problems else 0


def _state_problems(reader: Any) -> list[str]:
    """Check the published checkpoint and stripes: each object against its hash and
    setsums, the state setsum along the chain, and the replaced-records accounting."""
    from sinks.wal3 import Wal3Error, check_accounting, iter_state_deltas, load_state_index

    try:
        manifest = reader.manifest()
        index = load_state_index(reader.store, manifest)
        if index is None:
            return []
        deltas = list(iter_state_deltas(reader.store, index))
        check_accounting(reader, manifest, index)
    except Wal3Error as exc:
        return [str(exc)]
    print(f"checkpoint        offset {index.entries[0].hi}, {index.entries[0].cells:,} cells; "
          f"{len(deltas) - 1} stripe(s) up to offset {index.limit}")
    return []


def _scrub(args: argparse.Namespace) -> int:
    report, status = _run_scrub(args)
    if report is not None and status == 0:
        print("OK: every setsum balances and every invariant holds")
    return status


def _verify(args: argparse.Namespace) -> int:
    from replay import Assembler, InconsistentLog
    from sinks.codec import CodecError
    from sinks.wal3 import Wal3Error, read_log

    report, status = _run_scrub(args)
    if report is None or status:
        return status
    print("replaying through the Assembler", file=sys.stderr)
    changesets = events = 0
    assembler = Assembler()
    try:
        with Progress("replaying", lambda: f"{changesets:,} changesets, {events:,} events"):
            for changeset in assembler.changesets(
                    read_log(args.uri, prefix=args.prefix, endpoint_url=args.endpoint_url,
                             runs=True)):
                changesets += 1
                events += changeset.event_count
    except (InconsistentLog, CodecError, Wal3Error) as exc:
        print(f"PROBLEM: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"changesets        {changesets:,}")
    print(f"events            {events:,}")
    print(f"domains           {len(list(assembler.position))}")
    print(f"position          {assembler.position}")
    print("OK: scrub clean and every quiescence point replays consistently")
    return 0


def _gc(args: argparse.Namespace) -> int:
    from replay import collect_log

    outcome = _open_and_run(args, lambda store: collect_log(store, args.keep_at_least,
                                                            prefix=args.prefix))
    if isinstance(outcome, int):
        return outcome
    reader, compaction = outcome
    report = compaction.gc
    if report is None:
        print(f"nothing to collect: {_why_nothing(reader, None)}")
        return 0
    print(f"checkpoint        offset {compaction.points[0]}, "
          f"{compaction.checkpoint_cells:,} cells ({compaction.index})")
    if report.garbage is None:
        print(f"nothing to collect: {_why_nothing(reader, report.cutoff)}")
        return 0
    garbage = report.garbage
    print(f"cutoff            {report.cutoff}")
    print(f"first kept offset {garbage.first_to_keep}")
    print(f"fragments dropped {garbage.fragments_to_drop_limit - garbage.fragments_to_drop_start}")
    print(f"snapshots dropped {len(garbage.snapshots_to_drop)}")
    print(f"objects deleted   {report.deleted}")
    if not report.applied:
        print("the manifest moved on; the collection was abandoned, nothing deleted",
              file=sys.stderr)
        return 1
    return 0


def _open_and_run(args: argparse.Namespace,
                  action: Callable[[Any], Any]) -> tuple[Any, Any] | int:
    """Open the log and run ``action`` on its object store: ``(reader, result)``, or the
    exit status after saying what failed (2: no log to open, 1: the step failed)."""
    from replay import InconsistentLog
    from sinks.codec import CodecError
    from sinks.wal3 import Wal3Error

    try:
        reader = _open(args)
    except (Wal3Error, ValueError) as exc:
        return _fail_open(args, exc)
    try:
        return reader, action(reader.store.store)
    except (Wal3Error, ValueError, InconsistentLog, CodecError) as exc:
        print(redact(f"cdc-agent log {args.log_command}: {type(exc).__name__}: {exc}"),
              file=sys.stderr)
        return 1


def _checkpoint(args: argparse.Namespace) -> int:
    return _state_command(args, "checkpoint")


def _compact(args: argparse.Namespace) -> int:
    return _state_command(args, "compact")


def _state_command(args: argparse.Namespace, what: str) -> int:
    from replay import checkpoint_log, compact_log

    outcome = _open_and_run(args, lambda store: (
        checkpoint_log(store, args.at, prefix=args.prefix) if what == "checkpoint"
        else compact_log(store, prefix=args.prefix)))
    if isinstance(outcome, int):
        return outcome
    report = outcome[1]
    print(f"retained points   {report.points}")
    print(f"checkpoint cells  {report.checkpoint_cells:,}")
    if report.stripe_cells:
        print(f"stripe cells      {report.stripe_cells}")
    print(f"events replaced   {report.events_replaced:,} in {report.records_replaced:,} records")
    print(f"bytes written     {report.bytes_written:,}")
    print(f"index             {report.index}")
    if report.gc is not None:
        garbage = report.gc.garbage
        freed = 0 if garbage is None else (garbage.fragments_to_drop_limit
                                           - garbage.fragments_to_drop_start)
        print(f"fragments freed   {freed}")
        print(f"objects deleted   {report.gc.deleted}")
    return 0


def _why_nothing(reader: Any, cutoff: int | None) -> str:
    """Why a collection found nothing: no cutoff, or nothing wholly below it."""
    if cutoff is None:
        return ("the log has no cursor, so no record is known to be read by everyone; "
                "once every reader has passed an offset, collect below it with "
                "--keep-at-least OFFSET (or give the readers cursors)")
    oldest = reader.manifest().oldest_offset
    return (f"the cutoff is offset {cutoff} (the lowest cursor, or --keep-at-least) and no "
            f"whole fragment lies below it (the log starts at {oldest}); collection frees "
            "whole fragments only, so wait until the readers move on")
