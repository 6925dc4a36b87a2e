"""What a toolkit that reads swarm-resource gives gpu-alloc's containers, on a real dockerd.

A toolkit configured with ``swarm-resource`` (docs/swarm.md has operators set it) reads
``DOCKER_RESOURCE_<kind>`` instead of ``NVIDIA_VISIBLE_DEVICES`` whenever the container
sets it.  The fake hook and the swarm lab's fake runtime record each container's spec,
and tests/support/toolkit.py says which GPUs the real toolkit would give it: a local
``--gpus`` through the shim gets exactly its lease, on a swarm node and on a plain host,
and a swarm task its reservation.
"""

from __future__ import annotations

import json

import pytest

from tests.support import engine, swarm, toolkit
from tests.support.clients import docker_cli
from tests.support.swarm import SwarmLab

LOCAL = 2  # each swarm node's GPUs for local leases (its first one is swarm's)
SWARM_RESOURCE = 'swarm-resource = "DOCKER_RESOURCE_GPU"\n'


def make_swarm_lab() -> SwarmLab:
    return SwarmLab(nodes=2, gpus_per_node=1, gpu_alloc=True, local_gpus=LOCAL)


@pytest.fixture
def clean(swarm_lab: SwarmLab):
    yield swarm_lab
    swarm_lab.clear()


def leased(sock: str, container: str) -> set[str]:
    """The GPUs the shim leased the container: its device request's ids, by UUID."""
    done = docker_cli(sock, "inspect", "--format", "{{json .HostConfig.DeviceRequests}}",
                      container)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return {u for r in json.loads(done.stdout) for u in r["DeviceIDs"]}


def test_the_lab_s_nodes_run_a_toolkit_that_reads_swarm_resource(swarm_lab: SwarmLab) -> None:
    for node in swarm_lab.nodes.values():
        config = toolkit.Config.from_toml(node.toolkit_config.read_text())
        assert config.swarm_resource == ("DOCKER_RESOURCE_GPU",), node.toolkit_config


@pytest.mark.parametrize(("gpus", "count"), [("1", 1), ("all", LOCAL)])
def test_a_local_gpu_run_on_a_swarm_node_gets_exactly_its_leased_gpus(
    clean: SwarmLab, gpus: str, count: int
) -> None:
    for i in clean.nodes:
        done = docker_cli(clean.shim(i), "run", "-d", "--gpus", gpus, engine.BUSYBOX_TAG,
                          "sleep", "600")  # fmt: skip
        assert done.returncode == 0, done.stderr
        container = done.stdout.strip()
        lease = leased(clean.sock(i), container)
        assert len(lease) == count and lease <= set(clean.node_gpus(i)[1:]), lease
        (run,) = [r for r in clean.runs() if r.container == container]
        assert run.gpus == lease, (run, lease)
        assert docker_cli(clean.shim(i), "rm", "-f", container).returncode == 0


def test_swarm_tasks_get_their_reservation_beside_local_leases(clean: SwarmLab) -> None:
    local = docker_cli(clean.shim(2), "run", "-d", "--gpus", "1", engine.BUSYBOX_TAG,
                       "sleep", "600")  # fmt: skip
    assert local.returncode == 0, local.stderr
    done = docker_cli(
        clean.shim(1), "service", "create", "-d", "--name", "tasks", "--replicas", "2",
        "--generic-resource", "gpu=1", "--stop-signal", "KILL", "--no-resolve-image",
        "--network", "host", engine.BUSYBOX_TAG, "sleep", "600",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    runs = clean.task_runs("tasks", 2)
    assert sorted((r.node, r.gpus) for r in runs) == [
        (1, frozenset({swarm.uuid(1, 0)})),
        (2, frozenset({swarm.uuid(2, 0)})),
    ], runs
    (mine,) = [r for r in clean.runs() if r.container == local.stdout.strip()]
    assert mine.gpus == leased(clean.sock(2), mine.container) != {swarm.uuid(2, 0)}


@pytest.mark.parametrize("config", ["", SWARM_RESOURCE], ids=["defaults", "swarm-resource"])
@pytest.mark.parametrize(("gpus", "count"), [("1", 1), ("all", 4)])
def test_a_gpu_run_on_a_plain_host_gets_exactly_its_leased_gpus(
    stack: engine.Stack, config: str, gpus: str, count: int
) -> None:
    assert stack.dockerd is not None
    if stack.dockerd.gpu_mode == "cdi":
        pytest.skip("under CDI dockerd runs no toolkit hook")
    stack.dockerd.toolkit_config.write_text(config)
    done = docker_cli(stack.shim_sock, "run", "-d", "--gpus", gpus, engine.BUSYBOX_TAG,
                      "sleep", "600")  # fmt: skip
    assert done.returncode == 0, done.stderr
    container = done.stdout.strip()
    lease = leased(stack.engine_sock, container)
    assert len(lease) == count
    assert stack.dockerd.toolkit_gpus(container) == lease
