"""Shared fixtures: private Docker Engines (see tests/engine.py).

Tests marked `engine` (or using an engine fixture) need root and docker.io.
Where those are missing they are skipped on a developer machine but FAIL when
$CI is set: CI must never pass by silently skipping the real-Engine tests.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest
from hypothesis import HealthCheck, settings

from tests import engine

# Property tests check behaviour, not speed: on a loaded 2-core CI machine a per-example
# deadline only makes them flaky.  Speed is measured by the benchmarks.
settings.register_profile("gpu-alloc", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("gpu-alloc")

ENGINE_FIXTURES = frozenset({"bare_engine", "stack_factory", "stack"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that uses an engine fixture as `engine`, so `-m 'not engine'` works."""
    for item in items:
        if ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.engine)


def require_engine() -> None:
    """Skip (locally) or fail (under $CI) when a private dockerd cannot run here."""
    why = engine.missing_requirements()
    if why is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"engine test cannot run under CI: {why}", pytrace=False)
    pytest.skip(why)


@pytest.fixture(autouse=True)
def _engine_requirements(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("engine") is not None:
        require_engine()


@pytest.fixture(scope="session")
def bare_engine() -> Iterator[engine.Dockerd]:
    """A private dockerd with no authz plugin and busybox imported as engine.BUSYBOX_TAG.

    Shared by the whole session: tests must clean up the containers they create.
    """
    require_engine()
    dockerd = engine.Dockerd().start()
    try:
        engine.import_busybox(dockerd.sock)
        yield dockerd
    finally:
        dockerd.stop()


# ---------------------------------------------------------------------------------------------
# FULL STACK (plugin + dockerd --authorization-plugin + shim): for the lead to build on.
# `stack_factory(gpus=4)` returns a started engine.Stack; everything is stopped at teardown.
# Clients use stack.shim_sock; stack.engine_sock is dockerd itself (still behind the plugin).
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def stack_factory() -> Iterator[Callable[..., engine.Stack]]:
    require_engine()
    started: list[engine.Stack] = []

    def start(gpus: int = 4) -> engine.Stack:
        stack = engine.start_stack(gpus=gpus)
        started.append(stack)
        return stack

    yield start
    for stack in reversed(started):
        stack.stop()


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest) -> Iterator[engine.Stack]:
    """One started stack per test module: the module's `make_stack()`, else 4 GPUs.

    Every test that uses it leaves no container behind (`_no_containers_left`), so each
    starts with every GPU free.
    """
    require_engine()
    make = getattr(request.module, "make_stack", None) or (lambda: engine.Stack(gpus=4))
    s = make().start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(autouse=True)
def _no_containers_left(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "stack" in request.fixturenames:
        engine.remove_all_containers(request.getfixturevalue("stack").engine_sock)
