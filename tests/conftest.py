"""Shared fixtures: private Docker Engines (see tests/support/engine.py).

Tests marked `engine` (or using an engine fixture) need root and docker.io.
Where those are missing they are skipped on a developer machine but FAIL when
$CI is set: CI must never pass by silently skipping the real-Engine tests.

The Engine of the run is `--engine` (or $GA_ENGINE): 20.10 (the host's, default),
26, 28 or 29 (from a Debian root built on first use, tests/support/engine_root.py), and
`--gpu-mode` (or $GA_GPU_MODE) how its dockerds give --gpus (tests/support/cdi.py); the
report header names them.  The one reason an engine test is skipped even under CI is the
Debian archive failing to give a root that day, or an Engine's own binaries (29's, from
the shared directory beside the checkout) being absent: that is said loudly, in the
header, in each skip and in a banner at the end.
"""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Callable, Iterator

import pytest
from hypothesis import HealthCheck, settings

from tests.support import cdi, clients, engine, engine_root

# A verdict that reads a fact it does not declare (allocator/core/judging/route_checks.py's READS)
# fails the test, here and in every plugin or shim a test starts, instead of being judged
# again on every fact as a running service does (allocator/service/gather.py).
os.environ["GPU_ALLOC_STRICT_FACTS"] = "1"

# Property tests check behaviour, not speed: on a loaded 2-core CI machine a per-example
# deadline only makes them flaky.  Speed is measured by the benchmarks.
settings.register_profile("gpu-alloc", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("gpu-alloc")

ENGINE_FIXTURES = frozenset({"bare_engine", "stack_factory", "stack"})
ARCHIVE_BANNER = engine_root.ARCHIVE_BANNER


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--engine",
        default=None,
        help="dockerd to test: 20.10 (the host's), 26 (Debian trixie root), 28 (sid root), "
        "29 (the sid root with dockerd 29 from ../shared/engines); "
        "default $GA_ENGINE, else 20.10",
    )
    parser.addoption(
        "--gpu-mode",
        default=None,
        choices=cdi.MODES,
        help="how the test dockerds give --gpus: hook (the toolkit's runtime hook) or cdi "
        "(tests/support/cdi.py); default $GA_GPU_MODE, else hook",
    )


def pytest_configure(config: pytest.Config) -> None:
    """--engine wins over $GA_ENGINE (--gpu-mode over $GA_GPU_MODE); the env carries them
    to every helper and subprocess."""
    name = config.getoption("--engine")
    if name:
        os.environ["GA_ENGINE"] = engine_root.lookup(name).name
    mode = config.getoption("--gpu-mode")
    if mode:
        os.environ["GA_GPU_MODE"] = mode


@functools.cache
def engine_state() -> tuple[str, str | None, str | None]:
    """(what the Engine says it is, the banner and why its root is unavailable from the
    archive or the shared binaries, why it failed otherwise); builds a root Engine's root
    on first use."""
    eng = engine_root.selected()
    try:
        if eng.root is not None and engine.missing_requirements(eng) is None:
            engine_root.ensure_root(eng)
    except engine_root.BinariesAbsent as e:
        return f"{eng.name} (Debian {eng.suite})", f"{engine_root.ABSENT_BANNER}: {e}", None
    except engine_root.ArchiveUnavailable as e:
        return f"{eng.name} (Debian {eng.suite})", f"{ARCHIVE_BANNER}: {e}", None
    except Exception as e:  # a real failure: engine tests fail under CI
        return f"{eng.name} (Debian {eng.suite})", None, f"{type(e).__name__}: {e}"
    if eng.root is not None:
        lines = engine_root.stamp(eng).splitlines()
        said = next((ln.partition(": ")[2] for ln in lines if ln.startswith("dockerd:")), "?")
        compose = next((ln for ln in lines if ln.startswith("docker-compose ")), "")
        mode = "; --gpus through CDI" if cdi.mode() == "cdi" else ""
        root = f"{eng.name} (Debian {eng.suite} root): {said}; Compose v2 {compose}{mode}"
        return root, None, None
    try:
        argv = [engine.which("dockerd") or "dockerd", "--version"]
        said = subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip()
    except OSError as e:
        said = f"not runnable ({e})"
    return f"{eng.name} (host): {said}; Compose v1 (docker-compose)", None, None


def pytest_report_header(config: pytest.Config) -> list[str]:
    said, archive, _ = engine_state()
    lines = [f"engine: {said}"]
    if archive:
        lines.append(f"!!! {archive.splitlines()[0]}")
    return lines


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Nothing left in /tmp: the client configs of CLIs a test left running."""
    clients.remove_client_configs()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The Engine again at the end: `-q` (as make test runs) prints no header."""
    said, archive, _ = engine_state()
    terminalreporter.write_line(f"engine: {said}")
    if archive:
        banner, _, why = archive.partition(": ")
        terminalreporter.write_sep("!", f"{banner} ({said})", red=True, bold=True)
        terminalreporter.write_line(why, red=True)
        terminalreporter.write_sep("!", "engine tests of this Engine were SKIPPED", red=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that uses an engine fixture as `engine`, so `-m 'not engine'` works."""
    for item in items:
        if ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.engine)


def require_engine() -> None:
    """Skip (locally) or fail (under $CI) when a private dockerd cannot run here."""
    why = engine.missing_requirements()
    if why is None:
        said, archive, failed = engine_state()
        if archive:  # not this code's fault, nor this machine's: loud, but no CI failure
            banner, _, why = archive.partition(": ")
            pytest.skip(f"{banner} for Engine {said}: {why.splitlines()[0]}")
        if failed is None:
            return
        why = f"Engine {said} unavailable: {failed}"
    if os.environ.get("CI"):
        pytest.fail(f"engine test cannot run under CI: {why}", pytrace=False)
    pytest.skip(why)


@pytest.fixture(autouse=True)
def _kind_requirements(request: pytest.FixtureRequest) -> None:
    """What a test's kind (its directory, tests/README.md) needs: root, or a private dockerd."""
    if request.node.get_closest_marker("root") is not None and os.geteuid() != 0:
        pytest.skip("needs root: device nodes made with mknod, mount namespaces")
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
