"""Position tokens: parse, format, resume without skipping or double-applying."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replay import Assembler, Frontier, InvalidPosition, Position
from sequencer import EpochRecord
from tests.helpers import Captured, bits

u64 = st.integers(0, (1 << 64) - 1)


@given(st.integers(1, (1 << 63) - 1), st.integers(0, 1 << 40), u64, u64)
def test_tokens_round_trip(domain: int, epoch: int, end: int, seen: int) -> None:
    """str() then parse() gives the same position."""
    position = Position(domain, epoch, end, seen)
    assert Position.parse(str(position)) == position


def test_seen_suffix_names_later_epochs() -> None:
    """'+16' after epoch 3 means epochs 5, 6 and 8 were seen (seed 003's example)."""
    position = Position.parse("a:3:ff+16")
    assert position.seen_epochs() == [5, 6, 8]
    assert str(position) == "a:3:ff+16"


@pytest.mark.parametrize("text", ["", "x:1:2", "1:2", "1:2:3+", "1:2:3:4", "-1:2:3"])
def test_bad_tokens_are_refused_with_the_expected_form(text: str) -> None:
    """A malformed token raises InvalidPosition quoting the form."""
    with pytest.raises(InvalidPosition, match="<domain hex>"):
        Position.parse(text)


def test_frontier_holds_one_position_per_domain() -> None:
    """A frontier formats sorted by domain and refuses a domain named twice."""
    frontier = Frontier.parse("b:1:10,a:2:20")
    assert str(frontier) == "a:2:20,b:1:10"
    assert frontier.get(0xA) == Position(0xA, 2, 0x20)
    with pytest.raises(InvalidPosition, match="twice"):
        Frontier.parse("a:1:1,a:2:2")


def test_resuming_from_any_position_neither_skips_nor_repeats() -> None:
    """Stop after any changeset, resume from its token and state: same final state."""
    c = Captured()
    for i in range(40):
        with c.agent.batch():
            c.agent.set("t", i % 5, "a", i)
            c.agent.delete("t", (i + 2) % 5, "a")
    c.agent.close()
    full = list(Assembler().replay(c.sink.records))
    final = bits(c.store.snapshot())
    for stop in range(0, len(full), 7):
        # What a consumer stores with its applied state: the changeset's position.
        saved_state, token = full[stop].state, str(full[stop].changeset.position)
        resumed = Assembler(initial_state=saved_state, position=token)
        rest = list(resumed.changesets(c.sink.records))
        assert [ch.epoch_seq for ch in rest] == [ch.epoch_seq for ch in full[stop + 1:]]
        assert bits(resumed.state) == final


def test_position_after_each_changeset_points_at_its_quiescence_point() -> None:
    """A changeset's position names its domain, epoch and the end id of that epoch."""
    c = Captured()
    c.agent.set("t", 1, "a", 1)
    c.agent.close()
    [changeset] = list(Assembler().changesets(c.sink.records))
    marker = [r for r in c.sink.records if isinstance(r, EpochRecord)][-1]
    assert changeset.position == Position(marker.domain_id, marker.epoch_seq, marker.end_id)


@pytest.mark.parametrize("seen", ["1" * 17, "f" * 1_000_000, "0" * 17 + "1"])
def test_a_seen_suffix_beyond_64_epochs_is_refused_at_once(seen: str) -> None:
    """The +seen suffix is bounded (16 hex digits, 64 epochs): a 1 MB suffix is a clear
    InvalidPosition, not seconds of work in seen_epochs() (452 s before)."""
    with pytest.raises(InvalidPosition, match="at most 64 epochs"):
        Position.parse(f"a:3:ff+{seen}")
    with pytest.raises(InvalidPosition, match="at most 64 epochs"):
        Frontier.parse(f"b:1:2,a:3:ff+{seen}")


def test_a_position_holds_at_most_64_seen_epochs() -> None:
    """The constructor enforces the same bound, so str() always parses back."""
    with pytest.raises(InvalidPosition, match="at most 64 epochs"):
        Position(1, 2, 3, 1 << 64)
    with pytest.raises(InvalidPosition):
        Position(1, 2, 3, -1)
    widest = Position(1, 2, 3, (1 << 64) - 1)
    assert Position.parse(str(widest)) == widest
    assert widest.seen_epochs() == list(range(3, 67))


def test_tokens_parse_whatever_their_case_and_surrounding_space() -> None:
    """Hex digits are read case-insensitively; the text form is always lowercase."""
    position = Position.parse("  A:3:FF+16\n")
    assert position == Position(10, 3, 255, 0x16) and str(position) == "a:3:ff+16"


def test_covers_is_at_or_past_in_the_same_domain() -> None:
    here = Position(1, 5, 9)
    assert here.covers(Position(1, 5, 9)) and here.covers(Position(1, 4, 2))
    assert not here.covers(Position(1, 6, 12)) and not here.covers(Position(2, 1, 1))
