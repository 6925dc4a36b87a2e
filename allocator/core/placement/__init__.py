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
    ask: Ask,
    inventory: Inventory,
    held: Mapping[str, Holder],
    policy: Policy,
    now: float | None = None,
    where: str = "",
) -> list[GPU] | Shortage:
    """Pick GPUs for `ask` among those not in ``held`` (UUID -> `Holder`); all or nothing.

    ``where`` names the set ``inventory`` is (a pool, say) in the shortage text; ``now``
    lets it say how long each holder has held its GPUs.
    """
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
    return Shortage(_shortage_text(ask, size, free, taken, inventory, held, now, where))


def _shortage_text(
    ask: Ask,
    size: int,
    free: Sequence[GPU],
    taken: Sequence[GPU],
    inventory: Inventory,
    held: Mapping[str, Holder],
    now: float | None,
    where: str,
) -> str:
    """At most one line per holder; asking for more than exists says so, not "remove"."""
    asked = "all GPUs" if ask.every else f"{size} GPU{'s' * (size != 1)}"
    place_name = where or "this host"
    if size > len(inventory.gpus):
        return (
            f"gpu-alloc: asked for {asked} but {place_name} has only {len(inventory.gpus)}; "
            "ask for fewer" + (", or another pool" if where else "")
        )
    if taken:
        asked += " including " + ", ".join(f"GPU {g.index} ({g.uuid})" for g in taken)
    by_holder: dict[object, tuple[list[int], str]] = {}
    for g in inventory.gpus:
        if g in free:
            continue
        h = held.get(g.uuid)
        key = (h.lease, h.container) if h else "busy"
        text = h.describe(now) if h else "host processes"
        by_holder.setdefault(key, ([], text))[0].append(g.index)
    holders = "; ".join(
        f"GPU{'s' * (len(ix) > 1)} {','.join(map(str, ix))}: {text}"
        for ix, text in by_holder.values()
    )
    return (
        f"gpu-alloc: not enough free GPUs: asked for {asked}, {len(free)} of "
        f"{len(inventory.gpus)} free in {place_name}"
        + (f" ({holders})" if holders else "")
        + ". Remove a container that holds GPUs, or ask for fewer; 'gpu-alloc status' "
        "shows who holds what"
    )
