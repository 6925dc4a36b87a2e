"""The numa policy (allocator/core/placement/numa.py): a job's GPUs on one NUMA node
when one can hold them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from allocator.core.machine.inventory import GPU
from allocator.core.placement import numa
from tests.unit.test_placement import gpus, indices, requests

NUMA = {
    "a 2-GPU job stays on one node rather than taking the lowest indices": (
        [0, 1, 1, 1],
        2,
        [1, 2],
    ),
    "the tightest node that fits": ([0, 0, 0, 0, 1, 1, 1, 2, 2], 2, [7, 8]),
    "the tightest node for 3 GPUs": ([0, 0, 0, 0, 1, 1, 1, 2, 2], 3, [4, 5, 6]),
    "a tie between equally tight nodes goes to the lower node": ([1, 1, 0, 0, 2, 2, 2], 2, [2, 3]),
    "one GPU goes to a node with a single free GPU": ([0, 0, 1, 2, 2], 1, [2]),
    "no node fits: spill fullest node first": ([0, 0, 0, 1, 1, 2], 4, [0, 1, 2, 3]),
    "no node fits: spill fullest first, across three nodes": (
        [0, 0, 1, 1, 1, 2, 2, 2, 2],
        8,
        [0, 2, 3, 4, 5, 6, 7, 8],
    ),
    "spill order is by free count, not by node number": ([0, 1, 1, 1, 2, 2], 5, [1, 2, 3, 4, 5]),
    "GPUs without a NUMA node form one group": ([None, None, 0], 2, [0, 1]),
}


@pytest.mark.parametrize(("nodes", "size", "expected"), NUMA.values(), ids=NUMA.keys())
def test_numa_placement(nodes: list[int | None], size: int, expected: list[int] | None) -> None:
    assert indices(numa.allocate(gpus(*nodes), [], size)) == expected


def test_numa_considers_only_available_gpus_when_judging_a_nodes_fit() -> None:
    pool = gpus(0, 0, 0, 1, 1, 1)
    # Node 0 has one GPU left, node 1 two: a 2-GPU job goes to node 1.
    assert indices(numa.allocate([pool[0], pool[4], pool[5]], [], 2)) == [4, 5]


def test_numa_completes_a_job_on_the_node_of_its_required_gpu() -> None:
    pool = gpus(0, 0, 0, 0, 1, 1)
    # Node 1 is tighter, but the required GPU 0 is on node 0.
    assert indices(numa.allocate(pool, [pool[0]], 2)) == [0, 1]


def test_numa_completes_a_job_among_gpus_without_a_numa_node_like_its_required_gpu() -> None:
    pool = gpus(None, None, None, 0)
    # The GPUs without a node are one group: the required GPU 0's group holds the rest.
    assert indices(numa.allocate(pool, [pool[0]], 2)) == [0, 1]


def test_numa_spills_to_the_required_gpus_node_first() -> None:
    pool = gpus(0, 0, 1, 1, 1, 2, 2, 2)
    # Four more GPUs fit on no node: node 0 (the required GPU's) first, then the fullest.
    assert indices(numa.allocate(pool, [pool[0]], 5)) == [0, 1, 2, 3, 4]


def test_numa_prefers_a_node_that_holds_all_extra_gpus_to_the_required_gpus_node() -> None:
    pool = gpus(0, 0, 1, 1, 1)
    # Node 0 has one GPU besides the required one; node 1 holds all three extra GPUs.
    assert indices(numa.allocate(pool, [pool[0]], 4)) == [0, 2, 3, 4]


@settings(max_examples=300, deadline=None)
@given(request=requests())
def test_numa_keeps_the_extra_gpus_on_one_node_whenever_one_node_can_hold_them(
    request: tuple[list[GPU], list[GPU], list[GPU], int],
) -> None:
    _, available, required, size = request
    answer = numa.allocate(available, required, size)
    if answer is None:
        return
    extra = [g for g in answer if g not in required]
    free = [g for g in available if g not in required]
    need = len(extra)
    counts: dict[int | None, int] = {}
    for g in free:
        counts[g.numa_node] = counts.get(g.numa_node, 0) + 1
    if need and any(c >= need for c in counts.values()):
        assert len({g.numa_node for g in extra}) == 1
        node = extra[0].numa_node
        home = [n for n in {g.numa_node for g in required} if counts.get(n, 0) >= need]
        if home:  # a required GPU's node can hold the rest: it does
            assert node in home
        else:  # otherwise the tightest node that fits
            assert counts[node] == min(c for c in counts.values() if c >= need)
