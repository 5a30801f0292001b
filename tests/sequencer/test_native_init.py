"""Native objects whose ``__init__`` never ran (made by ``__new__`` alone) or failed
refuse every method, call and attribute with a clear RuntimeError instead of reading
their empty fields (a segfault, or garbage state for the sequencer).

Each type is exercised in a fresh interpreter: a regression kills that subprocess (its
return code says so), not pytest.
"""

from __future__ import annotations

import textwrap

import pytest

from tests._subprocess import python_output
from tests.sequencer._impls import native

# What each type offers: every method, the call, every attribute.
USES = {
    "MonotonicIds": ["o()", "o.next()", "o.last()", "o.offset_ns"],
    "EpochSequencer": ["o.open_batch(5, 0)", "o.close_batch(BatchTicket(5, 1), 0, 6, 1)",
                       "o.holding_back(0)", "o.open_batches()", "o.open_epochs()",
                       "o.quiescent", "o.state", "o.last_quiescence_ns", "o.domain_id"],
    "UnscopedWriter": ["o('t', 1, 'c', 4)", "o()", "o(*('t', 1, 'c', 4))", "o.open_ticket()",
                       "o.close_batch(BatchTicket(5, 1), 0, [])"],
    "CellWriter": ["o('t', 1, 'c', 4)", "o('t', 1, 'c', 4, extra=1)", "o()",
                   "o(1, 2, 3, 4)"],
}

SCRIPT = """
from sequencer import BatchTicket
from sequencer._accel import NATIVE
kind = getattr(NATIVE, {name!r})
made = [("new", kind.__new__(kind))]
{failed_init}
for how, o in made:
    for use in {uses!r}:
        try:
            eval(use)
        except RuntimeError as exc:
            assert "{name} was not initialised" in str(exc), (how, use, exc)
            print("refused", how, use, flush=True)
        else:
            raise SystemExit(f"{{how}}: {{use}} did not refuse")
"""

# An __init__ that fails before it sets anything leaves the object as __new__ made it.
FAILED_INIT = {
    "MonotonicIds": "def broken(): raise OSError('no clock')",
    "EpochSequencer": "broken = None",
    "UnscopedWriter": "broken = None",
    "CellWriter": "broken = None",
}
INIT_CALL = {
    "MonotonicIds": "o.__init__(broken, broken)",
    "EpochSequencer": "o.__init__(1, now_ns=7, max_quiescence_interval_ns='no int')",
    "UnscopedWriter": "o.__init__(None, None, None, None, None, None, None, None, 0)",
    "CellWriter": "o.__init__(None, None, None, 0)",
}


@pytest.mark.parametrize("name", sorted(USES))
def test_an_uninitialised_native_object_refuses_every_use(name: str) -> None:
    native()
    failed_init = textwrap.dedent(f"""
        {FAILED_INIT[name]}
        o = kind.__new__(kind)
        try:
            {INIT_CALL[name]}
        except (TypeError, OSError):
            made.append(("failed init", o))
        else:
            raise SystemExit("the broken __init__ passed")
        """)
    code = SCRIPT.format(name=name, uses=USES[name], failed_init=failed_init)
    out = python_output(code)
    assert out.count("refused") == 2 * len(USES[name]), out


def test_a_writer_refuses_an_uninitialised_sequencer() -> None:
    """UnscopedWriter.__init__ checks the EpochSequencer it is given was initialised (it
    drives that sequencer's state directly)."""
    code = textwrap.dedent("""
        import threading
        from sequencer._accel import NATIVE
        seq = NATIVE.EpochSequencer.__new__(NATIVE.EpochSequencer)
        class Agent:
            stats = {}
        try:
            NATIVE.UnscopedWriter(Agent(), seq, None, [], threading.Lock(), int, int,
                                  print, 10)
        except RuntimeError as exc:
            assert "EpochSequencer was not initialised" in str(exc), exc
            print("refused")
        """)
    native()
    assert python_output(code, timeout=60) == "refused"


def test_an_initialised_object_still_works_after_a_failed_reinit() -> None:
    """A second __init__ that fails leaves a working object working (nothing is
    replaced until every argument is checked)."""
    c = native()
    seq = c.EpochSequencer(5, now_ns=0)
    ticket = seq.open_batch(10, 0)
    with pytest.raises(TypeError):
        seq.__init__(6, now_ns=7, max_quiescence_interval_ns="not an int")
    assert seq.domain_id == 5 and seq.open_batches() == 1
    assert seq.last_quiescence_ns == 0 and not seq.holding_back(1 << 40)
    assert [e.quiescent for e in seq.close_batch(ticket, 1, 11, 1)] == [False, True]
