"""People on the host, for Engine tests that run the docker CLI as someone other than root."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tests.support import engine


@contextlib.contextmanager
def present(*users: str, groups: Mapping[str, str] | None = None) -> Iterator[None]:
    """Each of ``users`` exists inside the block: made when missing (no home, no shell),
    removed at its end.  ``groups`` (user -> group) adds a user to a group, made first and
    removed after."""
    groups = groups or {}
    for group in set(groups.values()):
        subprocess.run(["groupadd", "-f", group], check=True)
    for user in users:
        if subprocess.run(["id", user], capture_output=True).returncode != 0:
            extra = ["-G", groups[user]] if user in groups else []
            subprocess.run(["useradd", "-M", "-s", "/bin/false", *extra, user], check=True)
    try:
        yield
    finally:
        for user in users:
            subprocess.run(["userdel", user], capture_output=True)
        for group in set(groups.values()):
            subprocess.run(["groupdel", group], capture_output=True)


def open_shim(stack: Any) -> None:
    """Anyone may reach the stack's shim socket (and nothing else of the stack's directory),
    as the installed shim's socket is open to its users."""
    os.chmod(stack.dir, 0o711)
    os.chmod(stack.shim_sock, 0o666)


def open_lab_shim(lab: Any, node: int = 1) -> None:
    """Anyone may reach a swarm lab node's shim socket (and no other)."""
    sock = Path(lab.shim(node))
    for d in (lab.dir, *[p for p in sock.parents if lab.dir in p.parents]):
        os.chmod(d, 0o711)
    os.chmod(sock, 0o666)


def gpu_alloc_as(user: str, config: Path, *args: str) -> subprocess.CompletedProcess:
    """`gpu-alloc --config CONFIG ARGS` as ``user``, its exit status the caller's to check.
    The venv's interpreter may be one only root can reach (pyenv's, under /root): the
    host's python of the same version then runs the CLI from the venv's packages."""
    cli = [*engine.gpu_alloc_command(), "--config", str(config), *args]
    try:
        return _run_as(user, cli)
    except PermissionError:
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        host = shutil.which(version, path="/usr/bin:/usr/local/bin")
        if host is None:
            raise
    packages = sysconfig.get_paths()["purelib"]  # with the checkout's editable install
    start = (
        f"import site, sys; site.addsitedir({packages!r}); "
        "from allocator.ops.cli import main; sys.exit(main())"
    )
    return _run_as(user, [host, "-c", start, "--config", str(config), *args])


def _run_as(user: str, argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, user=user)
