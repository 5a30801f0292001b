"""The command line's entry point: version, usage errors."""

from __future__ import annotations

import subprocess
import sys


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], capture_output=True,
                          text=True, timeout=60)


def test_version_is_printed() -> None:
    out = run("--version")
    assert out.returncode == 0 and out.stdout.startswith("cdc-agent ")


def test_no_command_or_an_unknown_one_is_a_usage_error() -> None:
    """Exit status 2 and a usage line naming the commands, not a traceback."""
    for args in ((), ("frobnicate",)):
        out = run(*args)
        assert out.returncode == 2
        assert "usage: cdc-agent" in out.stderr and "Traceback" not in out.stderr


def test_demo_refuses_nonsense_sizes() -> None:
    out = run("demo", "--threads", "0")
    assert out.returncode == 2 and "at least 1" in out.stderr


# -- errors, Ctrl-C, help, gc, tail wal3, progress (issue 11.6) -------------------------

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

ROOT = Path(__file__).parents[2]
WITHOUT = ("import sys; sys.modules[{module!r}] = None; from agent.cli import main; "
           "sys.exit(main(sys.argv[1:]))")


def one_line_failure(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    return out.stderr


@pytest.mark.parametrize(("module", "args", "extra"), [
    ("boto3", ("log", "inspect", "s3://bucket/log"), "cdc-agent[s3]"),
    ("confluent_kafka", ("tail", "kafka", "--bootstrap", "127.0.0.1:1", "--topic", "t"),
     "cdc-agent[kafka]"),
    ("psycopg", ("demo", "--postgres", "host=127.0.0.1"), "cdc-agent[postgres]"),
])
def test_a_missing_extra_is_one_line_naming_it(module: str, args: tuple[str, ...],
                                               extra: str) -> None:
    """Without boto3, confluent-kafka or psycopg: exit 2 and the pip command to run."""
    out = subprocess.run([sys.executable, "-c", WITHOUT.format(module=module), *args],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert f"pip install '{extra}'" in one_line_failure(out)


def test_unreachable_servers_are_one_line() -> None:
    """PostgreSQL and S3 that nobody answers: exit 2, the problem and what to check."""
    err = one_line_failure(run("demo", "--postgres", "host=127.0.0.1 port=9 dbname=x "
                                                     "connect_timeout=5", "--batches", "5"))
    assert "cannot use PostgreSQL" in err and "check the DSN" in err
    err = one_line_failure(run("log", "inspect", "s3://key:secret@bucket/log", "--endpoint-url",
                               "http://127.0.0.1:9"))
    assert "cannot connect" in err


def test_os_errors_are_one_line(tmp_path: Path) -> None:
    """A log under a file, a socket in a missing folder: exit 2 and one line."""
    (tmp_path / "file").write_text("")
    err = one_line_failure(run("demo", "--batches", "5", "--log", str(tmp_path / "file" / "x")))
    assert "Not a directory" in err
    out = run("sidecar", "--socket", str(tmp_path / "missing" / "s.sock"), "--log", "memory://")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert [json.loads(line)["level"] for line in out.stderr.splitlines()][-1] == "error"


@pytest.mark.timeout(90)
def interruptible() -> None:
    """In the child before exec: SIGINT back to its default. A shell runs background jobs
    (a CI runner may be one) with SIGINT ignored, and Python then installs no
    KeyboardInterrupt handler, so the Ctrl-C under test would never arrive."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_exits_130_without_a_traceback(tmp_path: Path) -> None:
    """SIGINT in the middle of a long demo (once it reports progress): status 130."""
    with subprocess.Popen([sys.executable, "-m", "agent.cli", "demo", "--batches", "10000000",
                           "--log", "memory://"], cwd=ROOT, stderr=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True,
                          preexec_fn=interruptible) as proc:
        assert proc.stderr is not None
        try:
            assert "writers x" in proc.stderr.readline()
            progress = proc.stderr.readline()
            assert progress.startswith("  ... writing: ") and "write batches" in progress
            proc.send_signal(signal.SIGINT)
            status = proc.wait(30)
            err = proc.stderr.read()
        finally:
            proc.kill()
    assert status == 130
    assert "Traceback" not in err and "interrupted" in err


def all_parsers() -> list[tuple[str, object]]:
    from agent.cli import build_parser

    found, todo = [], [("cdc-agent", build_parser())]
    while todo:
        name, parser = todo.pop()
        found.append((name, parser))
        for action in parser._actions:  # type: ignore[attr-defined]
            if isinstance(action, argparse._SubParsersAction):
                todo += [(f"{name} {sub}", child) for sub, child in action.choices.items()]
    return found


def test_help_is_plain_text() -> None:
    """No reStructuredText literals (``x``) in any command's --help."""
    parsers = all_parsers()
    assert len(parsers) >= 10
    for name, parser in parsers:
        text = parser.format_help()  # type: ignore[attr-defined]
        assert "``" not in text, name
    out = run("log", "verify", "--help")
    assert out.returncode == 0 and "``" not in out.stdout and "scrub, then replay" in out.stdout


@pytest.fixture
def small_log(tmp_path: Path) -> Path:
    from agent import Agent, MemoryStore
    from agent._workload import Workload
    from sinks.wal3 import open_log_sink

    log = tmp_path / "log"
    agent = Agent(MemoryStore(), open_log_sink(log.as_uri()))
    for seed in range(3):
        Workload(threads=2, batches=20, seed=seed).run(agent)
        agent.flush()
    agent.close()
    return log


def test_gc_with_nothing_to_do_says_why(small_log: Path) -> None:
    """No cursor: it points at --keep-at-least; a cutoff below every whole fragment:
    it says so. Both exit 0 and delete nothing."""
    out = run("log", "gc", str(small_log))
    assert out.returncode == 0
    assert "nothing to collect" in out.stdout and "--keep-at-least" in out.stdout
    out = run("log", "gc", str(small_log), "--keep-at-least", "1")
    assert out.returncode == 0 and "no whole fragment lies below it" in out.stdout


def expected_changesets(log: Path) -> list[dict[str, object]]:
    from agent._cli_tail import changeset_json
    from replay import Assembler
    from sinks.wal3 import read_log

    return [json.loads(json.dumps(changeset_json(c)))
            for c in Assembler().changesets(read_log(log.as_uri()))]


def test_tail_wal3_prints_every_changeset_and_resumes(small_log: Path) -> None:
    """`tail wal3 PATH --until-end` prints the Assembler's changesets as JSON lines;
    `--position` of line k resumes with line k+1."""
    expected = expected_changesets(small_log)
    assert len(expected) > 10
    out = run("tail", "wal3", str(small_log), "--until-end")
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert lines == expected
    k = len(lines) // 2
    out = run("tail", "wal3", small_log.as_uri(), "--until-end", "--position",
              str(lines[k]["position"]))
    assert out.returncode == 0, out.stderr
    assert [json.loads(line) for line in out.stdout.splitlines()] == lines[k + 1:]


@pytest.mark.timeout(90)
def test_tail_wal3_follows_new_records(tmp_path: Path, small_log: Path) -> None:
    """Without --until-end it waits, and prints what is appended later, once."""
    from agent import Agent, MemoryStore
    from sinks.wal3 import open_log_sink

    before = len(expected_changesets(small_log))
    with subprocess.Popen([sys.executable, "-m", "agent.cli", "tail", "wal3", str(small_log),
                           "--poll", "0.1"], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True,
                          preexec_fn=interruptible) as proc:
        assert proc.stdout is not None
        try:
            for _ in range(before):
                proc.stdout.readline()
            agent = Agent(MemoryStore(), open_log_sink(small_log.as_uri()))
            agent.set("late", 1, "c", "appended")
            agent.close()
            line = json.loads(proc.stdout.readline())
            proc.send_signal(signal.SIGINT)
            assert proc.wait(30) == 130
        finally:
            proc.kill()
    assert line["changes"] == [{"table": "late", "row": 1, "column": "c", "after": "appended"}]
    assert len(expected_changesets(small_log)) == before + 1


def test_progress_reports_only_long_work() -> None:
    """A line every interval while the block runs, none for a short block."""
    import io

    from agent._cli_progress import Progress

    out = io.StringIO()
    with Progress("working", lambda: "3 of 4 things", every=0.05, out=out):
        time.sleep(0.3)
    lines = out.getvalue().splitlines()
    assert len(lines) >= 2 and lines[0].startswith("  ... working: 3 of 4 things (")
    quiet = io.StringIO()
    with Progress("working", lambda: "x", every=5, out=quiet):
        pass
    assert quiet.getvalue() == ""
    assert os.environ is not None


def test_ctrl_c_during_a_spark_stream_stops_the_query_cleanly() -> None:
    """``cdc-agent spark stream`` waits in short steps with its own SIGINT handler, which
    only sets a flag (PySpark's calls the JVM from inside the blocked call and the
    command died with a Py4JError): the wait returns True, the previous handler is
    restored, and a query that ends by itself returns False."""
    import os
    import signal

    from agent._cli_spark import _await

    class Query:
        def __init__(self, interrupt_at: int | None) -> None:
            self.calls, self.interrupt_at = 0, interrupt_at

        def awaitTermination(self, timeout: float | None = None) -> bool:
            self.calls += 1
            if self.calls == self.interrupt_at:
                os.kill(os.getpid(), signal.SIGINT)  # handled before this returns
            return self.interrupt_at is None and self.calls == 3

    before = signal.getsignal(signal.SIGINT)
    interrupted = Query(interrupt_at=2)
    assert _await(interrupted) is True and interrupted.calls == 2
    ended = Query(interrupt_at=None)
    assert _await(ended) is False and ended.calls == 3
    assert signal.getsignal(signal.SIGINT) is before


class _EndedJvm:
    """A session's JVM process that ended with ``status`` (``_cli_spark._jvm_exit``)."""

    def __init__(self, status: int) -> None:
        self.status = status

    def wait(self, timeout: float) -> int:
        return self.status


class _SessionOfAnEndedJvm:
    """A SparkSession whose JVM ended with ``status``; records whether it was stopped."""

    def __init__(self, status: int) -> None:
        from types import SimpleNamespace

        self.sparkContext = SimpleNamespace(_gateway=SimpleNamespace(proc=_EndedJvm(status)))
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True


def test_spark_out_of_memory_is_one_line_naming_the_setting(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The JVM running out of heap (seen replaying 4M events with Spark's default 1g)
    ends ``cdc-agent spark`` with exit 2 and a line naming spark.driver.memory, the
    value given if any; any other JVM failure is not called a memory problem."""

    from py4j.protocol import Py4JError

    import agent._cli_spark as cli_spark
    import replay.spark
    from agent.cli import main

    failure = "An error occurred while calling o123.collectToPython.\n: java.lang.Out"
    raised: list[Exception] = []

    class Replay:
        def __init__(self, *args: object, **kwargs: object) -> None:
            raise raised[0]

    monkeypatch.setattr(cli_spark, "_session", lambda args: (object(), False))
    monkeypatch.setattr(replay.spark, "LogReplay", Replay)
    raised.append(Py4JError(failure + "OfMemoryError: Java heap space"))
    assert main(["spark", "verify", "file:///nowhere"]) == 2
    err = capsys.readouterr().err
    assert "ran out of memory" in err and "8g (--conf spark.driver.memory=" in err
    assert "default is 1g" in err and "Java heap space" not in err
    assert main(["spark", "verify", "file:///nowhere", "--conf",
                 "spark.driver.memory=2g"]) == 2
    assert "it is 2g" in (err := capsys.readouterr().err) and "more than 2g" in err
    # In real runs the JVM usually dies of it (exit status 52) and the call only finds
    # no JVM there: said the same way, and the dead session is not stopped again.
    for status, said in ((52, "ran out of memory"), (1, "exit status 1")):
        session = _SessionOfAnEndedJvm(status)
        monkeypatch.setattr(cli_spark, "_session", lambda args, s=session: (s, True))
        raised[0] = ConnectionRefusedError(111, "Connection refused")
        assert main(["spark", "verify", "file:///nowhere"]) == 2
        err = capsys.readouterr().err
        assert said in err and "Connection refused" not in err and not session.stopped
    monkeypatch.setattr(cli_spark, "_session", lambda args: (object(), False))
    raised[0] = Py4JError(failure + "putStreamError")  # not memory: not ours to explain
    assert main(["spark", "verify", "file:///nowhere"]) != 0
    err = capsys.readouterr().err
    assert "Py4JError" in err and "memory" not in err


def test_a_stream_whose_jvm_dies_ends_with_one_line_and_exit_2(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``cdc-agent spark stream`` while the JVM dies (killed, or out of heap): the wait
    finds no JVM, nor does the query's stop; the command says how the JVM ended (exit
    status 137: killed; 52: out of memory), exits 2, and does not stop the dead session."""

    from py4j.protocol import Py4JNetworkError

    import agent._cli_spark as cli_spark
    import replay.spark
    from agent.cli import main

    class DeadQuery:
        def awaitTermination(self, timeout: float | None = None) -> bool:
            raise ConnectionResetError(104, "Connection reset by peer")

        def stop(self) -> None:
            raise Py4JNetworkError("An error occurred while trying to connect to the JVM")

    monkeypatch.setattr(replay.spark, "stream_changesets", lambda *a, **k: DeadQuery())
    stream = ["spark", "stream", "file:///nowhere", "--out", "/nowhere/out",
              "--checkpoint", "/nowhere/checkpoint"]
    for status, said in ((137, "Spark's JVM ended (exit status 137) while replaying "
                               "file:///nowhere"), (52, "ran out of memory")):
        session = _SessionOfAnEndedJvm(status)
        monkeypatch.setattr(cli_spark, "_session", lambda args, s=session: (s, True))
        assert main(stream) == 2
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err and "connect to the JVM" not in err
        assert not session.stopped


def test_the_spark_session_the_command_starts_has_the_replay_settings(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With no session running, ``cdc-agent spark`` starts one with
    ``replay.spark.SESSION_SETTINGS``, the user's ``--conf`` last: whole plans (the 25
    fields Spark prints by default made it WARN in every run), no Python call sites
    recorded per column expression (JVM round trips that slowed every replay), and
    cached plans whose shuffles AQE may coalesce (200 tasks each otherwise). A local
    master's driver binds to loopback unless ``SPARK_LOCAL_IP`` says otherwise."""
    import argparse

    from pyspark.errors import PySparkRuntimeError
    from pyspark.sql import SparkSession

    import agent._cli_spark as cli_spark

    class Builder:
        def __init__(self) -> None:
            self.settings: dict[str, str] = {}

        def master(self, master: str) -> Builder:
            return self

        def appName(self, name: str) -> Builder:
            return self

        def config(self, key: str, value: str) -> Builder:
            self.settings[key] = value
            return self

        def getOrCreate(self) -> dict[str, str]:
            return self.settings

    def no_session() -> None:
        raise PySparkRuntimeError(errorClass="NO_ACTIVE_OR_DEFAULT_SESSION",
                                  messageParameters={})

    monkeypatch.setattr(SparkSession, "active", staticmethod(no_session))
    for master, given, bound in (("spark://spark.example:7077", None, None),
                                 ("local[1]", None, "127.0.0.1"),
                                 ("local[*]", "10.1.2.3", "10.1.2.3")):
        monkeypatch.setattr(SparkSession, "builder", Builder())
        if given is None:
            monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
        else:
            monkeypatch.setenv("SPARK_LOCAL_IP", given)
        cli_spark._session(argparse.Namespace(master=master, conf=[]))
        assert os.environ.get("SPARK_LOCAL_IP") == bound, master  # a local driver: loopback
    debugging = "spark.python.sql.dataFrameDebugging.enabled"
    for conf, fields, debug in (
            ([], "1000", "false"),
            (["spark.sql.debug.maxToStringFields=50", f"{debugging}=true"], "50", "true")):
        monkeypatch.setattr(SparkSession, "builder", Builder())
        settings, ours = cli_spark._session(argparse.Namespace(
            master="local[1]", conf=[cli_spark._setting(item) for item in conf]))
        assert ours and settings["spark.sql.debug.maxToStringFields"] == fields
        assert settings[debugging] == debug
        assert settings["spark.sql.optimizer.canChangeCachedPlanOutputPartitioning"] == "true"


@pytest.mark.parametrize("item", ["nokeyvalue", "=value"])
def test_a_spark_setting_that_is_not_key_value_is_a_usage_error(
        item: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``--conf`` is checked when the command line is read: exit status 2 and the usage
    line naming the setting, before any Spark starts."""
    import agent._cli_spark as cli_spark
    from agent.cli import main

    def no_spark(args: object) -> None:
        raise AssertionError("a session was asked for")

    monkeypatch.setattr(cli_spark, "_session", no_spark)
    with pytest.raises(SystemExit) as exited:
        main(["spark", "verify", "file:///nowhere", "--conf", item])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "usage: cdc-agent spark verify" in err and f"{item!r} is not KEY=VALUE" in err


def test_spark_without_the_extra_names_the_extra() -> None:
    """Without PySpark (and its py4j) installed, ``cdc-agent spark`` says which extra to
    install, exit 2, not a bare ModuleNotFoundError."""
    code = ("import sys; sys.modules['pyspark'] = sys.modules['py4j'] = None\n"
            "from agent.cli import main\n"
            "sys.exit(main(['spark', 'verify', 'file:///nowhere']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2, out.stderr
    assert "cdc-agent[spark]" in out.stderr and "Traceback" not in out.stderr
