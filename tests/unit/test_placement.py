"""allocator.placement: all-or-nothing policies, by example and by property."""

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.core.inventory import GPU
from allocator.core.placement import POLICIES, best_effort, first_fit, numa


def gpus(*nodes: int | None) -> list[GPU]:
    """GPU i on NUMA node nodes[i]."""
    return [GPU(uuid=f"GPU-{i}", index=i, numa_node=n) for i, n in enumerate(nodes)]


def indices(picked: Sequence[GPU] | None) -> list[int] | None:
    return None if picked is None else [g.index for g in picked]


def test_the_policies_are_registered_under_their_config_names() -> None:
    assert {
        "best-effort": best_effort.allocate,
        "numa": numa.allocate,
        "first-fit": first_fit.allocate,
    } == POLICIES


# --- behaviour common to both policies ---------------------------------------------------------

COMMON = {
    "one GPU out of four": ([0, 1, 2, 3], [], 1, [0]),
    "every available GPU": ([0, 1, 2, 3], [], 4, [0, 1, 2, 3]),
    "one more than available: nothing, never a partial answer": ([0, 1, 2, 3], [], 5, None),
    "nothing available": ([], [], 1, None),
    "size zero": ([0, 1], [], 0, []),
    "required GPUs only": ([0, 1, 2, 3], [2, 3], 2, [2, 3]),
    "a required GPU that is not available": ([0, 1], [2], 1, None),
    "required plus more than the rest can give": ([0, 1], [1], 3, None),
    "fewer than the required GPUs": ([0, 1, 2], [0, 1], 1, None),
}


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize(
    ("available", "required", "size", "expected"), COMMON.values(), ids=COMMON.keys()
)
def test_common_behaviour(
    policy: str, available: list[int], required: list[int], size: int, expected: list[int] | None
) -> None:
    pool = gpus(0, 0, 1, 1)
    answer = POLICIES[policy]([pool[i] for i in available], [pool[i] for i in required], size)
    assert indices(answer) == expected


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_required_gpus_are_always_part_of_the_answer(policy: str) -> None:
    pool = gpus(0, 0, 1, 1, 2, 2)
    answer = POLICIES[policy](pool, [pool[5], pool[1]], 3)
    assert answer is not None and {1, 5} <= set(indices(answer) or ())
    assert len(answer) == 3


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_the_answer_is_ordered_by_index(policy: str) -> None:
    pool = gpus(1, 1, 0, 0)
    answer = POLICIES[policy](list(reversed(pool)), [pool[3]], 3)
    assert indices(answer) == sorted(indices(answer) or [])


# --- first-fit ---------------------------------------------------------------------------------


def test_first_fit_takes_the_lowest_free_indices_whatever_the_numa_layout() -> None:
    pool = gpus(0, 1, 1, 1)
    assert indices(first_fit.allocate(pool, [], 2)) == [0, 1]


def test_first_fit_skips_gpus_that_are_not_available() -> None:
    pool = gpus(0, 0, 0, 0, 0)
    assert indices(first_fit.allocate([pool[4], pool[1], pool[3]], [], 2)) == [1, 3]


def test_first_fit_fills_up_required_gpus_with_the_lowest_others() -> None:
    pool = gpus(0, 0, 0, 0)
    assert indices(first_fit.allocate(pool, [pool[3]], 3)) == [0, 1, 3]


# --- numa --------------------------------------------------------------------------------------

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


# --- properties --------------------------------------------------------------------------------


@st.composite
def requests(draw: st.DrawFn) -> tuple[list[GPU], list[GPU], list[GPU], int]:
    nodes = draw(st.lists(st.one_of(st.none(), st.integers(0, 3)), max_size=10))
    pool = gpus(*nodes)
    available = draw(st.permutations(pool).map(lambda p: p[: draw(st.integers(0, len(p)))]))
    # Mostly available required GPUs (satisfiable asks), sometimes any GPU of the host.
    source = available if available and draw(st.integers(0, 3)) else pool
    required = draw(st.lists(st.sampled_from(source), unique=True)) if source else []
    size = draw(st.integers(len(required), max(len(required), len(available)) + 1))
    return pool, available, required, size


@pytest.mark.parametrize("policy", sorted(POLICIES))
@settings(max_examples=300, deadline=None)
@given(request=requests())
def test_the_answer_is_none_or_exactly_size_distinct_available_gpus_with_the_required(
    policy: str, request: tuple[list[GPU], list[GPU], list[GPU], int]
) -> None:
    _, available, required, size = request
    answer = POLICIES[policy](available, required, size)
    feasible = set(required) <= set(available) and len(required) <= size <= len(available)
    if answer is None:
        assert not feasible, "a satisfiable request was refused"
        return
    assert feasible
    assert len(answer) == size
    assert len(set(answer)) == size
    assert set(answer) <= set(available)
    assert set(required) <= set(answer)


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
