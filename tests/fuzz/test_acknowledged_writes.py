"""End to end: no acknowledged write is missing from the log without an error saying so.

An Agent writes to a wal3 log, with bad writes (unencodable text, unhashable or non-str
names, out-of-range ints, unsupported types) mixed among good ones. Each bad write must
raise InvalidWrite and change nothing; every write that returned must be in the log,
as an event, and replaying the log must give exactly the store's state. Before, one
lone surrogate was accepted, then failed the shipper: the log lost that write and every
one queued with or after it, with no error to the writers that had succeeded.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent import Agent, InvalidWrite, MemoryStore
from replay import Assembler
from sinks.objstore import InMemoryObjectStore
from sinks.wal3 import Wal3Sink, WriterOptions, read_log
from tests.fuzz._mutate import FUZZ
from tests.helpers import bits

pytestmark = pytest.mark.timeout(120)

SURROGATE = json.loads('"\\ud800"')
BAD_WRITES: list[tuple[Any, Any, Any, Any]] = [
    ("t", 99, "c", SURROGATE),                    # the issue's example
    ("t", os.fsdecode(b"caf\xe9"), "c", 1),       # a row key from os.fsdecode
    ("t", 1, "c", "ok" + SURROGATE),
    (["t"], 1, "c", 1),                           # unhashable table name
    ("t", 1, {"c": 1}, 1),                        # unhashable column name
    ("t", 1, "c", 1 << 63),
    ("t", 1 << 64, "c", 1),
    ("t", 1, "c", [1]),
    ("t", 1.5, "c", 1),
    ("bad name", 1, "c", 1),
]
good_values = (st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 63) - 1)
               | st.floats(allow_nan=False) | st.text(max_size=6) | st.binary(max_size=6))
good_writes = st.tuples(st.just("t"), st.integers(0, 5) | st.sampled_from(["a", "é"]),
                        st.sampled_from(["c", "d"]), good_values)
writes = st.lists(st.tuples(st.booleans(), good_writes | st.sampled_from(BAD_WRITES)),
                  min_size=1, max_size=30)


def run(plan: list[tuple[bool, tuple[Any, Any, Any, Any]]]) -> None:
    objects = InMemoryObjectStore("acked")
    store = MemoryStore()
    sink = Wal3Sink(objects, options=WriterOptions(batch_size_records=3))
    agent = Agent(store, sink)
    accepted: list[tuple[Any, Any, Any, Any]] = []
    for in_batch, write in plan:
        before = store.snapshot()
        try:
            if in_batch:
                with agent.batch():
                    agent.set(*write)
            else:
                agent.set(*write)
        except InvalidWrite:
            assert store.snapshot() == before, "a refused write touched the store"
            assert write in BAD_WRITES, f"a good write was refused: {write!r}"
            continue
        assert write not in BAD_WRITES, f"a bad write was accepted: {write!r}"
        accepted.append(write)
    agent.close()
    assert agent.shipping_error is None
    records = list(read_log(objects))
    events = [e for r in records if hasattr(r, "to_events") for e in r.to_events()]
    assert [(e.table, e.row, e.column, bits({0: e.new})[0]) for e in events] == [
        (t, r, c, bits({0: v})[0]) for t, r, c, v in accepted], "the log lost acknowledged writes"
    states = list(Assembler().replay(records))
    final = bits(states[-1].state) if states else {}
    assert final == bits(store.snapshot())


@FUZZ
@given(writes)
def test_every_accepted_write_is_in_the_log(plan: list[tuple[bool, Any]]) -> None:
    """Bad writes raise InvalidWrite and change nothing; the log holds every other one."""
    run(plan)


def test_the_issues_example_loses_nothing() -> None:
    """Five good batches, the lone surrogate, five more: ten writes in the log."""
    good = [(True, ("t", i, "c", i)) for i in range(5)]
    more = [(False, ("t", i, "c", -i)) for i in range(5, 10)]
    run([*good, (False, BAD_WRITES[0]), (True, BAD_WRITES[1]), *more])
