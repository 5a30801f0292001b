"""The PostgreSQL store's pool bookkeeping (agent._postgres_pool), without a server or
threads: random acquires (some connects fail), returns (fit or not) and a close, driven
as the store's drivers drive it, against a model of what must hold."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent import PostgresError
from agent._postgres_pool import CONNECT, WAIT, PoolSlots

_OPS = st.one_of(
    st.tuples(st.just("acquire"), st.booleans(), st.booleans()),  # fast path, connect ok
    st.tuples(st.just("release"), st.integers(0, 7), st.booleans()),  # which, fit
    st.tuples(st.just("close"), st.just(False), st.just(False)),
)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 4), st.lists(_OPS, max_size=40))
def test_the_pool_lends_at_most_size_reuses_idle_and_drops_the_unfit(
        size: int, ops: list[tuple[str, bool, bool]]) -> None:
    """Never more than ``size`` connections; an idle one is lent before a new one is
    made; WAIT only when every slot is lent; an unfit or late return is closed; after
    close nothing is lent and every idle connection is handed back to be closed."""
    slots: PoolSlots[int] = PoolSlots(size)
    lent: list[int] = []
    idle: set[int] = set()  # the model's idle connections
    closed: set[int] = set()  # connections the driver was told to close
    made = 0
    shut = False
    for op, a, b in ops:
        if op == "acquire":
            if shut:
                with pytest.raises(PostgresError, match="closed"):
                    slots.take_idle() if a else slots.take()
                continue
            got = slots.take_idle() if a else None
            if got is None:
                got = slots.take()
            if got is WAIT:
                assert not idle and len(lent) == size
                continue
            if got is CONNECT:
                assert not idle and len(lent) < size
                if not b:
                    slots.failed()  # the connect failed: the slot is free again
                    continue
                made += 1
                got = made
            else:
                assert got in idle
                idle.discard(got)  # type: ignore[arg-type]
            assert got not in lent and got not in closed
            lent.append(got)  # type: ignore[arg-type]
        elif op == "release":
            if not lent:
                continue
            entry = lent.pop(a % len(lent))
            kept = slots.give_back(entry, b)
            assert kept == (b and not shut)
            (idle if kept else closed).add(entry)
        else:
            for entry in slots.shut():
                assert entry in idle
                idle.discard(entry)
                closed.add(entry)
            shut = True
            assert not idle
        assert set(slots.idle) == idle and len(slots.idle) == len(idle)
        assert slots.lent_or_idle == len(lent) + len(idle) <= size


def test_a_pool_needs_a_connection() -> None:
    """pool_size below one is refused with what to do."""
    with pytest.raises(ValueError, match="at least one"):
        PoolSlots(0)
