"""What a create asks of the allocator (allocator/core/judging/ask.py): its leasable grants
summed."""

from __future__ import annotations

from allocator.core.access.grants import Access, Demand, Grant
from allocator.core.judging.ask import Ask, ask_of


def grant(field: str, demand: Demand, gpus: frozenset[str] | None = None) -> Grant:
    return Grant(field, "asked", gpus, demand)


def test_counts_add_up_and_named_gpus_are_required_once_in_order() -> None:
    access = Access((
        grant("HostConfig.DeviceRequests[0]", Demand(count=2)),
        grant("HostConfig.DeviceRequests[1]", Demand(ids=("GPU-b", "GPU-a")),
              frozenset({"GPU-b", "GPU-a"})),
        grant("Env NVIDIA_VISIBLE_DEVICES", Demand(ids=("GPU-a",)), frozenset({"GPU-a"})),
    ))  # fmt: skip
    asked = ask_of(access)
    assert asked == Ask(("GPU-a", "GPU-b"), 2, False, ("gpu",))
    assert asked.any


def test_one_grant_of_every_gpu_makes_the_ask_every_gpu() -> None:
    access = Access((grant("a", Demand(count=1)), grant("b", Demand(all=True))))
    assert ask_of(access).every


def test_capabilities_are_merged_without_repeats() -> None:
    access = Access((
        grant("a", Demand(count=1, caps=("gpu", "utility"))),
        grant("b", Demand(count=1, caps=("utility", "compute"))),
    ))  # fmt: skip
    assert ask_of(access).caps == ("gpu", "utility", "compute")


def test_no_grant_asks_for_nothing() -> None:
    asked = ask_of(Access())
    assert asked == Ask((), 0, False, ("gpu",))
    assert not asked.any
