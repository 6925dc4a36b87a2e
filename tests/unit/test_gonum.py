"""Go's numbers as dockerd reads them (allocator/core/api/gonum.py): int64 and uint64
spellings, cgroup rules."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from allocator.core.api import gonum


@given(st.integers(-(2**63), 2**63 - 1), st.integers(0, 5), st.sampled_from(["", "+"]))
def test_parse_int_reads_every_spelling_of_an_int64_as_go_does(value, zeros, plus):
    sign = "-" if value < 0 else plus
    assert gonum.parse_int(f"{sign}{'0' * zeros}{abs(value)}") == value


@given(st.integers(2**63, 2**70))
def test_parse_int_refuses_what_overflows_int64(value):
    with pytest.raises(gonum.NumError):
        gonum.parse_int(str(value))
    with pytest.raises(gonum.NumError):
        gonum.parse_int(f"-{value + 1}")


@pytest.mark.parametrize("text", ["", "+", "-", " 195", "195 ", "1_95", "١٩٥", "0x1f", "19.5"])
def test_parse_int_refuses_what_python_int_would_take_or_go_refuses(text):
    with pytest.raises(gonum.NumError):
        gonum.parse_int(text)


@given(st.integers(0, 2**64 - 1), st.integers(0, 3))
def test_parse_uint_takes_the_whole_uint64_range(value, zeros):
    assert gonum.parse_uint("0" * zeros + str(value)) == value
    assert gonum.parse_uint(format(value, "x"), 16) == value


@given(st.integers(0, 2**40), st.integers(0, 4), st.integers(0, 300), st.integers(0, 4))
def test_a_cgroup_rule_is_read_by_value(major, zeros, minor, mzeros):
    rule = f"c {'0' * zeros}{major}:{'0' * mzeros}{minor} rwm"
    assert gonum.cgroup_rule(rule) == ("c", major, minor, "rwm")


@pytest.mark.parametrize(
    "rule",
    ["c 195:* rwm\n", "c 195:* rwm ", "c  195:* rwm", "c -1:* rwm", "c +195:* rwm",
     "c 195:* rwmx", "c 195 rwm", "C 195:* rwm", "c 9223372036854775808:* rwm", "c ١٩٥:* rwm"],
)  # fmt: skip
def test_cgroup_rules_dockerd_refuses_are_refused(rule):
    with pytest.raises(gonum.NumError):
        gonum.cgroup_rule(rule)
