"""Tests against a real private dockerd (tests/support/engine.py); marked `engine`, so
they skip without root and docker.io, and fail instead under $CI (tests/conftest.py)."""

from __future__ import annotations

import pytest

from tests.support.kinds import mark_below


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_below(__file__, items, pytest.mark.engine)
