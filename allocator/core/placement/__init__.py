"""Placement: the units a grant takes, one path for whole GPUs, MIG slices and share slots.

`place` lists the units an ask may take (`Inventory.units`, or a shared GPU's slots,
`Inventory.slots`), drops the unhealthy and those held with their families (a held GPU
holds its slices and slots, a held slice or slot its GPU), and hands what is left to a
unit policy.  Whole GPUs and slices go to a count policy, ``allocate(available,
required, size)``, one a file: its interface follows NVIDIA's go-gpuallocator
(``available`` are the free GPUs, ``required`` must be part of the answer, and the answer
has ``size`` GPUs or is ``None``: never a partial grant).  A share goes to the share
rules (`placement.shares`), which pick its GPU; it takes that many of the GPU's free
slots.  Policies are pure functions of their arguments, so they are tested without I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, overload

from allocator.core.judging.ask import Ask
from allocator.core.leases.holders import Holder
from allocator.core.machine.inventory import GPU, Inventory, MigPolicy, Slot
from allocator.core.placement import best_effort, first_fit, numa
from allocator.core.rules.queue import Kept
from allocator.core.timing.reservations import Reserved

Policy = Callable[[Sequence[GPU], Sequence[GPU], int], list[GPU] | None]

POLICIES: dict[str, Policy] = {
    "best-effort": best_effort.allocate,
    "numa": numa.allocate,
    "first-fit": first_fit.allocate,
}


@dataclass(frozen=True)
class Shortage:
    """Too few free GPUs.  ``waitable``: freeing GPUs could answer it (not so for more
    GPUs than the set has, an unhealthy or non-unit GPU named, MIG with policy.mig none).
    ``usable``: the free units the request could have drawn (`usable`), when the grant
    plan (core/grant_plan.py) says it: what a waiter short of GPUs keeps from others."""

    msg: str
    waitable: bool = True
    usable: frozenset[str] = field(default=frozenset(), compare=False)


class Taken(Protocol):
    """A share policy's answer: the GPU a share goes on and how many of its slots."""

    @property
    def gpu(self) -> GPU: ...

    @property
    def slots(self) -> int: ...


# The share rules as a unit policy: the shared GPUs a share may go on (healthy ones with
# slots) and the held units, in; the GPU and how many slots, or why none, out.
SharePolicy = Callable[[Sequence[GPU], Collection[str]], Taken | Shortage]


@overload
def place(
    ask: Ask,
    inventory: Inventory,
    held: Mapping[str, Holder],
    policy: Policy,
    now: float | None = None,
    where: str = "",
    unhealthy: Mapping[str, str] | None = None,
    mig: MigPolicy = MigPolicy.NONE,
    host_units: int | None = None,
    share: None = None,
) -> list[GPU] | Shortage: ...


@overload
def place(
    ask: Ask,
    inventory: Inventory,
    held: Mapping[str, Holder],
    policy: Policy,
    now: float | None = None,
    where: str = "",
    unhealthy: Mapping[str, str] | None = None,
    mig: MigPolicy = MigPolicy.NONE,
    host_units: int | None = None,
    *,
    share: SharePolicy,
) -> list[Slot] | Shortage: ...


def place(
    ask: Ask,
    inventory: Inventory,
    held: Mapping[str, Holder],
    policy: Policy,
    now: float | None = None,
    where: str = "",
    unhealthy: Mapping[str, str] | None = None,
    mig: MigPolicy = MigPolicy.NONE,
    host_units: int | None = None,
    share: SharePolicy | None = None,
) -> list[GPU] | list[Slot] | Shortage:
    """Pick units for `ask` among those not in ``held`` (UUID -> `Holder`); all or nothing.

    ``where`` names the set ``inventory`` is (a pool, say) in the shortage text; ``now``
    lets it say how long each holder has held its GPUs.  ``unhealthy`` (UUID -> the
    event, from allocator.core.machine.health) are never placed; an explicit request for one is
    refused naming its event, since waiting will not help.  ``mig`` is ``policy.mig``:
    which of GPUs and MIG slices are units (`Inventory.units`); a held GPU blocks its
    slices and a held slice its GPU, whoever holds them.  ``host_units``: how many units
    the whole host has, when ``inventory`` is a part of it (a pool), so a request larger
    than the host says so rather than naming the part.  ``share``: the share rules
    (`placement.shares`) for a share's ask, which takes slots of one GPU ``inventory``
    lists with slots (`sharing.listed`); ``held`` then names the slots shares hold.
    """
    sick = _sick(inventory, unhealthy)
    blocked = _blocked(held, inventory)
    if share is not None:
        return _slots(inventory, blocked, sick, share)
    units = inventory.units(mig)
    known = {g.uuid: g for g in (*inventory.gpus, *inventory.migs)}
    required = [known[u] for u in ask.required if u in known]
    asked_sick = [g for g in required if g.uuid in sick]
    if asked_sick:
        return Shortage(_unhealthy_text(asked_sick, sick), waitable=False)
    outside = [g for g in required if g not in units]
    if outside:
        return Shortage(_not_a_unit_text(outside, mig), waitable=False)
    if ask.profile and mig is MigPolicy.NONE:
        return Shortage(
            f"gpu-alloc: refused: MIG profile {ask.profile} asked, but policy.mig is 'none', "
            "so MIG slices are not leased; drop the io.gpu-alloc.request.mig label, or have "
            "the operator set policy.mig",
            waitable=False,
        )
    if ask.every and not units:  # all of none would be a lease of no GPU
        text = _shortage_text(ask, 0, [], [], units, blocked, sick, now, where)
        return Shortage(text, waitable=False)
    free = [g for g in units if g.uuid not in blocked and not g.busy and g.uuid not in sick]
    if ask.every:
        required = list(units)
        size = len(required)
    else:
        size = len(required) + ask.count
    pool = [g for g in free if g in required or _fits(g, ask.profile, mig)]
    taken = [g for g in required if g not in free]
    picked = None if taken else policy(pool, required, size)
    if picked is not None:
        return picked
    text = _shortage_text(ask, size, pool, taken, units, blocked, sick, now, where, host_units)
    fitting = [g for g in units if g in required or _fits(g, ask.profile, mig)]
    return Shortage(text, waitable=ask.every or size <= len(fitting))


def usable(
    ask: Ask,
    inventory: Inventory,
    held: Mapping[str, Holder],
    unhealthy: Mapping[str, str] | None = None,
    mig: MigPolicy = MigPolicy.NONE,
) -> frozenset[str]:
    """The free units `place` could draw for `ask` (what a waiter short of GPUs blocks)."""
    sick = _sick(inventory, unhealthy)
    blocked = _blocked(held, inventory)
    units = inventory.units(mig)
    if ask.every:
        wanted = list(units)
    else:
        named = [g for g in units if g.uuid in ask.required]
        counted = [g for g in units if _fits(g, ask.profile, mig)] if ask.count else []
        wanted = named + counted
    return frozenset(
        g.uuid for g in wanted if g.uuid not in blocked and not g.busy and g.uuid not in sick
    )


def _slots(
    inventory: Inventory, blocked: Collection[str], sick: Mapping[str, str], share: SharePolicy
) -> list[Slot] | Shortage:
    """A share: the GPU the share rules pick among the healthy shared ones, then that
    many of its slots nothing holds."""
    gpus = [g for g in inventory.gpus if inventory.slots_of(g.uuid) and g.uuid not in sick]
    taken = share(gpus, blocked)
    if isinstance(taken, Shortage):
        return taken
    free = [s for s in inventory.slots_of(taken.gpu.uuid) if s.uuid not in blocked]
    return free[: taken.slots]


def _sick(inventory: Inventory, unhealthy: Mapping[str, str] | None) -> dict[str, str]:
    """The unhealthy units: a GPU's event stands for its slices and slots too."""
    sick = dict(unhealthy or {})
    sick.update({m.uuid: sick[m.parent] for m in inventory.migs if m.parent in sick})
    sick.update({s.uuid: sick[s.gpu.uuid] for s in inventory.slots if s.gpu.uuid in sick})
    return sick


def _fits(unit: GPU, profile: str, mig: MigPolicy) -> bool:
    """May a count request draw this unit?  ``mixed`` hands slices out by profile only."""
    if profile:
        return unit.profile == profile
    return mig is MigPolicy.SINGLE or not unit.is_slice


def _blocked(held: Mapping[str, Holder], inventory: Inventory) -> dict[str, Holder]:
    """Held UUIDs and their families: a GPU's slices and slots, a slice's or slot's GPU."""
    blocked: dict[str, Holder] = {}
    for uuid, who in held.items():
        for u in sorted(inventory.family(uuid)):
            blocked.setdefault(u, who)
    return blocked


def _not_a_unit_text(gpus: Sequence[GPU], mig: MigPolicy) -> str:
    named = ", ".join(f"{g.label()} ({g.uuid})" for g in gpus)
    if any(g.is_slice for g in gpus):
        why = "policy.mig is 'none', so MIG slices are not leased"
        fix = "ask for a GPU without MIG mode, or have the operator set policy.mig"
    else:
        why = "it is in MIG mode, so it is leased only as its slices"
        fix = "ask for one of its MIG slices (gpu-alloc status lists them)"
    return f"gpu-alloc: refused: {named}: {why}; {fix}"


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
    units: Sequence[GPU],
    held: Mapping[str, Holder],
    sick: Mapping[str, str],
    now: float | None,
    where: str,
    host_units: int | None = None,
) -> str:
    """At most one line per holder; asking for more than exists says so, not "remove"."""
    asked = "all GPUs" if ask.every else f"{size} GPU{'s' * (size != 1)}"
    if ask.profile:
        asked = f"{size} MIG slice{'s' * (size != 1)} of profile {ask.profile}"
    if where and host_units is not None and size > host_units:  # no pool could answer it
        return f"gpu-alloc: asked for {asked} but this host has only {host_units}; ask for fewer"
    place_name = where or "this host"
    if not units and where:
        return (
            f"gpu-alloc: no GPU on this host is in {place_name} (asked for {asked}); "
            "check the request labels: 'gpu-alloc gpus' lists each GPU's model and memory"
        )
    if not units:
        return f"gpu-alloc: asked for {asked} but this host has no GPUs to lease"
    if size > len(units):
        has = "have" if place_name.startswith("the GPUs") else "has"
        return (
            f"gpu-alloc: asked for {asked} but {place_name} {has} only {len(units)}; "
            "ask for fewer" + (", or another pool" if where else "")
        )
    by_holder: dict[object, tuple[list[GPU], str]] = {}
    stopped: dict[object, Holder] = {}  # the holders to say the stopped-container hint for
    key: object
    for g in units:
        if g in free:
            continue
        h = held.get(g.uuid)
        if h is not None:
            key, text = (h.lease, h.container), h.describe(now)
            if h.idle_stopped:
                stopped[key] = h
        elif g.uuid in sick:
            key, text = ("unhealthy", sick[g.uuid]), f"unhealthy ({sick[g.uuid]})"
        elif g.busy:
            key, text = "busy", "host processes"
        else:
            continue
        by_holder.setdefault(key, ([], text))[0].append(g)
    if taken and not ask.every:  # the GPUs named are what is in the way, not the count
        named = {g.uuid for g in taken}
        shown = {k: v for k, v in by_holder.items() if any(g.uuid in named for g in v[0])}
        whose = "; ".join(
            f"{_named([g for g in gs if g.uuid in named])}: {text}" for gs, text in shown.values()
        )
        asked_by_name = ", ".join(f"{g.label()} ({g.uuid})" for g in taken)
        instead = (
            "name others"
            if any(g.is_slice for g in taken)
            else f"ask for a count (--gpus {size}) to take any free one, name others"
        )
        return (
            f"gpu-alloc: {asked_by_name}, asked by name, {'is' if len(taken) == 1 else 'are'} "
            f"not free ({whose}); {len(free)} of {len(units)} "
            f"{'in ' + where if where else 'on this host'} are. {instead[0].upper()}"
            f"{instead[1:]}, or wait for these; 'gpu-alloc status' shows who holds what"
            + _stopped_hint([h for k, h in stopped.items() if k in shown])
            + _kept_hint([held.get(g.uuid) for g in taken])
            + _reserved_hint([held.get(g.uuid) for g in taken])
        )
    holders = "".join(f"\n  {_named(gs)}: {text}" for gs, text in by_holder.values())
    return (
        f"gpu-alloc: not enough free GPUs: asked for {asked}, {len(free)} of "
        f"{len(units)} free {'in ' + where if where else 'on this host'}"
        + (f", held by:{holders}\n" if holders else ". ")
        + "Remove a container that holds GPUs, or ask for fewer; 'gpu-alloc status' "
        "shows who holds what"
        + _stopped_hint(list(stopped.values()))
        + _kept_hint([held.get(g.uuid) for g in units if g not in free])
        + _reserved_hint([held.get(g.uuid) for g in units if g not in free])
    )


def _kept_hint(holders: Sequence[Holder | None]) -> str:
    """Said once: GPUs the line keeps go to its waiters first, whoever asks meanwhile."""
    if not any(isinstance(h, Kept) for h in holders):
        return ""
    return (
        ". GPUs kept for a create waiting in line go to it first: to be served after it, "
        "wait in line too (--label io.gpu-alloc.wait=30m, or the operator's "
        "policy.wait.default)"
    )


def _reserved_hint(holders: Sequence[Holder | None]) -> str:
    """Said once: what to do about GPUs a reservation keeps (`core.timing.reservations`)."""
    reserved = [h for h in holders if isinstance(h, Reserved)]
    if not reserved:
        return ""
    later = any(h.upcoming for h in reserved)
    return (
        ". A reserved GPU goes only to its reservation's holder during the window"
        + (
            ", and before it only to a create whose time limit ends by its start "
            "(--label io.gpu-alloc.time=DURATION)"
            if later
            else ""
        )
        + ": ask for other GPUs, or wait until it ends; 'gpu-alloc reservations' lists them"
    )


def _stopped_hint(stopped: Sequence[Holder]) -> str:
    """Said once, after the holders: a GPU whose holder is stopped looks unused, and
    nothing frees it but the container's removal (or the policy, for a lease)."""
    if not stopped:
        return ""
    policy = any(h.lease is not None for h in stopped)
    return (
        ". A stopped container keeps its GPUs until it is removed: its owner can "
        "'docker rm' it"
        + (", or the operator can set policy.release_stopped_after" if policy else "")
    )


def _named(gpus: Sequence[GPU]) -> str:
    """``GPUs 0,1`` for whole GPUs, each slice by its label."""
    if any(g.is_slice for g in gpus):
        return ", ".join(g.label() for g in gpus)
    return f"GPU{'s' * (len(gpus) > 1)} {','.join(str(g.index) for g in gpus)}"
