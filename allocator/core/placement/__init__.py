"""Placement policies: ``allocate(available, required, size)``, one policy a file.

The interface follows NVIDIA's go-gpuallocator: ``available`` are the free GPUs,
``required`` must be part of the answer, and the answer has ``size`` GPUs or is
``None`` (all-or-nothing: never a partial grant).  Policies are pure functions
of their arguments, so they are tested without any I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from allocator.core.ask import Ask
from allocator.core.inventory import GPU, Inventory
from allocator.core.leases import Holder
from allocator.core.placement import best_effort, first_fit, numa

Policy = Callable[[Sequence[GPU], Sequence[GPU], int], list[GPU] | None]

POLICIES: dict[str, Policy] = {
    "best-effort": best_effort.allocate,
    "numa": numa.allocate,
    "first-fit": first_fit.allocate,
}


@dataclass(frozen=True)
class Shortage:
    msg: str


def place(
    ask: Ask, inventory: Inventory, held: Mapping[str, Holder], policy: Policy
) -> list[GPU] | Shortage:
    """Pick GPUs for `ask` among those not in ``held`` (UUID -> `Holder`); all or nothing."""
    free = [g for g in inventory.gpus if g.uuid not in held and not g.busy]
    if ask.every:
        required = list(inventory.gpus)
        size = len(required)
    else:
        required = [g for g in inventory.gpus if g.uuid in ask.required]
        size = len(required) + ask.count
    taken = [g for g in required if g not in free]
    picked = None if taken else policy(free, required, size)
    if picked is not None:
        return picked
    return Shortage(_shortage_text(ask, size, free, taken, inventory, held))


def _shortage_text(
    ask: Ask,
    size: int,
    free: Sequence[GPU],
    taken: Sequence[GPU],
    inventory: Inventory,
    held: Mapping[str, Holder],
) -> str:
    asked = "all GPUs" if ask.every else f"{size} GPU{'s' * (size != 1)}"
    if taken:
        asked += " including " + ", ".join(f"GPU {g.index} ({g.uuid})" for g in taken)
    holders = "; ".join(
        f"GPU {g.index} held by {held[g.uuid].describe()}"
        if g.uuid in held
        else f"GPU {g.index} busy with host processes"
        for g in inventory.gpus
        if g not in free
    )
    return (
        f"gpu-alloc: not enough free GPUs: asked for {asked}, {len(free)} of "
        f"{len(inventory.gpus)} free"
        + (f" ({holders})" if holders else "")
        + ". Remove a container that holds GPUs, or ask for fewer; 'gpu-alloc status' "
        "shows who holds what"
    )
