"""Pure tests: no root, no dockerd, no network (temporary files are fine); marked `unit`."""

from __future__ import annotations

import pytest

from tests.support.kinds import mark_below


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_below(__file__, items, pytest.mark.unit)
