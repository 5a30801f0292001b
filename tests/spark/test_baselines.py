"""Baselines (SNAPSHOT chunks) in Spark: a pre-populated store replayed from nothing."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent import Agent, MemoryStore
from replay import Assembler, Frontier, InconsistentLog
from replay.spark import LogReplay, to_state
from sinks import MemorySink
from sinks.codec import SnapshotChunk
from sinks.wal3 import read_log
from tests.helpers import bits
from tests.spark._logs import (
    BaselineLogged,
    Message,
    compose_states,
    messages,
    rewrite,
    write_baseline_log,
)

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

_OWN = {"baseline": ("t", "u"), "other": ("o",)}


@pytest.fixture(scope="module")
def based(tmp_path_factory: pytest.TempPathFactory) -> BaselineLogged:
    return write_baseline_log(tmp_path_factory.mktemp("spark-baseline") / "log", seed=3)


@pytest.fixture(scope="module")
def replay(spark: Any, based: BaselineLogged) -> Iterator[LogReplay]:
    r = LogReplay(spark, based.uri)
    yield r
    r.unpersist()


def _tables(based: BaselineLogged, domain_id: int) -> tuple[str, ...]:
    return _OWN["baseline"] if domain_id == based.baseline_domain else _OWN["other"]


def _own(state: dict[Any, bytes], tables: tuple[str, ...]) -> dict[Any, bytes]:
    return {c: v for c, v in state.items() if c[0] in tables}


def test_a_baseline_replays_to_the_stores_states_and_the_python_assemblers(
        replay: LogReplay, based: BaselineLogged) -> None:
    """From nothing: every quiescence point from the baseline's last chunk on, rebuilt
    from Spark's changesets, is the store's state there and the Python assembler's."""
    b = based.baseline_domain
    assert based.report.chunks > 5
    whole = replay.whole_from(b)
    assert whole == based.report.last_point[0]
    assert replay.whole_from(based.other_domain) is None
    python = {(s.domain_id, s.epoch_seq): bits(s.state)
              for s in Assembler().replay(read_log(based.uri))}
    composed = compose_states(replay.changesets().collect())
    # The baseline domain's first changeset is its whole state at `whole`.
    assert min(q for d, q in composed if d == b) == whole
    checked = python_checked = 0
    for (domain_id, q), truth in based.at_quiescence.items():
        if domain_id == b and q < whole:
            continue
        tables = _tables(based, domain_id)
        state = max(((d, e) for d, e in composed if d == domain_id and e <= q), default=None)
        assert _own(composed[state] if state else {}, tables) == _own(truth, tables), q
        checked += 1
        if (domain_id, q) in python and (domain_id != b or q > whole):
            assert _own(python[(domain_id, q)], tables) == _own(truth, tables)
            python_checked += 1
    assert checked > 20 and python_checked > 10
    final = bits(to_state(replay.snapshot()))
    assert final == based.final
    assert replay.verify().count() > 0


def test_points_after_the_baseline_by_token(replay: LogReplay, based: BaselineLogged) -> None:
    b = based.baseline_domain
    whole = replay.whole_from(b)
    assert whole is not None
    points = sorted(q for d, q in based.at_quiescence if d == b and q >= whole)
    for q in [points[0], *random.Random(4).sample(points, min(3, len(points)))]:
        token = str(replay.epochs.position(b, q))
        state = _own(bits(to_state(replay.snapshot(token))), _OWN["baseline"])
        assert state == _own(based.at_quiescence[(b, q)], _OWN["baseline"]), q


def test_a_point_inside_the_baseline_is_refused(replay: LogReplay,
                                                based: BaselineLogged) -> None:
    """States inside the baseline are partial: asking for one is a clear error."""
    b = based.baseline_domain
    first = replay.baselines.first(b)
    whole = replay.whole_from(b)
    assert first is not None and whole is not None and first.start < whole
    inside = next(q for d, q in sorted(based.at_quiescence) if d == b and first.start <= q < whole)
    token = str(replay.epochs.position(b, inside))
    with pytest.raises(ValueError, match="partial state"):
        replay.snapshot(token)
    with pytest.raises(ValueError, match="partial state"):
        replay.changesets(start=token)


def test_delta_style_changesets(replay: LogReplay, based: BaselineLogged) -> None:
    """style="delta": inserts, deletes and update pre/post images, composing to the same
    states; every update has both images."""
    rows = replay.changesets(style="delta").collect()
    kinds = {r["_change_type"] for r in rows}
    assert kinds == {"insert", "delete", "update_preimage", "update_postimage"}
    pre = sorted((r["_position"], r["table"], bytes(r["row"]), r["column"]) for r in rows
                 if r["_change_type"] == "update_preimage")
    post = sorted((r["_position"], r["table"], bytes(r["row"]), r["column"]) for r in rows
                  if r["_change_type"] == "update_postimage")
    assert pre == post and pre
    plain = replay.changesets().collect()
    olds = {(r["_position"], r["table"], bytes(r["row"]), r["column"]): bytes(r["before"])
            for r in plain}
    for r in rows:
        if r["_change_type"] in ("update_preimage", "delete"):
            assert bytes(r["value"]) == olds[(r["_position"], r["table"], bytes(r["row"]),
                                              r["column"])]
    assert compose_states(rows) == compose_states(plain)
    with pytest.raises(ValueError, match="style"):
        replay.changesets(style="wide")  # type: ignore[arg-type]


# -- faults -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def base(based: BaselineLogged) -> list[Message]:
    return messages(based.uri)


def _open(spark: Any, path: Path, records: list[Message]) -> LogReplay:
    return LogReplay(spark, rewrite(path, records))


def _chunks(records: list[Message]) -> list[int]:
    return [i for i, r in enumerate(records) if isinstance(r, SnapshotChunk)]


def test_duplicated_chunks_are_harmless(spark: Any, tmp_path: Path, base: list[Message],
                                        based: BaselineLogged) -> None:
    chunks = _chunks(base)
    records = [*base, *(base[i] for i in chunks[::2])]
    assert bits(to_state(_open(spark, tmp_path / "log", records).snapshot())) == based.final


def test_an_altered_chunk_is_refused(spark: Any, tmp_path: Path, base: list[Message]) -> None:
    """One cell of one chunk changed (its setsum kept): refused, naming the chunk."""
    i = _chunks(base)[3]
    chunk = base[i]
    assert isinstance(chunk, SnapshotChunk) and len(chunk)
    cells = chunk.cells()
    table, row, column, _ = cells[0]
    cells[0] = (table, row, column, "altered")
    forged = SnapshotChunk.build(chunk.domain_id, chunk.epoch_seq, chunk.end_id,
                                 chunk.baseline_id, chunk.index, chunk.last, chunk.lo,
                                 chunk.hi, cells)
    altered = SnapshotChunk(chunk.domain_id, chunk.epoch_seq, chunk.end_id, chunk.baseline_id,
                            chunk.index, chunk.last, chunk.lo, chunk.hi, forged.data,
                            chunk.cell_count, chunk.setsum)
    replay = _open(spark, tmp_path / "log", [*base[:i], altered, *base[i + 1:]])
    with pytest.raises(InconsistentLog, match=r"snapshot chunk 3 .*setsum") as info:
        replay.snapshot()
    assert info.value.domain_id == chunk.domain_id
    assert info.value.epoch_seq == chunk.epoch_seq


def test_a_lost_chunk_is_refused(spark: Any, tmp_path: Path, base: list[Message]) -> None:
    i = _chunks(base)[2]
    replay = _open(spark, tmp_path / "log", [*base[:i], *base[i + 1:]])
    with pytest.raises(InconsistentLog, match=r"chunk 3 .*chunk 2 was due"):
        replay.snapshot()


def test_a_log_whose_last_chunk_is_missing_has_no_whole_state(
        spark: Any, tmp_path: Path, base: list[Message], based: BaselineLogged) -> None:
    i = _chunks(base)[-1]
    replay = _open(spark, tmp_path / "log", [*base[:i], *base[i + 1:]])
    assert replay.whole_from(based.baseline_domain) == -1
    with pytest.raises(ValueError, match="not in this log yet"):
        replay.snapshot()


def test_without_its_baseline_the_log_is_refused(spark: Any, tmp_path: Path,
                                                 base: list[Message]) -> None:
    """Mutation check of the forgiveness: the same log with its chunks removed breaks on
    a cell the store held before the agent (nothing else forgives it)."""
    records = [r for r in base if not isinstance(r, SnapshotChunk)]
    with pytest.raises(InconsistentLog, match="cell state cannot be rebuilt"):
        _open(spark, tmp_path / "log", records).snapshot()


_X = ("t", 1, "a")
_Y = ("t", 2, "b")


def _tiny(forge: dict[Any, Any] | None = None, *, later: bool = True
          ) -> tuple[list[Message], dict[Any, Any]]:
    """A store holding X = 2 and Y = "x"; X set to 5 before the baseline (a chain the
    log cannot check); with ``later``, X set to 3 and Y deleted after it. ``forge``:
    give a cell another value in its chunk (None: leave it out), setsum recomputed."""
    store = MemoryStore({_X: 2, _Y: "x"})
    sink = MemorySink(keep_messages=True)
    agent = Agent(store, sink)
    agent.set(*_X, 5)
    agent.snapshot(chunk_rows=1)
    if later:
        agent.set(*_X, 3)
        agent.delete(*_Y)
    agent.close()
    records: list[Message] = list(sink.decoded_messages())
    for k, r in enumerate(records):
        if isinstance(r, SnapshotChunk) and forge:
            cells = [(t, row, c, forge.get((t, row, c), v)) for t, row, c, v in r.cells()]
            records[k] = SnapshotChunk.build(
                r.domain_id, r.epoch_seq, r.end_id, r.baseline_id, r.index, r.last, r.lo,
                r.hi, [cell for cell in cells if cell[3] is not _GONE])
    return records, store.snapshot()


_GONE = object()


def test_a_small_baseline_by_hand(spark: Any, tmp_path: Path) -> None:
    records, final = _tiny()
    assert len([r for r in records if isinstance(r, SnapshotChunk)]) == 2
    replay = _open(spark, tmp_path / "log", records)
    assert to_state(replay.snapshot()) == final == {_X: 3}
    assert list(Assembler().replay(records))[-1].state == final


def test_a_chunk_that_leaves_a_cell_out_removes_it(spark: Any, tmp_path: Path) -> None:
    """A chunk is the whole truth of its rows: a cell the events made but the chunk does
    not list is gone from the chunk's point on (as in the Python assembler)."""
    records, _ = _tiny({_X: _GONE}, later=False)
    state = to_state(_open(spark, tmp_path / "log", records).snapshot())
    assert state == list(Assembler().replay(records))[-1].state == {_Y: "x"}


def test_an_altered_chunk_of_a_small_log_is_refused(spark: Any, tmp_path: Path) -> None:
    records, _ = _tiny()
    forged, _ = _tiny({_X: 9})
    k = next(i for i, r in enumerate(records) if isinstance(r, SnapshotChunk))
    chunk, other = records[k], forged[k]
    assert isinstance(chunk, SnapshotChunk) and isinstance(other, SnapshotChunk)
    records[k] = SnapshotChunk(chunk.domain_id, chunk.epoch_seq, chunk.end_id,
                               chunk.baseline_id, chunk.index, chunk.last, chunk.lo, chunk.hi,
                               other.data, chunk.cell_count, chunk.setsum)
    with pytest.raises(InconsistentLog, match="setsum"):
        _open(spark, tmp_path / "log", records).snapshot()


def test_an_event_contradicting_its_chunk_is_refused(spark: Any, tmp_path: Path) -> None:
    """After its row's chunk a cell is checked strictly: the chunk says 7, the next event
    replaces 5: refused, naming the cell (the forgiveness stops at the chunk)."""
    records, _ = _tiny({_X: 7})
    replay = _open(spark, tmp_path / "log", records)
    with pytest.raises(InconsistentLog, match="did not replace") as info:
        replay.snapshot()
    assert info.value.cell == _X
    with pytest.raises(InconsistentLog):
        list(Assembler().replay(records))


def test_resuming_after_the_baseline(replay: LogReplay, based: BaselineLogged) -> None:
    """A consumer that applied up to the baseline's whole point resumes from its token:
    nothing at or before it again, and every later change."""
    b = based.baseline_domain
    whole = replay.whole_from(b)
    assert whole is not None
    token = str(replay.epochs.position(b, whole))
    after = replay.changesets(start=token).collect()
    mine = [r for r in after if r["_domain"] % (1 << 64) == b]
    assert mine and min(r["_epoch"] for r in mine) > whole
    every = [r for r in replay.changesets().collect() if r["_domain"] % (1 << 64) == b]
    assert len(mine) == len([r for r in every if r["_epoch"] > whole])


def test_settle_holds_a_domain_until_its_baseline(replay: LogReplay,
                                                  based: BaselineLogged) -> None:
    """A stream's frontier before the baseline, past a broken chain on a cell the log
    never saw: held before that interval (as the Python assembler holds it), not
    refused; once the baseline is whole, settled at the asked point."""
    b = based.baseline_domain
    first = replay.baselines.first(b)
    whole = replay.whole_from(b)
    assert first is not None and whole is not None
    before = max(q for d, q in based.at_quiescence if d == b and q < first.start)
    token = replay.epochs.position(b, before)
    with pytest.raises(InconsistentLog, match="cell state cannot be rebuilt"):
        replay.snapshot(str(token))  # strictly, the chain broke before the baseline
    held = replay.settle(Frontier.of([token])).get(b)
    assert held is None or held.epoch_seq < before
    inside = replay.epochs.position(b, next(q for d, q in sorted(based.at_quiescence)
                                            if d == b and first.start <= q < whole))
    assert replay.settle(Frontier.of([inside])).get(b) == held
    done = replay.epochs.position(b, whole)
    assert replay.settle(Frontier.of([done])).get(b) == done
