"""docs/design.md's map of the code, held to the tree: every module of allocator/,
plugin/ and shim/ is listed there with its one-line job, and nothing listed is missing.

The map is the first code block of its section; each line is one of three: a directory
at the margin with its words (``allocator/host/  I/O adapters``), a module indented two
spaces with its job on the same line (``  engine.py  the Engine client``), or more words
of the directory above, indented further.  A module's job is its one line: a line the
map cannot read that way is an error, not skipped.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"
PACKAGES = ("allocator", "plugin", "shim")
SECTION = "## The map of the code"

DIRECTORY = re.compile(r"(?P<dir>\S+/)(?: {2,}\S.*)?")
MODULE = re.compile(r"  (?P<name>[\w.]+\.py) {2,}(?P<job>\S.*)")
MORE = re.compile(r" {4,}\S.*")


def the_map(text: str) -> list[str]:
    """The lines of the section's first code block."""
    section = text.split(SECTION, 1)[1]
    return section.split("```\n", 2)[1].splitlines()


def read(lines: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """Each module listed (its path) with its jobs (one per listing), and the lines the
    map's format does not read."""
    listed: dict[str, list[str]] = {}
    unread: list[str] = []
    directory, words = "", False  # ``words``: a directory's words may go on below it
    for line in lines:
        if m := DIRECTORY.fullmatch(line):
            directory, words = m["dir"], True
        elif (m := MODULE.fullmatch(line)) and directory:
            listed.setdefault(directory + m["name"], []).append(m["job"])
            words = False
        elif not (words and MORE.fullmatch(line)):
            unread.append(line)
    return listed, unread


def holds_code(path: Path) -> bool:
    body = ast.parse(path.read_text()).body
    return any(not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)) for n in body)


def modules() -> set[str]:
    """Every module in the tree; an ``__init__.py`` when it holds more than a docstring."""
    return {
        str(p.relative_to(ROOT))
        for package in PACKAGES
        for p in (ROOT / package).rglob("*.py")
        if p.name != "__init__.py" or holds_code(p)
    }


LISTED, UNREAD = read(the_map(DESIGN.read_text()))


def test_every_module_in_the_tree_is_on_the_map() -> None:
    assert sorted(modules() - LISTED.keys()) == []


def test_every_module_on_the_map_is_in_the_tree() -> None:
    assert sorted(LISTED.keys() - modules()) == []


def test_every_line_of_the_map_is_a_directory_a_module_or_a_directorys_words() -> None:
    """So each module's job is the one line it is listed on."""
    assert UNREAD == []


def test_each_module_is_listed_once() -> None:
    assert sorted(path for path, jobs in LISTED.items() if len(jobs) > 1) == []


def test_the_reading_finds_modules_their_jobs_and_what_it_cannot_read() -> None:
    """The checks above would pass on a reading that found nothing."""
    listed, unread = read(
        [
            "allocator/host/     I/O adapters: files,",
            "                    sockets",
            "  engine.py         the Engine client",
            "                    a module's second line",
            "  lonely.py",
        ]
    )
    assert listed == {"allocator/host/engine.py": ["the Engine client"]}
    assert unread == ["                    a module's second line", "  lonely.py"]
    assert LISTED["allocator/core/placement/__init__.py"]
    assert len(LISTED) > 150
