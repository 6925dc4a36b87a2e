"""Tests in a real headless browser (Debian's chromium): the dashboard as people see it;
marked `browser`, and skipped where chromium is missing.  Kept out of the unit tier: each
page costs a browser's start, a few seconds mostly spent waiting on it."""

from __future__ import annotations

import pytest

from tests.support.kinds import mark_below


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_below(__file__, items, pytest.mark.browser)
