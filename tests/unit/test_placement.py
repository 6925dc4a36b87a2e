"""The placement package (allocator/core/placement/__init__.py): its policies by config
name, and what every policy answers, by example and by property.  Each policy's own
behaviour is in test_placement_<policy>.py."""

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.core.machine.inventory import GPU
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
