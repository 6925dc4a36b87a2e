"""The one number reader (allocator/core/api/numbers.py): ASCII digits, the kind's units and
bounds, and a `BadNumber` saying what was expected for anything else."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from allocator.core.api import numbers
from allocator.core.api.numbers import DURATION, SIZE, SPAN, BadNumber, read, whole

CORES = whole("a whole number of cores, such as 8", high=4096)


@pytest.mark.parametrize(
    "text, kind, value",
    [
        ("8", CORES, 8),
        (" 8 ", CORES, 8),
        ("4g", SIZE, 4 << 30),
        ("4GiB", SIZE, 4 << 30),
        ("0.5 m", SIZE, 1 << 19),
        ("90", DURATION, 90),
        ("1.5h", DURATION, 5400),
        ("2w", SPAN, 14 * 86400),
    ],
)
def test_numbers_as_people_write_them_are_read(text, kind, value) -> None:
    assert read(text, kind) == value


@pytest.mark.parametrize(
    "text, kind, words",
    [
        ("²", CORES, "is not a whole number of cores"),  # isdigit() says yes, int() no
        ("٣", CORES, "is not"),  # int() reads it as 3: the Engine's Go would not
        ("+1", CORES, "is not"),
        ("-1", CORES, "is not"),
        ("9" * 400, SIZE, "is too large"),
        ("nan", DURATION, "is not a duration"),
        ("inf", SIZE, "is not a size"),
        ("1e3", CORES, "is not"),
        ("1_000", CORES, "is not"),
        ("4097", CORES, "out of range"),
        ("99999999d", DURATION, "out of range"),  # beyond any calendar
        ("7", SPAN, "is not a duration such as 7d"),
        (True, CORES, "is not"),
    ],
)
def test_anything_else_is_a_bad_number_saying_what_was_expected(text, kind, words) -> None:
    with pytest.raises(BadNumber, match=words) as e:
        read(text, kind)
    assert kind.expected in str(e.value)


@given(st.text(max_size=30))
def test_any_text_is_a_number_within_bounds_or_a_bad_number(text: str) -> None:
    for kind in (CORES, SIZE, DURATION, numbers.INDEX):
        try:
            value = read(text, kind)
        except BadNumber as e:
            assert kind.expected in str(e)
            continue
        assert kind.low <= value <= kind.high
        assert all(c.isascii() for c in text.strip())


@pytest.mark.parametrize("text", ["nan", "inf", "²", "-1", "9" * 400])
def test_the_cli_refuses_an_odd_timeout_with_exit_2(text, capsys) -> None:
    from allocator.ops import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["ready", "shim", "--timeout", text])
    assert e.value.code == 2 and "a number of seconds such as 30" in capsys.readouterr().err
