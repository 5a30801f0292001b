"""A collected or compacted wal3 log in Spark: it starts from the checkpoint and stripes,
bit for bit with the Python reader (``read_log`` + ``Assembler``) on the same log."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent import Agent, MemoryStore
from agent._workload import Workload
from agent.cli import main
from replay import Assembler, Position, compact_log
from replay.spark import LogReplay, to_state
from sequencer import EpochRecord
from sinks.wal3 import CorruptState, LogReader, Wal3Sink, WriterOptions, read_log
from tests.helpers import bits
from tests.spark._logs import Logged, SharedSink, compose_states

Cell = tuple[str, Any, str]

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


def write_rounds(path: Path, rounds: int = 10, seed: int = 7) -> Logged:
    """Two agents on their own tables of one store, taking turns in flushed rounds (many
    records: offsets for the retained points), the store's state at each point kept."""
    uri = f"file://{path}"
    shared = SharedSink(Wal3Sink(uri, options=WriterOptions(batch_size_records=3)))
    store = MemoryStore()
    logged = Logged(uri, path, {})
    agents = []
    for d in range(2):
        tables = (f"d{d}_items", f"d{d}_users")

        def capture(marker: EpochRecord, tables: tuple[str, ...] = tables) -> None:
            logged.at_quiescence[(marker.domain_id, marker.epoch_seq)] = {
                c: v for c, v in bits(store.snapshot()).items() if c[0] in tables}

        agent = Agent(store, shared, on_quiescence=capture)
        logged.tables[agent.domain_id] = tables
        agents.append((agent, tables))
    for r in range(rounds):
        for d, (agent, tables) in enumerate(agents):
            Workload(threads=2, batches=3, tables=tables, rows=(*range(12), "k", "κ", ""),
                     columns=("a", "b", "c"), seed=seed * 1000 + r * 10 + d).run(agent)
            agent.flush()
    for agent, _ in agents:
        agent.close()
    shared.close()
    shared.sink.close()
    logged.final = bits(store.snapshot())
    return logged


class Compacted:
    def __init__(self, logged: Logged, uri: str, path: Path, points: list[int]) -> None:
        self.logged, self.uri, self.path, self.points = logged, uri, path, points


@pytest.fixture(scope="module")
def compacted(tmp_path_factory: pytest.TempPathFactory) -> Compacted:
    """2 domains; compacted against three points, collected below the newest."""
    base = tmp_path_factory.mktemp("spark-ckpt")
    logged = write_rounds(base / "log")
    copy = base / "compacted"
    shutil.copytree(logged.path, copy)
    uri = f"file://{copy}"
    end = LogReader(uri).manifest().next_offset
    points = [end // 4, end // 2, 3 * end // 4]
    compact_log(uri, points=points)
    assert LogReader(uri).manifest().oldest_offset > 0  # really collected
    return Compacted(logged, uri, copy, points)


@pytest.fixture(scope="module")
def replay(spark: Any, compacted: Compacted) -> Iterator[LogReplay]:
    r = LogReplay(spark, compacted.uri)
    yield r
    r.unpersist()


def _own(logged: Logged, domain_id: int, state: dict[Any, bytes]) -> dict[Any, bytes]:
    return logged.domain_state(domain_id, state)


def test_a_compacted_log_replays_as_the_python_reader_reads_it(
        replay: LogReplay, compacted: Compacted) -> None:
    """Every point the Python reader of the compacted log gives (retained points and the
    raw records' points after them), rebuilt from Spark's changesets, is its state and
    the store's; the final snapshot is the store's."""
    logged = compacted.logged
    assert replay.source.deltas and replay.source.begin == compacted.points[-1]
    python = [(s.domain_id, s.epoch_seq, bits(s.state))
              for s in Assembler().replay(read_log(compacted.uri))]
    # A checkpoint does not say which domain wrote a cell: Spark hands a cell no later
    # event writes out with the checkpoint's last domain, as the Python reader does.
    # Composing per domain, such rows go back to the domain owning the table.
    first = replay._compacted.frontiers[0] if replay._compacted else {}
    rows = []
    for row in replay.changesets().collect():
        row = row.asDict()
        owner = next(d for d, tables in logged.tables.items() if row["table"] in tables)
        if row["_domain"] % (1 << 64) != owner:
            assert row["_epoch"] == first[row["_domain"] % (1 << 64)].epoch_seq
            row.update(_domain=owner, _epoch=first[owner].epoch_seq)
        rows.append(row)
    composed = compose_states(rows)
    checked = 0
    for domain_id, q, state in python:
        truth = _own(logged, domain_id, logged.at_quiescence[(domain_id, q)])
        spark_point = max((d, e) for d, e in composed if d == domain_id and e <= q)
        assert _own(logged, domain_id, composed[spark_point]) == truth, (domain_id, q)
        if checked >= len(logged.tables):  # the checkpoint's first changesets are
            assert _own(logged, domain_id, state) == truth  # empty but the last one
        checked += 1
    assert checked > 10
    assert bits(to_state(replay.snapshot())) == logged.final
    report = replay.verify().collect()  # the raw epochs after the newest retained point
    assert report and all(r["count_ok"] and r["setsum_ok"] for r in report)


def test_snapshot_at_a_retained_point_and_refusals_between(
        replay: LogReplay, compacted: Compacted) -> None:
    """The state at a retained point is the store's; a point the stripes replaced, or one
    before the checkpoint, is refused naming the nearest retained points."""
    logged = compacted.logged
    retained = replay._compacted.retained() if replay._compacted else {}
    domain_id = max(retained, key=lambda d: len(retained[d]))
    points = retained[domain_id]
    assert len(points) >= 2
    at = Position(domain_id, points[1].epoch_seq, points[1].end_id)
    state = to_state(replay.snapshot(at=at))
    assert _own(logged, domain_id, bits(state)) == _own(
        logged, domain_id, logged.at_quiescence[(domain_id, at.epoch_seq)])
    between = [q for d, q in logged.at_quiescence
               if d == domain_id and points[0].epoch_seq < q < points[1].epoch_seq]
    assert between
    with pytest.raises(ValueError, match="not a retained point.*nearest retained point "
                                         f"before it is {domain_id:x}:.*nearest after it"):
        replay.snapshot(at=f"{domain_id:x}:{between[0]:x}:0")
    before = [q for d, q in logged.at_quiescence if d == domain_id
              and q < points[0].epoch_seq]
    assert before
    with pytest.raises(ValueError, match="before the oldest retained point"):
        replay.changesets(start=f"{domain_id:x}:{before[0]:x}:0")


def test_an_altered_checkpoint_is_refused(spark: Any, compacted: Compacted,
                                          tmp_path: Path) -> None:
    """A state object whose bytes changed does not hash to its name: refused on open."""
    copy = tmp_path / "log"
    shutil.copytree(compacted.path, copy)
    checkpoint = next((copy / "state").glob("CHECKPOINT.*"))
    data = bytearray(checkpoint.read_bytes())
    data[-10] ^= 1
    checkpoint.write_bytes(bytes(data))
    with pytest.raises(CorruptState, match="CHECKPOINT"):
        LogReplay(spark, f"file://{copy}")


def test_cli_snapshot_of_a_collected_log(spark: Any, compacted: Compacted, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "state")
    assert main(["spark", "snapshot", compacted.uri, "--out", out]) == 0
    assert "checkpoint" in capsys.readouterr().err
    assert bits(to_state(spark.read.parquet(out))) == compacted.logged.final


def test_a_table_ending_at_a_point_gc_compacted_away_is_refused(
        spark: Any, replay: LogReplay, compacted: Compacted, tmp_path: Path) -> None:
    """A changeset table whose last rows are at a point the collected log no longer
    holds: appending to it is refused naming the domain, the epoch and what to do
    (since=, or a rebuild), before anything is written."""
    from replay.spark import write_changesets

    retained = replay._compacted.retained() if replay._compacted else {}
    domain_id = next(iter(retained))
    gone = min(q for d, q in compacted.logged.at_quiescence if d == domain_id)
    assert gone < retained[domain_id][0].epoch_seq
    path = tmp_path / "changes"
    signed = domain_id - (1 << 64) if domain_id >= 1 << 63 else domain_id
    spark.createDataFrame([(signed, gone)], "_domain long, _epoch long").write.parquet(
        str(path / "run=00000001"))
    with pytest.raises(ValueError, match=f"ends at epoch {gone} of domain {domain_id:016x}, "
                                         "a point `cdc-agent log gc` compacted away.*since="):
        write_changesets(replay, str(path), format="parquet")
    assert [p.name for p in path.iterdir()] == ["run=00000001"]
