"""The allow-list's tables (allocator/core/access/powers_table.py) and the docs that show
them: docs/exclusivity.md's tables are these, row for row, and every HostConfig field the
Engine has is either judged or listed as harmless."""

from __future__ import annotations

from pathlib import Path

from allocator.core.access import powers, powers_table
from allocator.core.api import fields

DOC = Path(__file__).resolve().parents[2] / "docs" / "exclusivity.md"


def capability_rows() -> list[str]:
    allowed = [f"| `{c}` | allowed | {why} |" for c, why in powers_table.ALLOWED_CAPS.items()]
    refused = [
        f"| `{c}` | refused | {why} |"
        for c, why in powers_table.CAP_HARM.items()
        if c not in powers_table.ALLOWED_CAPS
    ]
    return allowed + refused


def power_rows() -> list[str]:
    table = powers_table
    named = [
        *((p, f"`{f}`", why) for f, (p, why) in table.NAMESPACE_WHY.items()),
        *((p, "`SecurityOpt`", why) for p, why in table.SECURITY_OPTS.values()),
        *((p, f"`{f}`", why) for p, (f, why) in table.OTHER_POWERS.items()),
    ]
    return [f"| `{p}` | {f} | {why} |" for p, f, why in named]


def doc_rows(first_header: str) -> list[str]:
    """The rows of the doc's table whose header starts with ``first_header``."""
    lines = DOC.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first_header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def test_the_docs_capability_table_is_the_allow_lists():
    assert doc_rows("| Capability |") == capability_rows()


def test_the_docs_table_of_other_powers_is_the_allow_lists():
    assert doc_rows("| Power (`policy.powers` key) |") == power_rows()


def test_every_power_a_refusal_names_can_be_granted():
    assert {row.split("`")[1] for row in power_rows()} <= powers.GRANTABLE
    assert set(powers_table.CAP_HARM) <= powers.GRANTABLE


def test_every_hostconfig_field_is_judged_or_listed_harmless_and_no_other():
    judged, harmless = set(powers_table.JUDGED_FIELDS), set(powers_table.HARMLESS_FIELDS)
    assert not judged & harmless
    assert judged | harmless == set(fields.HOST_CONFIG)
