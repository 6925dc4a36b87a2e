"""The documentation's links resolve: every relative link in README.md, BENCHMARKS.md and
docs/*.md names a file of the repository, and a `#anchor` names a heading of its page as
GitHub spells it; README.md stays short enough to read first (docs/ holds the rest)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "BENCHMARKS.md", *(ROOT / "docs").glob("*.md")])
README_MOST_LINES = 400

LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose(text: str) -> list[str]:
    """The lines outside fenced code blocks, where links and headings are read."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces
    to hyphens (`--gpus 0` keeps its hyphens)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.replace("`", "").replace("*", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in prose(page.read_text()):
        if m := HEADING.match(line):
            base = slug(m[2])
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> list[str]:
    code = re.compile(r"`[^`]*`")
    return [t for line in prose(page.read_text()) for t in LINK.findall(code.sub("", line))]


def broken(page: Path) -> list[str]:
    out = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            out.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            out.append(f"{target}: no heading #{anchor} in {dest.name}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken(page) == []


def test_every_docs_page_is_linked_from_the_index() -> None:
    index = ROOT / "docs" / "README.md"
    named = {(index.parent / t.partition("#")[0]).resolve() for t in links(index)}
    pages = {p.resolve() for p in (ROOT / "docs").glob("*.md") if p.name != "README.md"}
    assert pages - named == set()


def test_the_readme_links_the_index_and_stays_short() -> None:
    readme = ROOT / "README.md"
    assert "docs/README.md" in links(readme)
    assert len(readme.read_text().splitlines()) <= README_MOST_LINES


def test_a_broken_link_and_a_missing_anchor_are_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## The `--gpus 0` rule\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#the---gpus-0-rule) [gone](missing.md) [no](other.md#nothing)\n"
        "```\n[in code](ignored.md)\n```\n[web](https://example.com) [self](#page)\n# Page\n"
    )
    assert broken(page) == [
        "missing.md: no such file",
        "other.md#nothing: no heading #nothing in other.md",
    ]
