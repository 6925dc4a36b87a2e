"""Tests that need root but no dockerd (device nodes made with mknod, mount namespaces);
marked `root`, and skipped where the run is not root."""

from __future__ import annotations

import pytest

from tests.support.kinds import mark_below


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_below(__file__, items, pytest.mark.root)
