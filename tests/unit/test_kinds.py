"""A test's kind is its directory: every test file is in one, each directory marks only its
own tests, and `make test` runs each directory somewhere."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import run_engines
from tests.support import kinds

TESTS = Path(__file__).resolve().parents[1]
KINDS = ("unit", "root", "engine", "installed")


@dataclass
class Item:
    path: Path
    marks: list[pytest.MarkDecorator] = field(default_factory=list)

    def add_marker(self, mark: pytest.MarkDecorator) -> None:
        self.marks.append(mark)


def test_every_test_file_is_in_the_directory_of_its_kind() -> None:
    stray = [
        str(p.relative_to(TESTS))
        for p in TESTS.rglob("test_*.py")
        if p.relative_to(TESTS).parts[0] not in KINDS
    ]
    assert stray == []
    for kind in KINDS:
        assert (TESTS / kind / "conftest.py").is_file(), kind


def test_a_directory_marks_its_own_tests_and_no_others(tmp_path: Path) -> None:
    below = Item(tmp_path / "engine" / "test_a.py")
    deeper = Item(tmp_path / "engine" / "sub" / "test_b.py")
    beside = Item(tmp_path / "engineering" / "test_c.py")
    kinds.mark_below(str(tmp_path / "engine" / "conftest.py"), [below, deeper, beside],
                     pytest.mark.engine, pytest.mark.installed)  # fmt: skip
    assert below.marks == deeper.marks == [pytest.mark.engine, pytest.mark.installed]
    assert beside.marks == []


def test_the_engine_facing_suites_are_real_engine_files_that_exist() -> None:
    """A path make test runs on 26 and 28 that names no file would drop those tests."""
    for path in run_engines.ENGINE_SUITES:
        assert Path(path).parent == Path("tests/engine"), path
        assert (TESTS.parent / path).is_file(), path
    assert run_engines.INSTALL_TIER == "tests/installed"
