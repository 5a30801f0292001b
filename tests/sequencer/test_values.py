"""The value model: every write the checks accept can be encoded; the rest is refused."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sequencer import InvalidWrite, check_name, check_row, check_value, check_write

LONE_SURROGATE = json.loads('"\\ud800"')
# What os.fsdecode makes of a file name that is not UTF-8 (surrogateescape).
ESCAPED = os.fsdecode(b"caf\xe9")


@pytest.mark.parametrize("text", [LONE_SURROGATE, ESCAPED, "ok\udfff", "\U0001f600\ud83d"])
def test_unencodable_text_is_refused_as_value_and_row_key(text: str) -> None:
    """A str that is not valid UTF-8 is refused (value and row key), naming the index."""
    with pytest.raises(InvalidWrite, match="cannot be encoded as UTF-8"):
        check_value(text)
    with pytest.raises(InvalidWrite, match=r"row key .* cannot be encoded"):
        check_row(text)
    # The hot path, with names it already knows, refuses it too.
    check_write("t", 1, "c", 1)
    with pytest.raises(InvalidWrite, match="str value"):
        check_write("t", 1, "c", text)
    with pytest.raises(InvalidWrite, match="row key"):
        check_write("t", text, "c", 1)


def test_unencodable_names_are_refused() -> None:
    """A name holding a surrogate is not an identifier."""
    for name in (LONE_SURROGATE, "t" + LONE_SURROGATE):
        with pytest.raises(InvalidWrite, match="table name"):
            check_write(name, 1, "c", 1)
        with pytest.raises(InvalidWrite, match="column name"):
            check_write("t", 1, name, 1)


@pytest.mark.parametrize("name", [["t"], {"t": 1}, {"t"}, bytearray(b"t"), b"t", 1, None])
def test_names_of_the_wrong_type_raise_invalid_write_not_type_error(name: object) -> None:
    """An unhashable (list, dict, set) or non-str table/column name is InvalidWrite."""
    check_write("t", 1, "c", 1)  # "t" and "c" are known: the fast path runs first
    with pytest.raises(InvalidWrite, match="table name"):
        check_write(name, 1, "c", 1)
    with pytest.raises(InvalidWrite, match="column name"):
        check_write("t", 1, name, 1)
    with pytest.raises(InvalidWrite, match="table name"):
        check_name("table", name)


def test_non_ascii_text_that_encodes_is_accepted() -> None:
    """Only unencodable text is refused: accents, CJK and emoji are fine."""
    for text in ("café", "数据", "\U0001f600", "\x00", ""):
        assert check_value(text) == text
        assert check_row(text) == text
        check_write("t", text, "c", text)


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(codec=None, categories=None), max_size=8)
       | st.text(st.characters(min_codepoint=0xD700, max_codepoint=0xE000), max_size=4))
def test_accepted_text_always_encodes(text: str) -> None:
    """Whatever the checks accept encodes as UTF-8 (the codec's format); the rest is
    refused with InvalidWrite and nothing else."""
    try:
        text.encode()
        encodable = True
    except UnicodeEncodeError:
        encodable = False
    for check in (check_value, check_row, lambda t: check_write("t", t, "c", t)):
        if encodable:
            check(text)
        else:
            with pytest.raises(InvalidWrite):
                check(text)


INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


@pytest.mark.parametrize("number", [INT64_MIN, INT64_MAX, 0, -1])
def test_the_int64_bounds_are_accepted(number: int) -> None:
    """The extreme 64-bit ints are values and row keys, on the hot path and off it."""
    assert check_value(number) == number and check_row(number) == number
    check_write("t", number, "c", number)


@pytest.mark.parametrize("number", [INT64_MIN - 1, INT64_MAX + 1, 1 << 64])
def test_ints_beyond_64_bits_are_refused(number: int) -> None:
    with pytest.raises(InvalidWrite, match="64-bit"):
        check_value(number)
    with pytest.raises(InvalidWrite, match="64-bit"):
        check_row(number)
    with pytest.raises(InvalidWrite, match="64-bit"):
        check_write("t", 1, "c", number)
    with pytest.raises(InvalidWrite, match="64-bit"):
        check_write("t", number, "c", 1)


def test_names_are_identifiers_of_at_most_63_characters() -> None:
    assert check_name("table", "a" * 63) == "a" * 63
    assert check_name("table", "_9") == "_9"
    for bad in ("a" * 64, "9a", "", "a-b", "a b", "é"):
        with pytest.raises(InvalidWrite, match="not an identifier"):
            check_name("table", bad)


@pytest.mark.parametrize("row", [True, False, 1.0, b"k", None])
def test_row_keys_are_str_or_int_only(row: object) -> None:
    """bool is not an int key (True would alias 1), nor are floats, bytes or None."""
    with pytest.raises(InvalidWrite, match="row key"):
        check_row(row)
    with pytest.raises(InvalidWrite, match="row key"):
        check_write("t", row, "c", 1)
