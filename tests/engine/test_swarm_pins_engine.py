"""Swarm's variable on a local host, on a real dockerd: ``DOCKER_RESOURCE_GPU=void`` (the
pin a service's tasks carry) is accepted on a local create, and an image whose ENV sets
``DOCKER_RESOURCE_GPU`` is handled the same at its create and its start: the shim pins the
variable to void, so the image runs, with no GPU from its ENV."""

from __future__ import annotations

from tests.support import engine
from tests.support.busybox_image import busybox_rootfs_tar
from tests.support.clients import docker_cli
from tests.support.faults import IMAGE, real, shim

SWARM_ENV_IMAGE = "gpu-alloc-test/local-swarm-env:latest"


def env_of(stack: engine.Stack, cid: str) -> list[str]:
    return engine.engine_api(stack.engine_sock).inspect_container(cid)["Config"]["Env"]


def test_the_void_pin_is_accepted_on_a_local_gpu_create(stack):
    pinned = ("-e", "DOCKER_RESOURCE_GPU=void")
    for args in ((*pinned, "--gpus", "1"), pinned):
        out = shim(stack, "run", "--rm", *args, IMAGE, "true")
        assert out.returncode == 0, (args, out.stderr)
    out = real(stack, "run", "--rm", *pinned, IMAGE, "true")
    assert out.returncode == 0, out.stderr
    named = shim(stack, "run", "--rm", "-e", "DOCKER_RESOURCE_GPU=GPU-0", "--gpus", "1",
                 IMAGE, "true")  # fmt: skip
    assert named.returncode != 0 and "DOCKER_RESOURCE_GPU" in named.stderr


def test_an_image_setting_the_swarm_variable_is_created_and_started_alike(stack):
    gpu = "GPU-00000000-0000-0000-0000-000000000000"  # the stack's first GPU
    done = docker_cli(stack.engine_sock, "import", "--change", f"ENV DOCKER_RESOURCE_GPU={gpu}",
                      "--change", 'CMD ["sh"]', "-", SWARM_ENV_IMAGE,
                      input=busybox_rootfs_tar())  # fmt: skip
    assert done.returncode == 0, done.stderr
    made = shim(stack, "create", "--name", "swarmenv", SWARM_ENV_IMAGE, "true")
    assert made.returncode == 0, made.stderr
    started = shim(stack, "start", "-a", "swarmenv")
    assert started.returncode == 0, started.stderr + stack.logs()
    assert "DOCKER_RESOURCE_GPU=void" in env_of(stack, made.stdout.strip())
    assert shim(stack, "rm", "swarmenv").returncode == 0
