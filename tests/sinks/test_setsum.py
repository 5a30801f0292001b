"""setsum against the shared vectors, and its algebra as properties."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sinks import Setsum

VECTORS = json.loads(
    (Path(__file__).parents[1] / "fixtures/setsum/vectors.json").read_text())


def test_seven_values_digest() -> None:
    """The reference digest of the seven values, in any insertion order."""
    items = [s.encode() for s in VECTORS["seven_values"]["items_ascii"]]
    expected = VECTORS["seven_values"]["hexdigest"]
    assert Setsum.of(items).hexdigest() == expected
    assert Setsum.of(reversed(items)).hexdigest() == expected
    assert (Setsum.of(items[:4]) + Setsum.of(items[4:])).hexdigest() == expected
    s = Setsum.of(items)
    for item in items:
        s.remove(item)
    assert s.hexdigest() == "00" * 32


def test_empty_item_lanes_and_lane_arithmetic() -> None:
    """Lanes of sha3(b""), addition modulo the primes, inversion."""
    lanes = tuple(int(x, 16) for x in VECTORS["empty_item_state_lanes_hex"])
    assert Setsum().insert(b"").lanes == lanes
    for case in ("add_state_no_modulus", "add_state_exactly_primes"):
        v = VECTORS[case]
        assert (Setsum(v["lhs"]) + Setsum(v["rhs"])).lanes == tuple(v["sum"])
    inv = VECTORS["invert_state"]
    assert (-Setsum(int(x, 16) for x in inv["input_hex"])).lanes == tuple(inv["expected"])


def test_wal3_manifest_sums() -> None:
    """Sums of real wal3 manifest setsums."""
    for case in VECTORS["wal3_manifest_sums"]:
        total = Setsum.from_hexdigest(case["a"]) + Setsum.from_hexdigest(case["b"])
        assert total.hexdigest() == case["a_plus_b"]


@given(st.lists(st.binary(max_size=40), max_size=30), st.randoms())
def test_order_and_grouping_do_not_matter(items: list[bytes], rng: object) -> None:
    """Any permutation and any split into two sums give the same digest."""
    shuffled = list(items)
    rng.shuffle(shuffled)  # type: ignore[attr-defined]
    cut = len(items) // 2
    halves = Setsum.of(items[:cut]) + Setsum.of(items[cut:])
    assert Setsum.of(items) == Setsum.of(shuffled) == halves
    assert Setsum.of(items) - Setsum.of(items[:cut]) == Setsum.of(items[cut:])


def test_bad_hexdigest_is_refused() -> None:
    """A digest that is not 64 hex digits raises ValueError saying so."""
    with pytest.raises(ValueError, match="64 hex"):
        Setsum.from_hexdigest("abcd")
    with pytest.raises(ValueError, match="not hexadecimal"):
        Setsum.from_hexdigest("zz" * 32)
