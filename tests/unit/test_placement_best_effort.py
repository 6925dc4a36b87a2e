"""The best-effort policy: link-scored GPU sets on the shapes of real servers.

Two shapes: a DGX-like 8-GPU NVSwitch board (every pair 12 NVLinks through the
switches; GPUs 0-3 on NUMA node 0, 4-7 on node 1; pairs under one PCIe switch)
and a 4-GPU PCIe server whose NVLink bridges join GPUs 0-2 and 1-3.
"""

from collections.abc import Sequence
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.core.judging.ask import Ask
from allocator.core.leases.holders import Holder
from allocator.core.machine.inventory import GPU, Inventory
from allocator.core.placement import Shortage, place
from allocator.core.placement.best_effort import allocate, pair_score, set_score


def dgx() -> list[GPU]:
    return [
        GPU(
            uuid=f"GPU-{i}",
            index=i,
            numa_node=i // 4,
            pcie_switch=f"sw{i // 2}",
            nvlinks=tuple((p, 12) for p in range(8) if p != i),
        )
        for i in range(8)
    ]


def bridged() -> list[GPU]:
    peer = {0: 2, 2: 0, 1: 3, 3: 1}
    return [
        GPU(
            uuid=f"GPU-{i}",
            index=i,
            numa_node=0,
            nvlinks=((peer[i], 4),),
            pcie=tuple((p, "host-bridge") for p in range(4) if p != i),
        )
        for i in range(4)
    ]


def indices(picked: Sequence[GPU] | None) -> list[int] | None:
    return None if picked is None else [g.index for g in picked]


def without(pool: list[GPU], *taken: int) -> list[GPU]:
    return [g for g in pool if g.index not in taken]


def test_the_weights_are_go_gpuallocators() -> None:
    a, b = GPU("GPU-a", 0, numa_node=0), GPU("GPU-b", 1, numa_node=1)
    assert pair_score(a, b) == 10  # cross-CPU
    assert pair_score(a, GPU("GPU-c", 2, numa_node=0)) == 20  # same CPU
    levels = {"host-bridge": 30, "multi-switch": 40, "single-switch": 50, "same-board": 60}
    for level, weight in levels.items():
        assert pair_score(GPU("GPU-a", 0, pcie=((1, level),)), GPU("GPU-b", 1)) == weight
    linked = GPU("GPU-a", 0, numa_node=0, nvlinks=((1, 2),))
    assert pair_score(linked, b) == pair_score(b, linked) == 210  # each NVLink 100


def test_a_set_scores_the_sum_over_its_pairs() -> None:
    pool = bridged()
    assert set_score(pool[:3]) == 3 * 30 + 400
    assert set_score(pool[:1]) == 0


DGX = {
    "2 GPUs: a pair under one PCIe switch, node 0": ((), 2, [0, 1]),
    "2 GPUs with 0 taken: the next whole pair, not 1": ((0,), 2, [2, 3]),
    "4 GPUs: one NUMA node": ((), 4, [0, 1, 2, 3]),
    "4 GPUs with node 0 half taken: node 1 whole": ((0, 2), 4, [4, 5, 6, 7]),
    "1 GPU with 0 taken: 1, alone on its switch now": ((0,), 1, [1]),
    "8 GPUs: the whole board": ((), 8, list(range(8))),
}


@pytest.mark.parametrize(("taken", "size", "expected"), DGX.values(), ids=DGX.keys())
def test_dgx_like_nvswitch_board(taken: tuple[int, ...], size: int, expected: list[int]) -> None:
    assert indices(allocate(without(dgx(), *taken), [], size)) == expected


BRIDGED = {
    "2 GPUs: the bridged pair 0-2, not the first two": ((), 2, [0, 2]),
    "2 GPUs after 0-2: the other bridge": ((0, 2), 2, [1, 3]),
    "2 GPUs with 0 taken: 1-3 bridged, 2 left alone": ((0,), 2, [1, 3]),
    "1 GPU with 0 taken: 2, so the 1-3 bridge stays whole": ((0,), 1, [2]),
    "3 GPUs: a bridge plus one": ((), 3, [0, 1, 2]),
}


@pytest.mark.parametrize(("taken", "size", "expected"), BRIDGED.values(), ids=BRIDGED.keys())
def test_pcie_server_with_two_nvlink_bridges(
    taken: tuple[int, ...], size: int, expected: list[int]
) -> None:
    assert indices(allocate(without(bridged(), *taken), [], size)) == expected


def test_a_required_gpu_gets_its_bridge_partner() -> None:
    pool = bridged()
    assert indices(allocate(pool, [pool[3]], 2)) == [1, 3]


def chain() -> list[GPU]:
    """0=1 (2 links), 1=2 (3 links), 2=3 (2 links): the greedy pair 1-2 strands 0 and 3."""
    links = {0: {1: 2}, 1: {0: 2, 2: 3}, 2: {1: 3, 3: 2}, 3: {2: 2}}
    return [GPU(f"GPU-{i}", i, nvlinks=tuple(links[i].items())) for i in range(4)]


def test_the_pick_keeps_the_best_sets_for_the_gpus_left_free() -> None:
    pool = chain()
    greedy = max(combinations(pool, 2), key=set_score)
    assert indices(list(greedy)) == [1, 2]
    assert indices(allocate(pool, [], 2)) == [0, 1]  # leaves 2=3 whole: 400 kept, not 300


# --- properties ------------------------------------------------------------------------------


@st.composite
def boards(draw: st.DrawFn) -> list[GPU]:
    n = draw(st.integers(1, 7))
    links: dict[int, dict[int, int]] = {i: {} for i in range(n)}
    for a, b in combinations(range(n), 2):
        count = draw(st.sampled_from([0, 0, 1, 2, 4, 12]))
        if count:
            links[a][b] = links[b][a] = count
    nodes = draw(st.lists(st.sampled_from([0, 1, None]), min_size=n, max_size=n))
    switches = draw(st.lists(st.sampled_from(["a", "b", None]), min_size=n, max_size=n))
    return [
        GPU(
            f"GPU-{i}",
            i,
            numa_node=nodes[i],
            pcie_switch=switches[i],
            nvlinks=tuple(links[i].items()),
        )
        for i in range(n)
    ]


def best_cut(free: Sequence[GPU], size: int) -> int:
    """Brute force: the best total of disjoint sets of ``size`` among ``free``."""
    if size < 2 or len(free) < size:
        return 0
    first, rest = free[0], list(free[1:])
    best = best_cut(rest, size)
    for group in combinations(rest, size - 1):
        left = [g for g in rest if g not in group]
        best = max(best, set_score([first, *group]) + best_cut(left, size))
    return best


@settings(max_examples=150, deadline=None)
@given(boards(), st.data())
def test_the_pick_never_keeps_less_than_the_greedy_pick(
    pool: list[GPU], data: st.DataObject
) -> None:
    size = data.draw(st.integers(1, len(pool)))
    picked = allocate(pool, [], size)
    assert picked is not None and len(set(picked)) == size

    def kept(chosen: Sequence[GPU]) -> int:
        return set_score(chosen) + best_cut([g for g in pool if g not in chosen], max(size, 2))

    greedy = max(combinations(pool, size), key=set_score)
    assert kept(picked) >= kept(greedy)
    assert kept(picked) == max(kept(c) for c in combinations(pool, size))


@settings(max_examples=100, deadline=None)
@given(boards(), st.lists(st.integers(1, 4), max_size=8))
def test_a_run_of_requests_never_grants_a_gpu_twice(pool: list[GPU], sizes: list[int]) -> None:
    inventory = Inventory(tuple(pool))
    held: dict[str, Holder] = {}
    for n, size in enumerate(sizes):
        free_before = len(pool) - len(held)
        picked = place(Ask((), size, False, ("gpu",)), inventory, held, allocate)
        if isinstance(picked, Shortage):
            assert free_before < size
            continue
        assert len({g.uuid for g in picked}) == size
        assert not {g.uuid for g in picked} & held.keys()
        held |= {g.uuid: Holder(None, f"job{n}", "test", f"lease{n}", "pending") for g in picked}


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(["dgx", "bridged"]), st.sampled_from([2, 4]), st.data())
def test_on_both_shapes_a_request_gets_a_best_linked_free_set(
    shape: str, size: int, data: st.DataObject
) -> None:
    pool = dgx() if shape == "dgx" else bridged()
    taken = data.draw(st.sets(st.sampled_from(range(len(pool))), max_size=len(pool) - size))
    free = without(pool, *taken)
    picked = allocate(free, [], size)
    assert picked is not None
    assert set_score(picked) == max(set_score(c) for c in combinations(free, size))
