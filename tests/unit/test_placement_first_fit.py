"""The first-fit policy (allocator/core/placement/first_fit.py): the lowest free indices."""

from __future__ import annotations

from allocator.core.placement import first_fit
from tests.unit.test_placement import gpus, indices


def test_first_fit_takes_the_lowest_free_indices_whatever_the_numa_layout() -> None:
    pool = gpus(0, 1, 1, 1)
    assert indices(first_fit.allocate(pool, [], 2)) == [0, 1]


def test_first_fit_skips_gpus_that_are_not_available() -> None:
    pool = gpus(0, 0, 0, 0, 0)
    assert indices(first_fit.allocate([pool[4], pool[1], pool[3]], [], 2)) == [1, 3]


def test_first_fit_fills_up_required_gpus_with_the_lowest_others() -> None:
    pool = gpus(0, 0, 0, 0)
    assert indices(first_fit.allocate(pool, [pool[3]], 3)) == [0, 1, 3]
