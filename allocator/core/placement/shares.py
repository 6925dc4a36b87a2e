"""The share rules as a unit policy: which shared GPU a share goes on (core/rules/sharing.py).

`placement.place` places a share as it places GPUs and MIG slices: it lists the share
slots (`Inventory.slots`), drops the unhealthy and the held, and calls `policy`, which
picks the GPU by the rules of docs/sharing.md (how many of its shares the ask is, one
MPS user a GPU, packing or ``spread``); the share takes that many of its free slots.
Pure, like the other placement policies: the GPUs a share may go on, the shares out on
each and the units held come in; a GPU, or why none, goes out.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from allocator.core.leases.holders import Holder
from allocator.core.leases.leases import Lease, Phase
from allocator.core.machine.inventory import GPU, slot_uuid
from allocator.core.placement import SharePolicy, Shortage
from allocator.core.rules.sharing import ANY_USER, MPS, ShareAsk, Sharing, rule_for


@dataclass(frozen=True)
class Out:
    """A shared GPU's shares out now: how many, and as which users."""

    slots: int = 0
    users: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Placed:
    gpu: GPU
    slots: int
    of: int
    rule: Sharing


def place(
    ask: ShareAsk,
    gpus: Sequence[GPU],
    rules: Sequence[Sharing],
    out: Mapping[str, Out],
    blocked: Collection[str],
) -> Placed | Shortage:
    """The GPU a share goes on, or why none can take it (waitable: it may, once shares end).

    ``gpus``: the GPUs the policy lets the create have; ``out``: UUID -> its shares out;
    ``blocked``: GPUs held otherwise (whole, claimed, kept, unhealthy).  Shares pack
    onto the GPU with the most out already (fewest GPUs touched), tightest first; a
    rule with ``spread`` takes the least used instead.  Ties go to the lowest index.
    """
    why: list[str] = []
    busy = False  # a GPU could take it, were it not for what is out now
    fits: list[tuple[tuple[int, int, int], Placed]] = []
    shared = [(g, r) for g in gpus if (r := rule_for(g, rules)) is not None]
    if not shared:
        return Shortage(
            f"gpu-alloc: no shared GPU for {ask.words()}: none of the GPUs it may have is "
            "shared (policy.sharing names none of them); ask for a whole GPU without the "
            "share label, or name a shared pool with io.gpu-alloc.pool",
            waitable=False,
        )
    for gpu, rule in shared:
        slots = ask.slots(rule, gpu)
        if isinstance(slots, str):
            why.append(f"{gpu.label()}: {slots}")
            continue
        have = out.get(gpu.uuid, Out())
        busy = True
        if gpu.uuid in blocked and not have.slots:
            why.append(f"{gpu.label()}: held whole")
            continue
        free = rule.shares - have.slots
        if free < slots:
            why.append(f"{gpu.label()}: {have.slots} of {rule.shares} shares out")
            continue
        if rule.mode == MPS and rule.users != ANY_USER and have.users - {ask.user}:
            others = ", ".join(sorted(have.users))
            why.append(
                f"{gpu.label()}: its MPS server runs as user {others}, and MPS serves one "
                f"user at a time (this container runs as {ask.user})"
            )
            continue
        key = (have.slots, gpu.index, 0) if rule.spread else (-have.slots, free - slots, gpu.index)
        fits.append((key, Placed(gpu, slots, rule.shares, rule)))
    if not fits:
        return Shortage(
            f"gpu-alloc: no shared GPU can take {ask.words()} now: {'; '.join(why)}",
            waitable=busy,
        )
    return min(fits, key=lambda f: f[0])[1]


def policy(ask: ShareAsk, rules: Sequence[Sharing], out: Mapping[str, Out]) -> SharePolicy:
    """`place` for ``ask``, as the unit policy `placement.place` calls for a share."""
    return lambda gpus, blocked: place(ask, gpus, rules, out, blocked)


def held_slots(held: Mapping[str, Holder], out: Mapping[str, Out]) -> dict[str, Holder]:
    """``held`` as a share's placement reads it: a GPU with shares out is held as that
    many of its slots (a lease records its GPU and share count, so its slots are derived),
    and not whole, so the other shares of a GPU never keep a share off it."""
    placing = {uuid: who for uuid, who in held.items() if uuid not in out}
    for uuid, have in out.items():
        if uuid in held:
            placing.update({slot_uuid(uuid, n): held[uuid] for n in range(have.slots)})
    return placing


def out_of(leases: Iterable[Lease]) -> dict[str, Out]:
    """UUID -> the shares out on it, by the live share leases (a handed-over lease's
    count: a share is never handed over)."""
    found: dict[str, Out] = {}
    for le in leases:
        if not le.share_of or le.phase is Phase.HANDED_OVER:
            continue
        for uuid in le.gpus:
            had = found.get(uuid, Out())
            found[uuid] = Out(had.slots + le.share_slots, had.users | {le.share_user})
    return found
