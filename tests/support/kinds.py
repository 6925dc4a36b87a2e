"""A test's kind is the directory it lives in: each kind's conftest.py marks what is under it.

pytest hands every conftest's `pytest_collection_modifyitems` the whole session's items,
so a directory's conftest marks only the items whose file is below it.
"""

from __future__ import annotations

from pathlib import Path

import pytest


def mark_below(conftest: str, items: list[pytest.Item], *marks: pytest.MarkDecorator) -> None:
    """Add `marks` to every item collected from a file under `conftest`'s directory."""
    here = Path(conftest).resolve().parent
    for item in items:
        if item.path.resolve().is_relative_to(here):
            for mark in marks:
                item.add_marker(mark)
