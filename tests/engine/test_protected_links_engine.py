"""Protected paths configured through a link, on a real dockerd: a bind is judged by where
it resolves, so gpu-alloc's state directory given as ``<link>/state`` (``/var/run`` is a
link to ``/run`` on Debian) is protected by its target as well as by its spelling."""

from __future__ import annotations

import pytest

from tests.support import engine
from tests.support.faults import IMAGE

SOCKETS = ["engine_sock", "shim_sock"]


def make_stack() -> engine.Stack:
    stack = engine.Stack(gpus=1)
    (stack.dir / "real").mkdir()
    (stack.dir / "link").symlink_to(stack.dir / "real")
    stack.state_dir = stack.dir / "link" / "state"
    return stack


@pytest.mark.parametrize("sock", SOCKETS)
@pytest.mark.parametrize("spelling", ["link", "real"])
def test_a_bind_of_the_state_dir_is_refused_by_either_spelling(stack, sock, spelling):
    source = stack.dir / spelling / "state"
    out = engine.docker_cli(getattr(stack, sock), "create", "-v", f"{source}:/st", IMAGE, "true")
    assert out.returncode != 0, out.stdout
    assert "gpu-alloc refused" in out.stderr and "/state" in out.stderr, out.stderr


@pytest.mark.parametrize("sock", SOCKETS)
def test_a_bind_beside_the_state_dir_is_created_as_before(stack, sock):
    (stack.dir / "real" / "data").mkdir(exist_ok=True)
    source = stack.dir / "link" / "data"
    out = engine.docker_cli(getattr(stack, sock), "create", "-v", f"{source}:/d", IMAGE, "true")
    assert out.returncode == 0, out.stderr
