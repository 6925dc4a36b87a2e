"""The wheel install.sh installs from holds every package of the source tree."""

from __future__ import annotations

import tomllib
from pathlib import Path

import setuptools

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_of_the_source_tree_goes_into_the_wheel() -> None:
    """A package left out installs fine and fails at the first import, on the host."""
    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    shipped = set(setuptools.find_packages(str(ROOT), include=found["packages"]["find"]["include"]))
    packages = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in ("allocator", "plugin", "shim")
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert len(packages) > 5
    assert packages - shipped == set()
    assert not {p for p in shipped if p.split(".")[0] not in ("allocator", "plugin", "shim")}
