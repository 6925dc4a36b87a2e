"""GPU services across a Docker Swarm: several dockerds on one machine, each a swarm node
whose fake GPUs are generic resources (tests/support/swarm.py, the `swarm_lab` fixture).

Swarm's scheduler hands each task the UUIDs it claimed as DOCKER_RESOURCE_GPU; the fake
nvidia runtime records that env per container, which is what these tests read.  dockerd
20.10's constraint enforcer rejects one generic-resource task per node update (moby#44378):
every stack here stops on SIGKILL, and the tests wait for the end state rather than
asserting the path to it.
"""

from __future__ import annotations

import time

from tests.support import swarm
from tests.support.swarm import SwarmLab


def make_swarm_lab() -> SwarmLab:
    return SwarmLab(nodes=2, gpus_per_node=2)


def live_gpus(lab: SwarmLab) -> list[tuple[int, str]]:
    """(node, UUID) of every running container on every node, from the runtime's log."""
    live = {
        (i, cid)
        for i in lab.nodes
        for cid in lab.docker(i, "ps", "-q", "--no-trunc").stdout.split()
    }
    return [(r.node, r.resource() or "") for r in lab.runs() if (r.node, r.container) in live]


def settle(lab: SwarmLab, service: str, running: int, pending: int = 0) -> list[str]:
    """The task states once `running` run and `pending` wait (or after 60 s)."""
    deadline = time.monotonic() + 60
    while True:
        states = lab.task_states(service)
        done = states.count("Running") == running and states.count("Pending") == pending
        if (done and len(live_gpus(lab)) == running) or time.monotonic() > deadline:
            return states
        time.sleep(0.3)


def deploy(lab: SwarmLab, replicas: int) -> None:
    path = swarm.stack_file(lab.dir, [("g", replicas, 1)])
    done = lab.docker(1, "stack", "deploy", "--resolve-image", "never", "-c", str(path), "st")
    assert done.returncode == 0, done.stderr


def test_stack_deploy_places_tasks_on_distinct_gpus_of_each_node(swarm_lab: SwarmLab) -> None:
    try:
        deploy(swarm_lab, 3)
        states = settle(swarm_lab, "st_g", running=3)
        assert states.count("Running") == 3, states
        gpus = live_gpus(swarm_lab)
        assert len(gpus) == 3 and len(set(gpus)) == 3, gpus
        for node, gpu in gpus:
            assert gpu in {swarm.uuid(node, k) for k in range(2)}, (node, gpu)
        assert {node for node, _ in gpus} == {1, 2}  # spread across both nodes
    finally:
        swarm_lab.remove_services()


def test_scaling_past_the_pool_leaves_tasks_pending_not_sharing(swarm_lab: SwarmLab) -> None:
    try:
        deploy(swarm_lab, 1)
        assert settle(swarm_lab, "st_g", running=1).count("Running") == 1
        done = swarm_lab.docker(1, "service", "scale", "-d", "st_g=6")
        assert done.returncode == 0, done.stderr
        states = settle(swarm_lab, "st_g", running=4, pending=2)
        assert sorted(states) == ["Pending"] * 2 + ["Running"] * 4, states
        gpus = live_gpus(swarm_lab)
        assert sorted(gpus) == sorted((n, swarm.uuid(n, k)) for n in (1, 2) for k in range(2))
    finally:
        swarm_lab.remove_services()
