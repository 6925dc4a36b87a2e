"""Two faults an operator hits: a second server started by hand, and the GPU list unreadable.

A second `gpu-alloc shim` or `gpu-alloc plugin` must refuse and leave the live one
serving (it used to take the socket over, then delete it on exit).  With the
inventory unreadable, work that touches no GPU goes on on both sockets; only a GPU
create is refused, naming the file and the cause.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from tests.support import engine
from tests.support.engine import BUSYBOX_TAG as IMAGE
from tests.support.engine import docker_cli


def _second(stack: engine.Stack, role: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*engine.gpu_alloc_command(), "--config", str(stack.config_path), role],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("role", ["shim", "plugin"])
def test_a_second_copy_refuses_and_the_first_keeps_serving(stack: engine.Stack, role: str) -> None:
    sock = stack.shim_sock if role == "shim" else stack.plugin_sock
    second = _second(stack, role)
    assert second.returncode != 0
    assert f"gpu-alloc {role} is already running on {sock}" in second.stderr
    # The shim still proxies, and dockerd still gets the plugin's answers (a denial
    # proves the plugin answered: dockerd would fail the call otherwise).
    ok = docker_cli(stack.shim_sock, "run", "--rm", IMAGE, "true")
    assert ok.returncode == 0, ok.stderr
    denied = docker_cli(stack.engine_sock, "run", "--rm", "--gpus", "1", IMAGE, "true")
    assert denied.returncode != 0 and "without a gpu-alloc lease" in denied.stderr


@pytest.fixture(params=["gone", "corrupt"])
def unreadable_inventory(stack: engine.Stack, request: pytest.FixtureRequest) -> Iterator[str]:
    saved = stack.gpus_file.read_text()
    if request.param == "gone":
        stack.gpus_file.unlink()
    else:
        stack.gpus_file.write_text("gpus: [this is: not: a list\n")
    try:
        yield request.param
    finally:
        stack.gpus_file.write_text(saved)


@pytest.mark.parametrize("via", ["shim", "engine"])
def test_without_an_inventory_work_without_gpus_goes_on(
    stack: engine.Stack, unreadable_inventory: str, via: str
) -> None:
    sock = stack.shim_sock if via == "shim" else stack.engine_sock
    run = docker_cli(sock, "run", "--rm", IMAGE, "echo", "hi")
    assert run.returncode == 0 and "hi" in run.stdout, run.stderr
    made = docker_cli(sock, "create", IMAGE, "sleep", "60")
    assert made.returncode == 0, made.stderr
    cid = made.stdout.strip()
    started = docker_cli(sock, "start", cid)
    assert started.returncode == 0, started.stderr
    execd = docker_cli(sock, "exec", cid, "echo", "inside")
    assert execd.returncode == 0 and "inside" in execd.stdout, execd.stderr


@pytest.mark.parametrize("via", ["shim", "engine"])
def test_without_an_inventory_a_gpu_create_names_the_file(
    stack: engine.Stack, unreadable_inventory: str, via: str
) -> None:
    sock = stack.shim_sock if via == "shim" else stack.engine_sock
    refused = docker_cli(sock, "run", "--rm", "--gpus", "1", IMAGE, "true")
    assert refused.returncode != 0
    assert "cannot read the GPU inventory" in refused.stderr
    assert str(stack.gpus_file) in refused.stderr
    assert "Containers without GPUs still run" in refused.stderr


def test_with_the_inventory_back_gpus_are_leased_again(stack: engine.Stack) -> None:
    saved = stack.gpus_file.read_text()
    stack.gpus_file.unlink()
    assert docker_cli(stack.shim_sock, "run", "--rm", "--gpus", "1", IMAGE, "true").returncode
    stack.gpus_file.write_text(saved)
    ok = docker_cli(stack.shim_sock, "run", "--rm", "--gpus", "1", IMAGE, "true")
    assert ok.returncode == 0, ok.stderr
