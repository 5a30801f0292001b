"""``cdc-agent demo``: concurrent writers on an in-memory store, then verified replay.

Writers run random, overlapping write batches through the Agent; the store's state is
captured at every quiescence point; then the log is read back from its destination and
replayed, and every quiescent snapshot must equal the captured state bit for bit.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from agent._agent import Agent
from agent._cli_progress import Progress
from agent._cli_sink import add_sink_arguments, sink_config
from agent._config import Config, ConfigError
from agent._logging import configure_logging
from agent._store import MemoryStore
from agent._workload import Workload
from replay import Assembler, InconsistentLog
from sinks import Sink
from sinks.codec import encode_value

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo", help="run concurrent writers through the agent, then verify the replay",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=8, help="writer threads (default 8)")
    parser.add_argument("--batches", type=int, default=2000,
                        help="write batches per writer (default 2000)")
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    add_sink_arguments(parser)
    parser.add_argument("--postgres", metavar="DSN", default=None,
                        help="run the writers against PostgreSQL and replicate into "
                             "<dbname>_replica instead")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    parser.set_defaults(run=run)


@dataclass
class Destination:
    """Where the demo's log goes, and how to read it back from there."""

    uri: str
    sink: Sink
    read_back: Callable[[], Iterable[Any]]


def open_destination(config: Config) -> Destination:
    """The configured sink, refusing a wal3 log that already holds records (the demo's
    check compares the whole log with what this run captured)."""
    kind = config.sink["kind"]
    if kind == "memory":
        sink = config.open_sink()
        return Destination(config.describe_sink(), sink,
                           lambda: sink.records)  # type: ignore[attr-defined]
    if kind != "wal3":
        if kind != "kafka":
            config.open_sink()  # raises the ConfigError naming the kinds there are
        raise ConfigError(f"the demo reads back memory and wal3 logs, not [sink] kind = "
                          f"{kind!r} (for Kafka, see `cdc-agent tail kafka`)")
    if str(config.sink["uri"]).startswith("memory:"):
        raise ConfigError("use --log memory:// (a memory sink) rather than a wal3 log on "
                          "memory://, which the demo could not read back after a run")
    from sinks.wal3 import read_log

    _refuse_non_empty(config)
    sink = config.open_sink()
    uri, endpoint_url = config.sink["uri"], config.sink.get("endpoint_url")
    prefix = config.sink.get("prefix", "")
    return Destination(config.describe_sink(), sink,
                       lambda: read_log(uri, prefix=prefix, endpoint_url=endpoint_url))


def _refuse_non_empty(config: Config) -> None:
    from sinks.wal3 import LogReader, Wal3Error

    try:
        manifest = LogReader(config.sink["uri"], config.sink.get("prefix", ""),
                             endpoint_url=config.sink.get("endpoint_url")).manifest()
    except (Wal3Error, ValueError):  # no log there yet (or nothing to read): fine
        return
    records = manifest.next_offset - manifest.oldest_offset
    if records > 0 or manifest.oldest_offset > 1:
        raise ConfigError(f"{config.describe_sink()} already holds a log ({records:,} records); "
                          "the demo verifies the whole log against one run, so give --log "
                          "a new location (or remove that log first)")


def run(args: argparse.Namespace) -> int:
    configure_logging(args.verbose)
    if args.threads < 1 or args.batches < 1:
        print("cdc-agent demo: --threads and --batches must be at least 1", file=sys.stderr)
        return 2
    if args.postgres:
        from agent._demo_postgres import run_postgres_demo

        status: int = run_postgres_demo(args.postgres, threads=args.threads,
                                        batches=args.batches, seed=args.seed)
        return status
    config = sink_config(args, "demo")
    destination = open_destination(config)
    store = MemoryStore()
    captured: dict[tuple[int, int], dict[Any, bytes]] = {}

    def capture(marker: Any) -> None:
        captured[(marker.domain_id, marker.epoch_seq)] = _bits(store.snapshot())

    agent = Agent(store, destination.sink, on_quiescence=capture, **config.agent)
    print(f"cdc-agent demo: {args.threads} writers x {args.batches} batches, "
          f"log at {destination.uri}", file=sys.stderr)
    started = time.perf_counter()
    total = args.threads * args.batches
    with Progress("writing", lambda: f"{agent.stats['batches']:,} of about {total:,} "
                                      "write batches"):
        Workload(threads=args.threads, batches=args.batches, seed=args.seed).run(agent)
        agent.close()
    write_seconds = time.perf_counter() - started
    stats = dict(agent.stats)

    started = time.perf_counter()
    progress = Progress("verifying", lambda: f"{verified_so_far[0]:,} of "
                                             f"{len(captured):,} snapshots")
    verified_so_far = [0]
    with progress:
        verified, problem = _verify(destination.read_back(), captured, _bits(store.snapshot()),
                                    verified_so_far)
    replay_seconds = time.perf_counter() - started
    print(f"events            {stats['events']:>12,}")
    print(f"write batches     {stats['batches']:>12,}")
    print(f"epochs            {stats['epochs']:>12,}")
    print(f"quiescence points {stats['quiescence_points']:>12,}")
    print(f"snapshots verified{verified:>12,}")
    print(f"capture           {stats['events'] / write_seconds:>12,.0f} events/s "
          f"({write_seconds:.2f} s)")
    print(f"replay            {stats['events'] / max(replay_seconds, 1e-9):>12,.0f} events/s "
          f"({replay_seconds:.2f} s)")
    print(f"log               {destination.uri}")
    if problem:
        print(f"MISMATCH: {problem}", file=sys.stderr)
        return 1
    print("OK: every quiescent snapshot equals the store's state, bit for bit")
    return 0


def _bits(state: dict[Any, Any]) -> dict[Any, bytes]:
    return {cell: encode_value(value) for cell, value in state.items()}


def _verify(records: Iterable[Any], captured: dict[tuple[int, int], dict[Any, bytes]],
            final: dict[Any, bytes], counter: list[int]) -> tuple[int, str | None]:
    """Replay ``records``; return (snapshots verified, first problem or None);
    ``counter[0]`` follows the count for progress reports."""
    verified = 0
    last: dict[Any, bytes] | None = None
    try:
        for snap in Assembler().replay(records):
            state = _bits(snap.state)
            expected = captured.get((snap.domain_id, snap.epoch_seq))
            if expected is None:
                return verified, f"replay produced epoch {snap.epoch_seq}, never captured"
            if state != expected:
                return verified, f"snapshot at epoch {snap.epoch_seq} differs from the store's"
            verified += 1
            counter[0] = verified
            last = state
    except InconsistentLog as exc:
        return verified, f"the log is inconsistent: {exc}"
    if verified != len(captured):
        return verified, f"{len(captured)} quiescence points captured, {verified} replayed"
    if last != final:
        return verified, "the final replayed state differs from the store's"
    return verified, None
