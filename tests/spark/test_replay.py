"""replay.spark on a real workload: bit for bit what the Python assembler and the store say."""

from __future__ import annotations

import math
import random
import struct
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

from replay import Position
from replay.spark import LogReplay, changesets, snapshot, to_state, verify, wide
from sequencer import ABSENT
from sinks.codec import decode_key, decode_value, encode_key, encode_value
from tests.helpers import bits
from tests.spark._logs import Logged

pytestmark = [
    pytest.mark.spark,
    # PySpark leaves a result socket to the garbage collector (not ours to close).
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


@pytest.fixture(scope="module")
def replay(spark: Any, logged: Logged) -> Iterator[LogReplay]:
    r = LogReplay(spark, logged.uri)
    yield r
    r.unpersist()


def test_final_snapshot_is_the_python_assemblers_and_the_stores(replay: LogReplay,
                                                                logged: Logged) -> None:
    """The last quiescence point of every domain: Spark == Assembler == store, bit for bit."""
    python = logged.python_snapshots()
    # How many points there are is the scheduler's choice (80 on a loaded CI machine);
    # tens of them are enough to cover interval boundaries in every domain.
    assert len(python) == len(logged.at_quiescence) > 20
    spark_state = bits(to_state(replay.snapshot()))
    assert spark_state == bits(python[-1].state) == logged.final
    assert len(spark_state) > 1000


def test_what_the_replay_caches_is_kept_deserialized(replay: LogReplay) -> None:
    """Every frame the replay caches is persisted MEMORY_AND_DISK_DESER (what
    ``DataFrame.cache()`` uses). PySpark's MEMORY_AND_DISK is the serialized level: a
    block spilled to disk is then read back into memory in one allocation, which ran
    a 4M-event replay out of a 1g JVM heap (the deserialized level unrolls it
    gradually, or streams it from disk)."""
    from pyspark import StorageLevel

    replay.snapshot().count()
    assert len(replay._persisted) >= 3  # pass 1, pass 2 and the checks
    for frame in replay._persisted:
        assert frame.storageLevel == StorageLevel.MEMORY_AND_DISK_DESER


def test_every_quiescence_point_through_the_changesets(replay: LogReplay,
                                                       logged: Logged) -> None:
    """Applying the changesets in order rebuilds the store at every quiescence point, and
    each changeset equals the Python assembler's for that point."""
    rows = replay.changesets().orderBy("_domain", "_epoch").collect()
    python = {(s.domain_id, s.epoch_seq): s.changeset for s in logged.python_snapshots()}
    by_point: dict[tuple[int, int], list[Any]] = {}
    for row in rows:
        by_point.setdefault((row["_domain"] % (1 << 64), row["_epoch"]), []).append(row)
    states: dict[int, dict[Any, bytes]] = {d: {} for d in logged.tables}
    checked = 0
    for (domain_id, epoch), expected in sorted(logged.at_quiescence.items(),
                                               key=lambda kv: (kv[0][0], kv[0][1])):
        state = states[domain_id]
        changes, before = {}, {}
        for row in by_point.get((domain_id, epoch), []):
            cell = (row["table"], decode_key(bytes(row["row"])), row["column"])
            changes[cell], before[cell] = bytes(row["after"]), bytes(row["before"])
            assert str(row["_position"]).startswith(f"{domain_id:x}:{epoch:x}:")
            kind = row["_change_type"]
            assert kind == ("insert" if not row["before"] else
                            "delete" if not row["after"] else "update")
            if row["after"]:
                state[cell] = bytes(row["after"])
            else:
                state.pop(cell, None)
        assert state == expected, (domain_id, epoch)
        py = python[(domain_id, epoch)]
        assert changes == {c: encode_value(v) for c, v in py.changes.items()}
        assert before == {c: encode_value(v) for c, v in py.before.items()}
        checked += 1
    assert checked == len(python)


def test_sampled_points_by_position_token(replay: LogReplay, logged: Logged) -> None:
    """snapshot(at=token) of sampled quiescence points is the store's state then."""
    rng = random.Random(3)
    points = rng.sample(sorted(logged.at_quiescence), 4)
    for domain_id, epoch in points:
        token = str(replay.epochs.position(domain_id, epoch))
        state = logged.domain_state(domain_id, bits(to_state(replay.snapshot(token))))
        assert state == logged.at_quiescence[(domain_id, epoch)]


def test_awkward_values_survive_bit_for_bit(replay: LogReplay, logged: Logged) -> None:
    """NaN payloads, -0.0, int64 extremes, bytes vs str, None: present in what Spark
    produced (every changeset's new values), exact (the tests above compare bytes)."""
    after = replay.changesets().select("after").distinct().collect()
    # Exactly the Python assembler's new values, byte for byte (which awkward values
    # survive the net changes depends on how the writers' threads interleaved).
    python = {encode_value(v) for s in logged.python_snapshots()
              for v in s.changeset.changes.values()}
    assert {bytes(r[0]) for r in after} == python
    values = [decode_value(bytes(r[0])) for r in after if r[0]]
    floats = [struct.pack(">d", v) for v in values if type(v) is float]
    assert struct.pack(">d", -0.0) in floats
    assert any(math.isnan(struct.unpack(">d", f)[0]) and f != struct.pack(">d", math.nan)
               for f in floats)
    ints = {v for v in values if type(v) is int}
    assert {(1 << 63) - 1, -(1 << 63)} & ints
    assert any(v in values for v in (None, "", b""))


def test_events_carry_metadata_and_ids_past_2_63(replay: LogReplay, logged: Logged) -> None:
    """Every event once; _batch_id is unsigned (decimal) and ordered right across 2**63."""
    e = replay.events()
    assert e.count() == logged.events
    assert {r["_op"] for r in e.select("_op").distinct().collect()} == {"c", "u", "d"}
    crossing = next(iter(logged.tables))  # domain 0 got the injected 2038 clock
    ids = [int(r["_batch_id"]) for r in e.filter(e["_domain"] == crossing)
           .orderBy("_batch_id").select("_batch_id").collect()]
    assert ids[0] < 1 << 63 <= ids[-1] < 1 << 64
    assert ids == sorted(ids)
    first = e.select("_batch_id").first()
    assert first is not None and isinstance(first[0], Decimal)
    ops = e.filter(e["_op"] == "c").select("old").distinct().collect()
    assert [bytes(r[0]) for r in ops] == [encode_value(ABSENT)]


def test_verify_reports_every_epoch(replay: LogReplay, logged: Logged) -> None:
    """The report has one row per verified epoch, all ok, counting every event."""
    report = replay.verify().collect()
    assert all(r["count_ok"] and r["setsum_ok"] for r in report)
    assert sum(r["events"] for r in report) == logged.events
    assert len(report) == sum(len(e) for e in replay.epochs.epochs.values())
    assert sum(r["quiescent"] for r in report) == len(logged.at_quiescence)


def test_module_functions(spark: Any, small: Logged) -> None:
    """The public one-call functions give the Python assembler's answers."""
    python = small.python_snapshots()
    middle = python[len(python) // 2]
    at = Position(middle.domain_id, middle.epoch_seq, 0)
    mid = to_state(snapshot(spark, small.uri, at=str(at)))
    assert small.domain_state(middle.domain_id, bits(mid)) == small.domain_state(
        middle.domain_id, bits(middle.state))
    after = changesets(spark, small.uri, start=str(at)).collect()
    assert after and all(r["_epoch"] > middle.epoch_seq for r in after
                         if r["_domain"] == middle.domain_id)
    assert verify(spark, small.uri).count() > 0


def test_wide_view_of_one_table(replay: LogReplay, logged: Logged) -> None:
    """One row per row key, typed columns where a column has one type, exact values."""
    table = sorted(logged.tables[next(iter(logged.tables))])[0]
    snap = replay.snapshot()
    view = wide(snap, table)
    state = to_state(snap)
    rows = {decode_key(bytes(r["row"])) for r in snap.filter(snap["table"] == table)
            .select("row").collect()}
    got = view.collect()
    assert len(got) == len(rows)
    tagged = {f.name for f in view.schema.fields if f.metadata.get("cdc-agent.tagged")}
    assert "_row" in tagged  # this workload mixes int and str row keys
    for r in got:
        row = decode_key(bytes(r["_row"]))
        for column in view.columns[1:]:
            value = r[column]
            if column in tagged and value is not None:
                value = decode_value(bytes(value))
            elif isinstance(value, bytearray):
                value = bytes(value)
            held = state.get((table, row, column), None)
            assert encode_value(value) == encode_value(held)


def test_wide_view_types_columns_of_one_type(spark: Any) -> None:
    """Columns of one type (None aside) become that Spark type, every bit kept."""
    nan = struct.unpack(">d", bytes.fromhex("7ff800000000beef"))[0]
    cells = {
        (1, "n"): 1 << 62, (2, "n"): -(1 << 63), (3, "n"): None,
        (1, "f"): -0.0, (2, "f"): nan, (3, "f"): float("inf"),
        (1, "s"): "π", (2, "s"): "",
        (1, "b"): b"", (3, "b"): b"\x00",
        (1, "t"): True, (2, "t"): False,
        (1, "m"): 1, (2, "m"): "1",
    }
    rows = [("t", encode_key(r), c, encode_value(v)) for (r, c), v in cells.items()]
    rows.append(("other", encode_key(1), "n", encode_value("x")))
    snap = spark.createDataFrame(rows, "table string, row binary, column string, value binary")
    view = wide(snap, "t")
    types = {f.name: f.dataType.simpleString() for f in view.schema.fields}
    assert types == {"_row": "bigint", "b": "binary", "f": "double", "m": "binary",
                     "n": "bigint", "s": "string", "t": "boolean"}
    got = {r["_row"]: r for r in view.collect()}
    assert sorted(got) == [1, 2, 3]
    for (row, column), value in cells.items():
        found = got[row][column]
        if column == "m":
            found = decode_value(bytes(found))
        elif isinstance(found, bytearray):
            found = bytes(found)
        assert encode_value(found) == encode_value(value), (row, column)
    assert got[3]["s"] is None and got[2]["b"] is None  # missing cells are null
