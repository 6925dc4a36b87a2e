"""Numbers as Go's strconv reads them, so a spelling compares by the value dockerd sees.

dockerd reads a device cgroup rule's major and minor with ``strconv.ParseInt(s, 10,
64)`` after a regexp admits only ``[0-9]+`` or ``*`` (oci/oci.go), so ``0195`` is
195 and a number past int64 makes dockerd refuse the rule.  Python's ``int()`` is not
that parser: it takes surrounding spaces, ``_`` separators and any Unicode digit.
"""

from __future__ import annotations

import re

DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
# oci/oci.go: deviceCgroupRuleRegex.  Go's ``$`` is the end of the text (no final newline).
CGROUP_RULE = re.compile(r"([acb]) ([0-9]+|\*):([0-9]+|\*) ([rwm]{1,3})\Z")
ANY = -1  # a ``*`` major or minor, as dockerd stores it


class NumError(ValueError):
    """strconv's ErrSyntax or ErrRange: dockerd refuses the value."""


def parse_int(s: str, base: int = 10, bits: int = 64) -> int:
    """strconv.ParseInt for bases 2 to 36: an optional sign, then ASCII digits only."""
    body = s[1:] if s[:1] in ("+", "-") else s
    value = parse_uint(body, base, 65)  # wide enough for the magnitude of any int64
    if s[:1] == "-":
        value = -value
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    if not low <= value <= high:
        raise NumError(f"strconv.ParseInt: parsing {s!r}: value out of range")
    return value


def parse_uint(s: str, base: int = 10, bits: int = 64) -> int:
    """strconv.ParseUint for bases 2 to 36: ASCII digits of the base, no sign, no ``_``."""
    if not 2 <= base <= 36:
        raise NumError(f"base {base} is not one strconv takes here")
    if not s:
        raise NumError("strconv.ParseUint: parsing '': invalid syntax")
    value = 0
    for ch in s:
        digit = DIGITS.find(ch.lower()) if ch.isascii() else -1
        if not 0 <= digit < base:
            raise NumError(f"strconv.ParseUint: parsing {s!r}: invalid syntax")
        value = value * base + digit
    if value >= 1 << bits:
        raise NumError(f"strconv.ParseUint: parsing {s!r}: value out of range")
    return value


def cgroup_rule(rule: str) -> tuple[str, int, int, str]:
    """(type, major, minor, access) of a device cgroup rule as dockerd parses it; ``*`` is
    `ANY`.  Raises NumError for every rule dockerd refuses."""
    m = CGROUP_RULE.match(rule)
    if m is None:
        raise NumError(f"invalid device cgroup rule format: '{rule}'")
    kind, major, minor, perms = m.groups()
    return (
        kind,
        ANY if major == "*" else parse_int(major),
        ANY if minor == "*" else parse_int(minor),
        perms,
    )
