"""Every number gpu-alloc reads from a person or a request, through one strict reader.

Labels, query strings, command-line flags, API bodies and the policy file all spell
numbers as text, and `read` is the one function that turns that text into a number.
It takes ASCII digits ``0``-``9`` only (``str.isdigit`` admits ``²``, which ``int()``
then refuses, and ``int()`` takes every script's digits), an optional fraction where
the `Kind` allows one, one of the kind's units, no sign, at most `MAX_DIGITS` digits
before the point, and a value within the kind's bounds: no NaN, no infinity, no value
so large that a date or a multiplication overflows later.  Anything else is a
`BadNumber`, a ValueError whose text says what was given and what was expected, which
every entry point answers as a 400 (HTTP), a refusal (Engine API) or exit 2 (CLI).

Where the Engine reads a value itself (a device cgroup rule), allocator/core/api/gonum.py
reads it as Go's strconv does instead, since then the Engine's reading is the one that
counts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal

MAX_DIGITS = 18  # before the point: below 2**63, so never an overflow anywhere after
_WHOLE = rf"(?P<whole>[0-9]{{1,{MAX_DIGITS}}})"
_FRACTION = r"(?:\.(?P<fraction>[0-9]{1,9}))?"


class BadNumber(ValueError):
    """A number that is not one: its text says what was expected.  ``syntax``: False
    when it is a number, but too large or out of the kind's range."""

    def __init__(self, text: str, syntax: bool = True) -> None:
        super().__init__(text)
        self.syntax = syntax


@dataclass(frozen=True)
class Kind:
    """What one kind of number may be: ``expected`` words it for an error.

    ``units``: suffix (lower case) -> its multiplier; ``""`` present means a bare
    number is allowed.  ``high``: the largest value, after the unit."""

    expected: str
    units: Mapping[str, int] = field(default_factory=lambda: {"": 1})
    fraction: bool = False
    low: int = 0
    high: int = (1 << 63) - 1
    _pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        suffixes = "|".join(re.escape(u) for u in sorted(self.units, key=len, reverse=True))
        number = _WHOLE + (_FRACTION if self.fraction else "")
        pattern = re.compile(rf"\s*{number}\s*(?P<unit>{suffixes})\s*", re.IGNORECASE | re.ASCII)
        object.__setattr__(self, "_pattern", pattern)


def read(text: object, kind: Kind) -> int | float:
    """The value of ``text`` as ``kind`` allows it: an int, or a float when the kind takes a
    fraction and the value has one.  Raises `BadNumber` for anything else."""
    if isinstance(text, bool) or not isinstance(text, str | int):
        raise BadNumber(f"{text!r} is not {kind.expected}")
    given = str(text)
    m = kind._pattern.fullmatch(given)
    if m is None and re.search(rf"[0-9]{{{MAX_DIGITS + 1}}}", given, re.ASCII):
        raise BadNumber(f"'{_shown(given)}' is too large: expected {kind.expected}", False)
    if m is None:
        raise BadNumber(f"'{_shown(given)}' is not {kind.expected}")
    fraction = m.groupdict().get("fraction") or "0"
    value = Decimal(f"{m['whole']}.{fraction}") * kind.units[m["unit"].lower()]
    if not kind.low <= value <= kind.high:
        raise BadNumber(
            f"'{_shown(given)}' is out of range: expected {kind.expected}, "
            f"from {kind.low} to {kind.high}",
            False,
        )
    return int(value) if value == value.to_integral_value() else float(value)


def _shown(text: str) -> str:
    """The text as the error quotes it: at most 40 characters of it."""
    return text if len(text) <= 40 else text[:37] + "..."


def whole(expected: str, high: int = (1 << 63) - 1, low: int = 0) -> Kind:
    """A whole number with no unit, from ``low`` to ``high``."""
    return Kind(expected, low=low, high=high)


_PREFIXES = ("", "k", "m", "g", "t", "p")
_SIZE_UNITS = {p + s: 1 << (10 * i) for i, p in enumerate(_PREFIXES) for s in ("", "b", "ib", "i")}
_SIZE_UNITS.pop("i")
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
CENTURY = 36_500 * 86400  # no duration is longer: beyond, dates leave the calendar

# Docker's own --memory / --shm-size format (go-units, 1024-based): 512m, 4g, 4GiB
SIZE = Kind("a size such as 512m or 4g", _SIZE_UNITS, fraction=True)
# 90, 30s, 15m, 2h, 1d; at most 100 years
DURATION = Kind(
    "a duration such as 30s, 15m or 2h (a number of seconds, or a number with s, m, h or d)",
    {k: v for k, v in _DURATION_UNITS.items() if k != "w"},
    fraction=True,
    high=CENTURY,
)
# --since 7d: a unit is required (a bare number is taken for a time)
SPAN = Kind(
    "a duration such as 7d, 12h or 30m",
    {k: v for k, v in _DURATION_UNITS.items() if k},
    fraction=True,
    high=CENTURY,
)

INDEX = whole("a GPU index such as 0", high=1 << 16)
COUNT = whole("a number of GPUs such as 2", high=1 << 16)
PORT = whole("a TCP port", high=65535, low=1)


def maybe(text: object, kind: Kind) -> int | float | None:
    """`read`, or None where ``text`` is not such a number (it may be something else: a
    GPU index or a UUID)."""
    try:
        return read(text, kind)
    except BadNumber:
        return None


LATEST = 253402214400.0  # 9999-12-30T00:00:00Z: a later time leaves Python's calendar


def instant(epoch: float, said: str) -> float:
    """A time (epoch seconds) from 1970 to `LATEST`; `BadNumber` naming ``said`` else, so
    that no date read from a person overflows a calendar later."""
    if not 0 <= epoch <= LATEST:
        raise BadNumber(
            f"'{_shown(said)}' is out of range: expected a time from 1970 to 9999", False
        )
    return epoch
