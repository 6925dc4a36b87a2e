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
from allocator.core.placement import first_fit, numa

Policy = Callable[[Sequence[GPU], Sequence[GPU], int], list[GPU] | None]

POLICIES: dict[str, Policy] = {
    "numa": numa.allocate,
    "first-fit": first_fit.allocate,
}


@dataclass(frozen=True)
class Shortage:
    msg: str


def place(
    ask: Ask,
    inventory: Inventory,
    held: Mapping[str, Holder],
    policy: Policy,
    unhealthy: Mapping[str, str] | None = None,
) -> list[GPU] | Shortage:
    """Pick GPUs for `ask` among those not in ``held`` (UUID -> `Holder`); all or nothing.

    ``unhealthy`` (UUID -> the event, from allocator.core.health) are never placed; an
    explicit request for one is refused naming its event, since waiting will not help.
    """
    sick = unhealthy or {}
    asked_sick = [g for g in inventory.gpus if g.uuid in ask.required and g.uuid in sick]
    if asked_sick:
        return Shortage(_unhealthy_text(asked_sick, sick))
    free = [g for g in inventory.gpus if g.uuid not in held and not g.busy and g.uuid not in sick]
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
    return Shortage(_shortage_text(ask, size, free, taken, inventory, held, sick))


def _unhealthy_text(gpus: Sequence[GPU], sick: Mapping[str, str]) -> str:
    named = "; ".join(f"GPU {g.index} ({g.uuid}) had {sick[g.uuid]}" for g in gpus)
    return (
        f"gpu-alloc: refused: the GPU you asked for is unhealthy: {named}. Ask for another "
        "GPU; an operator brings it back with 'gpu-alloc health clear GPU' once it is fixed"
    )


def _shortage_text(
    ask: Ask,
    size: int,
    free: Sequence[GPU],
    taken: Sequence[GPU],
    inventory: Inventory,
    held: Mapping[str, Holder],
    sick: Mapping[str, str],
) -> str:
    asked = "all GPUs" if ask.every else f"{size} GPU{'s' * (size != 1)}"
    if taken:
        asked += " including " + ", ".join(f"GPU {g.index} ({g.uuid})" for g in taken)
    holders = "; ".join(
        f"GPU {g.index} held by {held[g.uuid].describe()}"
        if g.uuid in held
        else f"GPU {g.index} unhealthy ({sick[g.uuid]})"
        if g.uuid in sick
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
