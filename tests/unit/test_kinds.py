"""A test's kind is its directory: every test file is in one, each directory marks only its
own tests, and `make test` runs each directory somewhere.  Every core module has its own
pure test file."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import run_engines
from tests.support import kinds

TESTS = Path(__file__).resolve().parents[1]
KINDS = ("unit", "root", "browser", "engine", "installed")
CORE = TESTS.parent / "allocator" / "core"


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


def core_test_file(module: Path) -> tuple[str, Path]:
    """A core module's dotted name and its test file, named after the module alone within
    its concern (allocator/core/rules/queue.py -> tests/unit/test_queue.py), and a
    placement policy by its package too (allocator/core/placement/numa.py ->
    test_placement_numa.py; its __init__.py -> test_placement.py)."""
    parts = module.relative_to(CORE).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    dotted = ".".join(("allocator", "core", *parts))
    named = parts if parts[0] == "placement" else parts[-1:]
    return dotted, TESTS / "unit" / f"test_{'_'.join(named)}.py"


def holds_code(module: Path) -> bool:
    """A concern's __init__.py holds its docstring only: nothing to test."""
    body = ast.parse(module.read_text()).body
    return any(not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)) for n in body)


def imported(test: Path) -> set[str]:
    """Every module a file imports, and every name it imports from one, dotted."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(test.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_a_core_modules_test_file_is_named_after_it() -> None:
    assert core_test_file(CORE / "rules" / "queue.py") == (
        "allocator.core.rules.queue",
        TESTS / "unit" / "test_queue.py",
    )
    assert core_test_file(CORE / "placement" / "numa.py")[1].name == "test_placement_numa.py"
    assert core_test_file(CORE / "placement" / "__init__.py") == (
        "allocator.core.placement",
        TESTS / "unit" / "test_placement.py",
    )


def test_every_core_module_has_its_own_test_file_that_imports_it() -> None:
    """The pure tests of allocator/core/x.py are in tests/unit/test_x.py (tests/README.md)."""
    modules = [m for m in sorted(CORE.rglob("*.py")) if m != CORE / "__init__.py" and holds_code(m)]
    assert len(modules) > 40
    missing = []
    for module in modules:
        dotted, test = core_test_file(module)
        if not test.is_file() or dotted not in imported(test):
            missing.append(f"{module.relative_to(TESTS.parent)}: {test.relative_to(TESTS.parent)}")
    assert missing == []
