"""Tests against a real private dockerd (tests/support/engine.py); marked `engine`, so
they skip without root and docker.io, and fail instead under $CI (tests/conftest.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.conftest import require_engine
from tests.support import swarm
from tests.support.kinds import mark_below


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_below(__file__, items, pytest.mark.engine)


@pytest.fixture(scope="module")
def swarm_lab(request: pytest.FixtureRequest) -> Iterator[swarm.SwarmLab]:
    """One started swarm (tests/support/swarm.py) per test module: the module's
    `make_swarm_lab()`, else two nodes of two GPUs without gpu-alloc; skipped where it
    cannot run, failed instead under $CI."""
    require_engine()
    why = swarm.missing_requirements()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"swarm lab cannot run under CI: {why}", pytrace=False)
        pytest.skip(why)
    make = getattr(request.module, "make_swarm_lab", None) or (lambda: swarm.SwarmLab())
    lab = make().start()
    try:
        yield lab
    finally:
        lab.stop()
