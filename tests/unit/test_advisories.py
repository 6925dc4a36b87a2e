"""The Engine's advisories by version (allocator/core/access/advisories.py)."""

from __future__ import annotations

import pytest

from allocator.core.access import advisories
from allocator.core.access.facts import engine_version


def named(version: str) -> set[str]:
    return {a.cve for a in advisories.affecting(engine_version(version))}


@pytest.mark.parametrize(
    ("version", "cves"),
    [
        ("20.10.24+dfsg1", {"CVE-2024-41110", "CVE-2026-34040", "CVE-2026-33997"}),
        ("23.0.14", {"CVE-2024-41110", "CVE-2026-34040", "CVE-2026-33997"}),
        ("23.0.15", {"CVE-2026-34040", "CVE-2026-33997"}),
        ("24.0.9", {"CVE-2024-41110", "CVE-2026-34040", "CVE-2026-33997"}),  # fixed in 25
        ("25.0.5", {"CVE-2024-41110", "CVE-2026-34040", "CVE-2026-33997"}),
        ("25.0.6", {"CVE-2026-34040", "CVE-2026-33997"}),
        ("26.1.4", {"CVE-2024-41110", "CVE-2026-34040", "CVE-2026-33997"}),
        ("26.1.5+dfsg1", {"CVE-2026-34040", "CVE-2026-33997"}),
        ("27.1.0", {"CVE-2024-41110", "CVE-2026-34040", "CVE-2026-33997"}),
        ("27.1.1", {"CVE-2026-34040", "CVE-2026-33997"}),
        ("28.5.2+dfsg1", {"CVE-2026-34040", "CVE-2026-33997"}),
        ("29.3.0", {"CVE-2026-34040", "CVE-2026-33997", "CVE-2026-41567"}),
        ("29.3.1", {"CVE-2026-41567"}),
        ("29.5.0", {"CVE-2026-41567"}),
        ("29.5.1", set()),
        ("29.7.2-dev", set()),
        ("29.10.0", set()),
    ],
)
def test_each_engine_version_is_named_with_the_advisories_it_is_affected_by(
    version: str, cves: set[str]
) -> None:
    assert named(version) == cves


def test_an_unreadable_version_names_none_and_each_advisory_names_its_fix() -> None:
    assert advisories.affecting(None) == ()
    fixes = {a.cve: a.fixed_in for a in advisories.ADVISORIES}
    assert fixes["CVE-2024-41110"] == "23.0.15 / 25.0.6 / 26.1.5 / 27.1.1"
    assert fixes["CVE-2026-34040"] == "29.3.1"
    assert fixes["CVE-2026-41567"] == "29.5.1"


def test_only_the_advisory_that_gives_host_root_is_severe_and_refuses_a_route() -> None:
    severe = [a.cve for a in advisories.ADVISORIES if a.severe]
    assert severe == ["CVE-2026-41567"]
    assert [a.cve for a in advisories.ADVISORIES if a.denies] == severe
