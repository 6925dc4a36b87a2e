"""The CUDA compatibility check against the real Engine: the shim refuses what the driver
cannot run, and judges a moved tag by its new image (tests/unit/test_cuda.py: the check)."""

from __future__ import annotations

from tests.conftest import require_engine
from tests.support import engine


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
