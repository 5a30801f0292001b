"""Fuzzing position tokens and frontiers: a Position, or InvalidPosition, and fast."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replay import Frontier, InvalidPosition, Position
from tests.fuzz._mutate import FUZZ

pytestmark = pytest.mark.timeout(60)

hex_digits = st.text("0123456789abcdefABCDEF", max_size=24)
tokens = st.builds(lambda *parts: "".join(parts), hex_digits, st.sampled_from([":", "", "::"]),
                   hex_digits, st.sampled_from([":", ";"]), hex_digits,
                   st.sampled_from(["", "+", "+ ", "+-"]), hex_digits | st.just("f" * 200_000))


@FUZZ
@given(tokens | st.text(max_size=60))
def test_tokens_parse_or_raise_invalid_position(text: str) -> None:
    """Anything parses to a Position that formats back to itself, or is InvalidPosition;
    a long +seen suffix is refused before any work on it."""
    try:
        position = Position.parse(text)
    except InvalidPosition:
        return
    assert Position.parse(str(position)) == position
    assert len(position.seen_epochs()) <= 64
    assert all(e > position.epoch_seq for e in position.seen_epochs())


@FUZZ
@given(st.lists(tokens, max_size=4).map(",".join) | st.text(max_size=80))
def test_frontiers_parse_or_raise_invalid_position(text: str) -> None:
    try:
        frontier = Frontier.parse(text)
    except InvalidPosition:
        return
    assert Frontier.parse(str(frontier)) == frontier
