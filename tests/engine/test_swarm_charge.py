"""Services on a swarm whose policy names whom dockerd's own socket's GPU services count for
(``swarm.engine_socket_services: {charge: <owner>}``), and who may bind dockerd's socket
into a service's tasks (``policy.engine_socket_binds``): tests/support/swarm.py, with
gpu-alloc on every node.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.engine.test_swarm_gpu_alloc import service
from tests.support import engine_root, host_users
from tests.support.clients import docker_cli
from tests.support.swarm import SwarmLab

OPS = engine_root.host_user("ga34bops")  # whom dockerd's socket's GPU services count for
BINDER = engine_root.host_user("ga34bbind")  # may bind dockerd's socket
OTHER = engine_root.host_user("ga34bother")  # neither
PINS = ["--env", "NVIDIA_VISIBLE_DEVICES=void", "--env", "DOCKER_RESOURCE_GPU=void"]


def make_swarm_lab() -> SwarmLab:
    limits = {"users": {OPS: {"gpus": 2}, OTHER: {"gpus": 2}}}
    return SwarmLab(nodes=2, gpus_per_node=2, gpu_alloc=True, local_gpus=1,
                    policy={"limits": limits, "engine_socket_binds": {"users": [BINDER]}},
                    swarm={"engine_socket_services": {"charge": OPS}})  # fmt: skip


@pytest.fixture
def users(swarm_lab: SwarmLab) -> Iterator[SwarmLab]:
    with host_users.present(OPS, BINDER, OTHER):
        host_users.open_lab_shim(swarm_lab)
        yield swarm_lab
        swarm_lab.clear()


def test_a_gpu_service_on_dockerds_socket_counts_for_the_owner_the_policy_names(
    users: SwarmLab,
) -> None:
    real, shim = users.sock(1), users.shim(1)
    two = service(users, real, "root2", "--replicas", "2", "--generic-resource", "gpu=1", *PINS)
    assert two.returncode == 0, two.stderr
    more = service(users, real, "root1", "--generic-resource", "gpu=1", *PINS)
    assert more.returncode != 0, more.stdout
    assert f"{OPS} may hold 2 GPUs in swarm at once" in more.stderr, more.stderr
    assert "would make 3 (now 2)" in more.stderr and f"counts for {OPS}" in more.stderr
    theirs = service(users, shim, "ops1", "--generic-resource", "gpu=1", user=OPS)
    assert theirs.returncode != 0 and "would make 3 (now 2)" in theirs.stderr, theirs.stderr
    other = service(users, shim, "other", "--generic-resource", "gpu=1", user=OTHER)
    assert other.returncode == 0, other.stderr  # not charged for root's
    fewer = docker_cli(real, "service", "scale", "-d", "root2=1")
    assert fewer.returncode == 0, fewer.stderr  # scaling down is always allowed
    now = service(users, shim, "ops1", "--generic-resource", "gpu=1", user=OPS)
    assert now.returncode == 0, now.stderr


def test_a_charged_service_still_may_not_carry_gpu_allocs_labels(users: SwarmLab) -> None:
    done = service(users, users.sock(1), "lab", "--generic-resource", "gpu=1", *PINS,
                   "--label", f"io.gpu-alloc.owner=1:{OTHER}")  # fmt: skip
    assert done.returncode != 0 and "io.gpu-alloc.owner" in done.stderr, done.stderr
    assert users.docker(1, "service", "ls", "-q").stdout.split() == []


def test_an_owner_the_policy_names_binds_dockerds_socket_in_a_service(users: SwarmLab) -> None:
    bind = ["--mount", f"type=bind,src={users.sock(1)},dst=/var/run/docker.sock"]
    shim = users.shim(1)
    theirs = service(users, shim, "agent", *bind, "--replicas", "0", user=BINDER)
    assert theirs.returncode == 0, theirs.stderr
    for who, sock in ((OTHER, shim), (None, users.sock(1))):
        refused = service(users, sock, "agent2", *bind, "--replicas", "0", user=who)
        assert refused.returncode != 0, refused.stdout
        assert "policy.engine_socket_binds" in refused.stderr, refused.stderr
