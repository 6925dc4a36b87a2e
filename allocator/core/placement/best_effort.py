"""The best-linked GPUs, keeping the best-linked sets for whoever comes next.

NVIDIA's go-gpuallocator ``besteffort_policy``: each pair of GPUs scores by the
link between them (its weights, in `PCIE_WEIGHTS` and `NVLINK_WEIGHT`), a set
scores the sum over its pairs.  Taking the best set now can split the pairs the
next job wants (a greedy pick on a PCIe box with two NVLink bridges may take one
GPU of each bridge), so the set chosen is the one that, together with the best
way to cut the GPUs left free into sets of the same size, scores highest; ties
(an NVSwitch board, where every pair looks alike) go to fewer NUMA nodes, the
lowest node, then the lowest indices.

The look-ahead is exact up to `EXACT_LIMIT` free GPUs (a DGX has 8); beyond, the
pick is greedy, so a large host stays fast.  It depends only on the pair scores of
the free GPUs and the set size, so it is remembered across calls (`_future_of`): a
host's free sets recur, and the search over them is the dearest part of placing a lease.
So is the whole pick, by the free and required GPUs and the size (`_allocate`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache, lru_cache
from itertools import combinations

from allocator.core.machine.inventory import GPU

# go-gpuallocator's weights (gpuallocator/device.go, calculateGPUPairScore).
PCIE_WEIGHTS = {
    "cross-cpu": 10,
    "same-cpu": 20,
    "host-bridge": 30,
    "multi-switch": 40,
    "single-switch": 50,
    "same-board": 60,
}
NVLINK_WEIGHT = 100  # per link
EXACT_LIMIT = 12


def pair_score(a: GPU, b: GPU) -> int:
    links = max(a.nvlinks_to(b.index), b.nvlinks_to(a.index))
    return NVLINK_WEIGHT * links + PCIE_WEIGHTS.get(a.pcie_to(b) or "", 0)


def set_score(gpus: Sequence[GPU]) -> int:
    return sum(pair_score(a, b) for a, b in combinations(gpus, 2))


def allocate(available: Sequence[GPU], required: Sequence[GPU], size: int) -> list[GPU] | None:
    picked = _allocate(tuple(available), tuple(required), size)
    return None if picked is None else list(picked)


@lru_cache(maxsize=256)
def _allocate(
    available: tuple[GPU, ...], required: tuple[GPU, ...], size: int
) -> tuple[GPU, ...] | None:
    """The pick itself: a pure function of the free GPUs, so a host's recurring free sets
    are ranked once (ranking every candidate again would cost a lease more than its file work)."""
    if size < len(required) or any(g not in available for g in required):
        return None
    free = sorted(available, key=lambda g: g.index)
    rest = [g for g in free if g not in required]
    need = size - len(required)
    if need > len(rest):
        return None
    pairs = _pairs(tuple(free))
    score = _scorer(pairs)
    # A single GPU should not split a pair: what is left is judged as pairs then.
    future = _future_of(pairs, max(size, 2), len(free) <= EXACT_LIMIT)
    everyone = frozenset(g.index for g in free)
    best: tuple[tuple[int, ...], list[GPU]] | None = None
    for extra in combinations(rest, need):
        chosen = sorted([*required, *extra], key=lambda g: g.index)
        own = score([g.index for g in chosen])
        rank = _rank(chosen, own, future(everyone - {g.index for g in chosen}))
        if best is None or rank > best[0]:
            best = (rank, chosen)
    return None if best is None else tuple(best[1])


def _rank(chosen: list[GPU], own: int, left_score: int) -> tuple[int, ...]:
    """Higher is better: the total kept, this set's own score, then the tie-breaks."""
    nodes = {-1 if g.numa_node is None else g.numa_node for g in chosen}
    return (own + left_score, own, -len(nodes), -min(nodes, default=0), *(-g.index for g in chosen))


Pairs = tuple[tuple[tuple[int, int], int], ...]  # ((index a, index b), score), a < b


@lru_cache(maxsize=64)
def _pairs(free: tuple[GPU, ...]) -> Pairs:
    return tuple(((a.index, b.index), pair_score(a, b)) for a, b in combinations(free, 2))


@lru_cache(maxsize=64)
def _scorer(pairs: Pairs) -> Callable[[Sequence[int]], int]:
    table = dict(pairs)

    def score(indices: Sequence[int]) -> int:  # indices in ascending order
        return sum(table[p] for p in combinations(indices, 2))

    return score


@lru_cache(maxsize=64)
def _future_of(pairs: Pairs, size: int, exact: bool) -> Callable[[frozenset[int]], int]:
    """The best total score the GPUs left (by index) can still be cut into sets of ``size``."""
    score = _scorer(pairs)

    @cache
    def best(left: frozenset[int]) -> int:
        if not exact or len(left) < size:
            return 0
        first, *others = sorted(left)
        skip = best(left - {first})  # the lowest GPU stays out of every set
        return max(
            [skip]
            + [
                score((first, *group)) + best(left - {first, *group})
                for group in combinations(others, size - 1)
            ]
        )

    return best
