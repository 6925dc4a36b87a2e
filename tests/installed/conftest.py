"""The install tier: gpu-alloc installed into a booted systemd root (tests/support/
systemd_root.py), a part of `make test` of its own; marked `installed` and `engine`."""

from __future__ import annotations

import pytest

from tests.support.kinds import mark_below


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_below(__file__, items, pytest.mark.installed, pytest.mark.engine)
