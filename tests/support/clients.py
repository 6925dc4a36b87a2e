"""The docker CLI and Compose, as a user runs them, against a test Engine's socket.

Compose follows the Engine of the run: Debian's docker-compose 1.29 (v1) on the
host's 20.10, and the root's Compose v2 plugin (`docker compose`) on 26 and 28,
since that is what people run against those Engines.  v2 runs as a plugin of the
root's own docker CLI, copied into the throwaway client config of each call.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping

from tests.support import engine_root
from tests.support.engine_root import Engine

_counter = itertools.count()


def which(tool: str) -> str | None:
    """``tool`` on PATH or in the system's sbin and bin directories (root's PATH may lack
    /usr/sbin, where Debian keeps dockerd and runc)."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin:/usr/bin:/sbin:/bin"])
    return shutil.which(tool, path=path)


def docker_bin(engine: Engine | None = None) -> str:
    """`$GA_DOCKER_CLI` (several CLI versions may be installed); else, for an Engine from a
    root, that root's own CLI (the version its users run, whatever the host has: it runs
    on the host); else `docker` on PATH."""
    if os.environ.get("GA_DOCKER_CLI"):
        return os.environ["GA_DOCKER_CLI"]
    engine = engine or engine_root.selected()
    if engine.root is not None:
        cli = engine_root.ensure_root(engine) / "usr/bin/docker"
        if cli.exists():
            return str(cli)
    return which("docker") or "docker"


# Every client config `_client_env` made: each caller removes its own when its client is
# done, and the session's end (tests/conftest.py) whatever a client left running kept.
_configs: list[str] = []


def remove_client_configs() -> None:
    """Remove every client config `_client_env` made that is still there."""
    while _configs:
        shutil.rmtree(_configs.pop(), ignore_errors=True)


def _client_env(sock: str | os.PathLike[str], env: Mapping[str, str] | None) -> dict[str, str]:
    """The caller's env minus any DOCKER_*, pointed at `sock`, with a throwaway client config."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "COMPOSE_"))}
    base["DOCKER_HOST"] = "unix://" + os.fspath(sock)
    base["DOCKER_CONFIG"] = tempfile.mkdtemp(prefix="ga-cfg-", dir="/tmp")
    _configs.append(base["DOCKER_CONFIG"])
    base.update(env or {})
    return base


def docker_cli(
    sock: str | os.PathLike[str],
    *args: str,
    env: Mapping[str, str] | None = None,
    input: str | bytes | None = None,
    timeout: float = 120,
    user: str | None = None,
    cwd: str | None = None,
) -> subprocess.CompletedProcess:
    """Run the `docker` CLI against `sock`; text output; never raises on a non-zero exit.

    ``user`` runs it as that (non-root) user, as a person on a shared host would; ``cwd``
    is where it runs (the CLI makes a relative ``--mount`` source absolute from there).
    """
    full_env = _client_env(sock, env)
    if user is not None:
        shutil.chown(full_env["DOCKER_CONFIG"], user)
        full_env["HOME"] = full_env["DOCKER_CONFIG"]
    try:
        return subprocess.run(
            [docker_bin(), "-H", full_env["DOCKER_HOST"], *args],
            env=full_env,
            input=input,
            capture_output=True,
            text=not isinstance(input, bytes),
            timeout=timeout,
            check=False,
            user=user,
            cwd=cwd,
        )
    finally:
        shutil.rmtree(full_env["DOCKER_CONFIG"], ignore_errors=True)


def compose_v2(engine: Engine | None = None) -> bool:
    """True when Compose runs as v2 (`docker compose`): on the Engines from a root."""
    return (engine or engine_root.selected()).root is not None


def compose_version(engine: Engine | None = None) -> int:
    """The Compose major version the helpers run on `engine` (else the run's): 1 or 2."""
    return 2 if compose_v2(engine) else 1


def compose_name(project: str, service: str, number: int, engine: Engine | None = None) -> str:
    """The container name Compose gives replica `number`: v1 `p_s_1`, v2 `p-s-1`."""
    sep = "-" if compose_v2(engine) else "_"
    return sep.join([project, service, str(number)])


def _compose_argv(engine: Engine, config_dir: str, version: int) -> list[str]:
    if version == 1:
        compose = which("docker-compose")
        if compose is None:
            raise RuntimeError("docker-compose not found; install it (make deps)")
        return [compose, "--no-ansi"]
    plugin = engine_root.ensure_root(engine) / engine_root.COMPOSE_PLUGIN
    plugins = os.path.join(config_dir, "cli-plugins")
    os.makedirs(plugins, exist_ok=True)
    shutil.copy2(plugin, os.path.join(plugins, "docker-compose"))
    return [docker_bin(engine), "compose", "--ansi", "never", "--progress", "plain"]


def docker_compose(
    sock: str | os.PathLike[str],
    project_dir: str | os.PathLike[str],
    *args: str,
    project_name: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 180,
    engine: Engine | None = None,
    version: int | None = None,
) -> subprocess.CompletedProcess:
    """Run Compose in `project_dir` (its docker-compose.yml) against `sock`: v1 1.29 on the
    host Engine, the root's v2 on a root Engine (`engine`, else the run's); `version`
    forces one (v2 needs a root Engine's plugin)."""
    engine = engine or engine_root.selected()
    version = version or compose_version(engine)
    if version == 2 and engine.root is None:
        engine = engine_root.ENGINES["28"]  # the newest Compose v2 plugin we have
    full_env = _client_env(sock, env)
    full_env["COMPOSE_PROJECT_NAME"] = project_name or f"ga{os.getpid()}x{next(_counter)}"
    try:
        return subprocess.run(
            [*_compose_argv(engine, full_env["DOCKER_CONFIG"], version), *args],
            cwd=project_dir,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    finally:
        shutil.rmtree(full_env["DOCKER_CONFIG"], ignore_errors=True)
