"""``cdc-agent spark snapshot|changesets|verify URI --out PATH``: replay a log in Spark.

- ``snapshot``: verify, then write the state at the last quiescence points (or ``--at``)
  as a table; the same position again writes nothing.
- ``changesets``: verify, then append the changesets after what the table holds (up to
  ``--end``): a rerun or a resumed job never writes an interval twice.
- ``verify``: check every epoch; write the per-epoch report to ``--out`` if given.
- ``stream``: keep the changeset table at ``--out`` up to date with a log or topic that
  is still being written (``stream_changesets``: micro-batches end at quiescence points,
  offsets in ``--checkpoint``); ``--once`` applies what is there and stops, otherwise it
  runs until interrupted.

Needs ``cdc-agent[spark]``. Spark runs in local mode (``--master``) unless told
otherwise; ``--conf KEY=VALUE`` passes Spark settings (for Delta Lake: its jars and
``spark.sql.extensions``; for a ``kafka://`` topic: the spark-sql-kafka jars; see
docs/spark.md). Progress goes to stderr; the exit status
is 1 when the log is inconsistent, 2 when it cannot be read or Spark ran out of memory
(one line naming the setting to raise, not the JVM's stack trace).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from typing import Any

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add ``cdc-agent spark ...`` to the parser."""
    parser = subparsers.add_parser(
        "spark", help="replay a wal3 log or Kafka topic in Spark: snapshot, changesets, verify",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="spark_command", metavar="ACTION", required=True)
    for name, help_text in (
        ("snapshot", "write the verified state at a quiescence point as a table"),
        ("changesets", "append the verified changesets after what the table holds"),
        ("verify", "check every epoch of the log in Spark"),
        ("stream", "keep a changeset table up to date with a log or topic being written"),
    ):
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("uri", metavar="URI", help="file:///dir, s3://bucket/prefix, or "
                         "kafka://host:port/topic (a topic written by KafkaSink)")
        sub.add_argument("--encoding", choices=("native", "debezium"), default="native",
                         help="a Kafka topic's encoding (native)")
        sub.add_argument("--out", required=name != "verify", metavar="PATH",
                         help="where to write the table (a path or URL Spark can write)")
        sub.add_argument("--format", choices=("parquet", "delta"), default="parquet")
        sub.add_argument("--prefix", default="", help="the log's prefix inside the store")
        sub.add_argument("--endpoint-url", default=None, help="S3 endpoint for s3:// URIs")
        sub.add_argument("--master", default="local[*]", help="Spark master (local[*])")
        sub.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                         type=_setting, help="a Spark setting (repeatable)")
        if name == "snapshot":
            sub.add_argument("--at", default=None, metavar="TOKEN",
                             help="position token(s) of the quiescence point(s)")
        if name == "changesets":
            sub.add_argument("--end", default=None, metavar="TOKEN",
                             help="stop at these quiescence points (default: the last)")
        if name == "stream":
            sub.add_argument("--checkpoint", required=True, metavar="PATH",
                             help="the query's checkpoint (reuse it to go on after a stop)")
            sub.add_argument("--interval", default="10 seconds",
                             help="the trigger interval (10 seconds)")
            sub.add_argument("--once", action="store_true",
                             help="apply what the log holds now, then stop")
        if name in ("changesets", "stream"):
            sub.add_argument("--style", choices=("before_after", "delta"),
                             default="before_after",
                             help="before/after columns, or Delta's update_preimage/"
                                  "update_postimage rows (keep one per table)")
        sub.set_defaults(run=_run)


def _say(text: str) -> None:
    print(f"cdc-agent spark: {text}", file=sys.stderr, flush=True)


def _setting(item: str) -> tuple[str, str]:
    """``--conf KEY=VALUE``, checked when the command line is read (before Spark starts)."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{item!r} is not KEY=VALUE")
    return key, value


def _session(args: argparse.Namespace) -> tuple[Any, bool]:
    """The SparkSession, and whether we started it (a running one is reused, not stopped)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.errors import PySparkRuntimeError
    from pyspark.sql import SparkSession

    try:  # the thread's active session, else the process's default one
        return SparkSession.active(), False
    except PySparkRuntimeError:
        pass
    from replay.spark import SESSION_SETTINGS

    if args.master.startswith("local"):  # one machine: the driver need not leave loopback
        # (and on a host whose name resolves to loopback Spark would WARN twice, pick
        # another interface's address, and tell the user to set this)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (SparkSession.builder.master(args.master).appName("cdc-agent spark")
               .config("spark.ui.showConsoleProgress", "false"))
    for key, value in SESSION_SETTINGS.items():
        builder = builder.config(key, value)
    for key, value in args.conf:
        builder = builder.config(key, value)
    with _interrupts_wait_for_the_jvm() as interrupted:
        spark = builder.getOrCreate()
    if interrupted.is_set():
        spark.stop()
        raise KeyboardInterrupt
    return spark, True


@contextmanager
def _first_ctrl_c(then: Callable[[], None]) -> Iterator[threading.Event]:
    """While inside: a first Ctrl-C (SIGINT) sets the event and calls ``then``; a second
    raises KeyboardInterrupt at once. The handler found is put back on the way out
    (PySpark's own, if it set one meanwhile, goes: see ``_interrupts_cancel_jobs``).
    Outside the main thread (no signal handlers there) the event is never set."""
    interrupted = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield interrupted
        return

    def on_sigint(signum: int, frame: Any) -> None:
        if interrupted.is_set():
            raise KeyboardInterrupt
        interrupted.set()
        then()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupts_wait_for_the_jvm() -> AbstractContextManager[threading.Event]:
    """Ctrl-C while Spark starts is acted on once it is up (the event is set).

    Interrupted inside PySpark's launch, the JVM outlives us: PySpark removes the folder
    the JVM reports its port in, the JVM's main thread fails there, and its gateway
    thread keeps it running with nobody left to stop it (seen here: a 1g JVM per
    Ctrl-C). A second Ctrl-C quits at once, at that risk."""
    return _first_ctrl_c(
        lambda: _say("interrupted: stopping once Spark is up (Ctrl-C again to quit now)"))


def _run(args: argparse.Namespace) -> int:
    try:
        from replay import InconsistentLog
        from replay.spark import LogReplay  # noqa: F401 (the extra is there)
        from sinks import SinkError
        from sinks.wal3 import Wal3Error
    except ImportError as exc:
        _say(str(exc))
        return 2
    started = time.monotonic()
    _say(f"starting Spark ({args.master})")
    spark, ours = _session(args)
    from py4j.protocol import Py4JError  # (PySpark's, there once a session is)

    _say(f"Spark up in {time.monotonic() - started:.1f} s; reading {args.uri}")
    try:
        if args.spark_command == "stream":
            return _stream(spark, args)
        with _interrupts_cancel_jobs(spark):
            _batch_command(spark, args)
    except InconsistentLog as exc:
        _say(f"INCONSISTENT: {exc}")
        return 1
    except (OSError, ValueError, Wal3Error, SinkError, Py4JError) as exc:  # SinkError: Kafka's
        # The JVM's own failures first: out of heap (said in the error, or the JVM
        # exited with it and the call found no JVM to answer), or the JVM gone.
        ended = _jvm_exit(spark) if isinstance(exc, (ConnectionError, Py4JError)) else None
        ours = ours and ended is None  # (nothing left to stop)
        said = _out_of_memory(str(exc), args) or _jvm_ended(ended, args)
        if said:
            _say(said)
            return 2
        if isinstance(exc, Py4JError):
            raise
        _say(f"cannot replay {args.uri}: {type(exc).__name__}: {exc}")
        return 2
    finally:
        if ours:
            spark.stop()
    _say(f"done in {time.monotonic() - started:.1f} s")
    return 0


def _batch_command(spark: Any, args: argparse.Namespace) -> None:
    """``cdc-agent spark snapshot|changesets|verify``, in ``spark``."""
    from replay.spark import LogReplay, write_changesets, write_state

    replay = LogReplay(spark, args.uri, prefix=args.prefix, endpoint_url=args.endpoint_url,
                       progress=_say, encoding=args.encoding)
    if args.spark_command == "snapshot":
        wrote = write_state(replay, args.out, format=args.format, at=args.at)
        _say(f"state at {replay.frontier(args.at)} "
             f"{'written to' if wrote else 'already in'} {args.out}")
    elif args.spark_command == "changesets":
        rows = write_changesets(replay, args.out, format=args.format, end=args.end,
                                style=args.style)
        _say(f"{rows} changed cells appended to {args.out}")
    else:
        report = replay.verify()
        epochs = report.count()
        _say(f"log is consistent: {epochs} epochs verified")
        if args.out:
            report.write.format(args.format).mode("overwrite").save(args.out)
            _say(f"report written to {args.out}")


@contextmanager
def _interrupts_cancel_jobs(spark: Any) -> Iterator[None]:
    """Ctrl-C (SIGINT) during a batch command ends it as KeyboardInterrupt, cleanly.

    PySpark's own handler calls the JVM from inside the call the main thread is blocked
    in: a reentrant call that fails with Py4JError and logged tracebacks. This one
    cancels Spark's jobs from another thread (again every half second, so a job started
    after the signal goes too); the blocked call then fails, and leaving the block turns
    that failure into KeyboardInterrupt. A second Ctrl-C does not wait for that."""
    left = threading.Event()

    def cancel_jobs() -> None:
        while not left.is_set():
            with suppress(Exception):  # (the session may be stopping)
                spark.sparkContext.cancelAllJobs()
            left.wait(0.5)

    def start_cancelling() -> None:
        threading.Thread(target=cancel_jobs, name="cancel-spark-jobs", daemon=True).start()

    with _first_ctrl_c(start_cancelling) as interrupted:
        try:
            yield
        except Exception:
            if interrupted.is_set():
                raise KeyboardInterrupt from None
            raise
        finally:
            left.set()
    if interrupted.is_set():  # (the signal came after the last job)
        raise KeyboardInterrupt


# Spark's exit status for a JVM that an OutOfMemoryError ended (SparkExitCode.OOM).
_JVM_OUT_OF_MEMORY = 52


def _jvm_exit(spark: Any) -> int | None:
    """The exit status of the session's JVM if it ended (None: running, or not ours to
    see). A JVM that died mid-call takes a moment to be reaped: wait a little."""
    try:  # (a Spark Connect session has no context, nor a JVM of ours)
        proc = getattr(getattr(spark.sparkContext, "_gateway", None), "proc", None)
    except Exception:
        return None
    if proc is None:
        return None
    try:
        return int(proc.wait(timeout=3))
    except subprocess.TimeoutExpired:
        return None


def _jvm_ended(status: int | None, args: argparse.Namespace) -> str:
    """What to say when the JVM ended with ``status`` during the replay ("": it did not)."""
    if status is None:
        return ""
    if status == _JVM_OUT_OF_MEMORY:
        return _out_of_memory("java.lang.OutOfMemoryError", args)
    return (f"Spark's JVM ended (exit status {status}) while replaying {args.uri}: "
            "its own messages above say why")


def _out_of_memory(text: str, args: argparse.Namespace) -> str:
    """What to say when Spark failed with ``text`` because the JVM ran out of heap ("":
    another failure). In local mode the executors share the driver's heap, 1g unless
    ``spark.driver.memory`` says otherwise (a 4M-event log replayed in 1g, measured)."""
    if "java.lang.OutOfMemoryError" not in text:
        return ""
    given = next((value for key, value in args.conf
                  if key.strip() == "spark.driver.memory"), None)
    now = f"it is {given}" if given else "unset here, Spark's default is 1g"
    more = (f"more than {given}" if given else "8g") + " (--conf spark.driver.memory=...)"
    return (f"Spark ran out of memory replaying {args.uri} (spark.driver.memory: {now}; "
            f"in local mode the executors share the driver's heap): start again with "
            f"{more}, or give the executors more memory on a cluster")


def _await(query: Any) -> bool:
    """Wait until ``query`` ends; True if Ctrl-C (SIGINT) came first. PySpark's own
    SIGINT handler calls the JVM from inside the blocked call (a reentrant call that
    fails with Py4JError); this one only sets a flag, seen within a second."""
    if threading.current_thread() is not threading.main_thread():
        query.awaitTermination()  # (signal handlers belong to the main thread)
        return False
    interrupted = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.set())
    try:
        while not query.awaitTermination(1):
            if interrupted.is_set():
                return True
        return False
    finally:
        signal.signal(signal.SIGINT, previous)


def _stream(spark: Any, args: argparse.Namespace) -> int:
    """``cdc-agent spark stream``: run the query (until interrupted, or ``--once``)."""
    from pyspark.errors import StreamingQueryException

    from replay.spark import stream_changesets

    def wrote(batch_id: int, rows: int) -> None:
        _say(f"micro-batch {batch_id}: {rows} changed cells appended to {args.out}")

    query = stream_changesets(
        spark, args.uri, args.out, checkpoint=args.checkpoint, format=args.format,
        style=args.style, prefix=args.prefix, endpoint_url=args.endpoint_url,
        encoding=args.encoding, interval=args.interval, on_batch=wrote, progress=_say,
        once=args.once)
    try:
        if _await(query):  # with --once, the query ends by itself
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        _say("interrupted: stopping (start again with the same --checkpoint to go on)")
    except StreamingQueryException as exc:
        text = str(exc)
        hint = _out_of_memory(text, args)
        if hint:
            _say(hint)
            return 2
        inconsistent = "InconsistentLog" in text
        line = next((x for x in text.splitlines() if "InconsistentLog" in x), text[:500])
        _say(("INCONSISTENT: " if inconsistent else "the stream failed: ") + line.strip())
        return 1 if inconsistent else 2
    finally:
        query.stop()
    return 0
