"""A swarm whose GPUs are of a kind other than the default (``swarm.kind: nvidia_gpu``):
services are judged on the kind configured, read like every other fact, so a service
asking for that kind through the shim is pinned, allowed and its task gets only its
reservation; one setting the kind's variable itself is refused."""

from __future__ import annotations

import pytest

from tests.support import engine
from tests.support.clients import docker_cli
from tests.support.swarm import SwarmLab

KIND = "nvidia_gpu"


def make_swarm_lab() -> SwarmLab:
    return SwarmLab(nodes=1, gpus_per_node=2, gpu_alloc=True, local_gpus=1, kind=KIND)


@pytest.fixture
def clean(swarm_lab: SwarmLab):
    yield swarm_lab
    swarm_lab.remove_services()
    engine.remove_all_containers(swarm_lab.sock(1))


def create(lab: SwarmLab, sock: str, name: str, *args: str):
    return docker_cli(sock, "service", "create", "-d", "--name", name, "--stop-signal", "KILL",
                      "--no-resolve-image", "--network", "host", *args, engine.BUSYBOX_TAG,
                      "sleep", "600")  # fmt: skip


def test_a_service_of_the_configured_kind_is_pinned_allowed_and_updated(clean: SwarmLab):
    done = create(clean, clean.shim(1), "train", "--generic-resource", f"{KIND}=1")
    assert done.returncode == 0, done.stderr
    [run] = clean.task_runs("train", 1)
    assert run.resource(KIND) in clean.swarm_gpus(1), run
    assert run.gpus == {run.resource(KIND)}, run  # what the node's toolkit gives it
    assert run.env.get("NVIDIA_VISIBLE_DEVICES") == "void", run
    updated = docker_cli(clean.shim(1), "service", "update", "-d", "--env-add", "A=1", "train")
    assert updated.returncode == 0, updated.stderr


def test_a_local_gpu_run_gets_its_lease_from_a_toolkit_reading_the_kinds_variable(
    clean: SwarmLab,
):
    done = docker_cli(clean.shim(1), "run", "-d", "--gpus", "1", engine.BUSYBOX_TAG,
                      "sleep", "600")  # fmt: skip
    assert done.returncode == 0, done.stderr
    [run] = [r for r in clean.runs() if r.container == done.stdout.strip()]
    assert run.env.get(f"DOCKER_RESOURCE_{KIND.upper()}") == clean.node_gpus(1)[2], run
    assert run.gpus == {clean.node_gpus(1)[2]}, run


def test_a_service_setting_the_kinds_variable_itself_is_refused(clean: SwarmLab):
    done = create(clean, clean.shim(1), "own", "--env",
                  f"DOCKER_RESOURCE_{KIND.upper()}={clean.swarm_gpus(1)[0]}")  # fmt: skip
    assert done.returncode != 0 and "gpu-alloc refused the swarm service" in done.stderr
