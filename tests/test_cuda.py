"""The CUDA compatibility check (nvidia-docker v1's), unit and against the real Engine."""

from __future__ import annotations

import pytest

from allocator.core import cuda
from tests import engine
from tests.conftest import require_engine


@pytest.mark.parametrize(
    ("config", "env", "need"),
    [
        ({"Env": ["NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=470"]}, [], (12, 4)),
        ({"Labels": {"com.nvidia.cuda.version": "11.8"}}, [], (11, 8)),
        ({"Env": ["CUDA_VERSION=12.1.1"]}, [], (12, 1)),
        ({"Env": ["CUDA_VERSION=12.1.1", "NVIDIA_REQUIRE_CUDA=cuda>=12.0"]}, [], (12, 0)),
        ({"Env": ["PATH=/bin"]}, [], None),
        ({"Env": ["CUDA_VERSION=12.1"]}, ["NVIDIA_DISABLE_REQUIRE=1"], None),
        ({}, ["NVIDIA_REQUIRE_CUDA=cuda>=13.0"], (13, 0)),
    ],
    ids=["require", "v1-label", "cuda-version", "require-wins", "none", "disabled", "create-env"],
)
def test_the_required_cuda_version_is_read_like_the_toolkit(config, env, need):
    assert cuda.required(config, env) == need


def test_an_old_driver_is_refused_with_both_versions_and_a_fix():
    msg = cuda.refusal((12, 2), (12, 4), "nvidia/cuda:12.4.1-base")
    assert "driver supports CUDA 12.2 but image nvidia/cuda:12.4.1-base needs 12.4" in msg
    assert "NVIDIA_DISABLE_REQUIRE=1" in msg
    assert cuda.refusal((12, 4), (12, 4), "x") is None
    assert cuda.refusal(None, (12, 4), "x") is None


@pytest.mark.engine
def test_the_shim_refuses_an_image_the_driver_cannot_run():
    require_engine()
    with engine.Stack(gpus=2, cuda="12.2") as stack:
        api = engine.engine_api(stack.engine_sock)
        base = api.create_container(engine.BUSYBOX_TAG, ["true"])
        api.commit(base["Id"], repository="cuda-app", tag="12.4",
                   changes=["ENV NVIDIA_REQUIRE_CUDA=cuda>=12.4"])  # fmt: skip
        api.remove_container(base["Id"])
        refused = engine.docker_cli(stack.shim_sock, "run", "--rm", "--gpus", "1",
                                    "cuda-app:12.4", "true")  # fmt: skip
        assert refused.returncode != 0
        assert "driver supports CUDA 12.2 but image cuda-app:12.4 needs 12.4" in refused.stderr
        forced = engine.docker_cli(stack.shim_sock, "run", "--rm", "--gpus", "1", "-e",
                                   "NVIDIA_DISABLE_REQUIRE=1", "cuda-app:12.4", "true")  # fmt: skip
        assert forced.returncode == 0, forced.stderr
        plain = engine.docker_cli(stack.shim_sock, "run", "--rm", "--gpus", "1",
                                  engine.BUSYBOX_TAG, "true")  # fmt: skip
        assert plain.returncode == 0, plain.stderr


@pytest.mark.engine
def test_a_name_that_comes_to_mean_another_image_is_judged_by_the_new_one():
    """The shim keeps images' configs between creates; `docker tag` and `docker rmi` move
    a name, and the very next create through the shim reads the image it means now."""
    require_engine()
    with engine.Stack(gpus=2, cuda="12.2") as stack:
        api = engine.engine_api(stack.engine_sock)
        base = api.create_container(engine.BUSYBOX_TAG, ["true"])
        api.commit(base["Id"], repository="app", tag="old")
        api.commit(base["Id"], repository="app", tag="new",
                   changes=["ENV NVIDIA_REQUIRE_CUDA=cuda>=12.4"])  # fmt: skip
        api.remove_container(base["Id"])

        def run() -> str:
            ran = engine.docker_cli(stack.shim_sock, "run", "--rm", "--gpus", "1",
                                    "app:latest", "true")  # fmt: skip
            return "ran" if ran.returncode == 0 else ran.stderr

        api.tag("app:old", "app", "latest")
        assert [run(), run()] == ["ran", "ran"]  # the second from what the shim kept
        api.tag("app:new", "app", "latest")
        assert "image app:latest needs 12.4" in run()
        api.remove_image("app:latest")
        api.tag("app:old", "app", "latest")
        assert run() == "ran"
