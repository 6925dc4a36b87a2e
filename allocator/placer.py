"""Placing one create in a ledger state: the policy's limits, then the GPUs, then cores.

One part of the composed service (allocator/service.py).  `Placer.take` is the one
placement every grant goes through: a create arriving now (`LeaseBook.lease`), a
waiter served from the line and the GPUs a waiter keeps (`Lineup`), so each is granted
exactly as the others would be, around the GPUs reservations keep from it
(`Reservations.keep`).  It writes nothing itself: the caller holds the ledger
lock around it and records what it returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from allocator.core import cpus, policy, timelimits
from allocator.core.ask import Ask
from allocator.core.holders import Holder
from allocator.core.inventory import GPU, Inventory
from allocator.core.leases import Lease, Phase, State
from allocator.core.placement import POLICIES, Shortage, place, shares
from allocator.core.policy import NOBODY, Invalid, Owner, Refusal, Wanted
from allocator.core.sharing import ShareAsk, fraction
from allocator.gather import Gatherer
from allocator.host import ledger
from allocator.host.config import Config
from allocator.reserving import Reservations


@dataclass(frozen=True)
class LeaseRequest:
    """What a create asks for, kept whole so a waiter can ask again.

    ``name``: the container's name (may be empty); ``labels``: the create's own labels
    (a Compose recreate is found by them).
    """

    ask: Ask
    name: str = ""
    owner: Owner = NOBODY
    want: Wanted = Wanted()  # noqa: RUF009  # frozen
    resources: cpus.Resources = cpus.NOTHING
    labels: Mapping[str, str] | None = field(default=None, compare=False)
    share: ShareAsk | None = None  # part of one shared GPU (allocator/core/sharing.py)


Taken = tuple[Lease, str, Lease | None]


class Placer:
    """``take`` places a create in a ledger state; ``place`` says where, taking nothing."""

    def __init__(self, config: Config, gather: Gatherer, reservations: Reservations):
        self.config = config
        self.gather = gather
        self.reservations = reservations
        self.policy = POLICIES[config.policy.placement]

    def scope(
        self, ask: Ask, owner: Owner, want: Wanted
    ) -> tuple[Inventory, str | None] | Refusal | Invalid:
        """The GPUs the policy lets this create have, and their pool, or why none: the
        one check of the pool, request labels and time limit that a create arriving now
        (`LeaseBook.lease`), `LeaseBook.explain` and a waiter served from the line
        (`Lineup`) all go through, against the rules as they are now."""
        rules = self.gather.rules
        scope = policy.eligible(self.gather.inventory(), want, owner, rules, ask.required)
        return timelimits.within(scope, rules, owner, want.time)

    def place(
        self,
        ask: Ask,
        inventory: Inventory,
        held: Mapping[str, Holder],
        where: str,
        owner: Owner,
        limit: float | None,
    ) -> list[GPU] | Shortage:
        """`core.placement.place` for ``ask`` among ``inventory`` (the host or a pool) as
        the host is now: its unhealthy GPUs, ``policy.mig``, its size, and the GPUs
        reservations keep from ``owner`` asking to run ``limit`` seconds."""
        mig = self.config.policy.mig
        host = len(self.gather.inventory().units(mig))
        unhealthy = self.gather.unhealthy()
        now = ledger.now()
        held = self.reserved(held, owner, limit, ask)
        return place(ask, inventory, held, self.policy, now, where, unhealthy, mig, host)

    def reserved(
        self, held: Mapping[str, Holder], owner: Owner, limit: float | None, ask: Ask | None = None
    ) -> dict[str, Holder]:
        """``held`` and the GPUs reservations keep from ``owner`` (allocator/reserving.py)."""
        return self.reservations.keep(dict(held), owner, limit, ledger.now(), ask)

    def take(
        self,
        state: State,
        req: LeaseRequest,
        scope: tuple[Inventory, str | None],
        topology: cpus.Topology | None,
        kept: Mapping[str, Holder] | None = None,
        predecessor: tuple[str, str] | None = None,
        stopped: Mapping[str, str] | None = None,
    ) -> Taken | Shortage | Refusal:
        """Place and record a pending lease in ``state`` (the caller holds the lock).

        ``scope``: the GPUs the policy lets ``req`` have, and their pool
        (`policy.eligible`); ``topology``: the host's cores, when ``req`` asks for cores
        or memory.  ``kept`` GPUs are kept for a waiter ahead in the line
        (`Lineup.kept`): they count as held, by that waiter; ``stopped`` holders (container
        -> status, as reconcile last listed them) are said to be.  ``predecessor``: (id,
        name) of the Compose container whose GPUs this create may take over.  Returns
        (lease, token, the predecessor's lease if it lent its GPUs).
        """
        ask, owner, want = req.ask, req.owner, req.want
        inventory, pool = scope
        where = want.where(pool)
        rules = self.gather.rules
        limit = timelimits.effective(rules, owner, pool, want.time)
        now = ledger.now()
        held = state.holders(self.gather.inventory().uuids, stopped)
        for uuid, keeper in (kept or {}).items():
            held.setdefault(uuid, keeper)
        if req.share is not None:
            return self._take_share(state, req, req.share, scope, held, limit)
        old = state.lease_of(predecessor[0]) if predecessor else None
        # Only the owner's own predecessor lends its GPUs (leases from before owners
        # were recorded have none, and may).
        if predecessor and (
            old is None or old.phase is not Phase.BOUND or old.owner not in ("", owner.user)
        ):
            # It lends nothing: a shortage is said as placed now; `LeaseBook.lease` keeps
            # its first answer for anything else.
            short = self.place(ask, inventory, held, where, owner, limit)
            if isinstance(short, Shortage):
                return short
            return Refusal("gpu-alloc: the predecessor is not this owner's bound lease")
        asking = len(inventory.gpus) if ask.every else len(ask.required) + ask.count
        holding = state.held_by(owner.user, besides=old.id if old else None)
        refused = policy.over_limit(owner, holding, asking, rules)
        if refused is not None:
            return refused
        for uuid in old.gpus if old else ():
            held.pop(uuid, None)
        picked = self.place(ask, inventory, held, where, owner, limit)
        if isinstance(picked, Shortage):
            return picked
        placed = cpus.Placed((), (), 0)
        if topology is not None:
            got = cpus.place(
                topology,
                req.resources,
                cpus.gpu_nodes(g.numa_node for g in picked),
                state.leased_cpus(but=old.id if old else None),
                state.leased_memory(but=old.id if old else None),
                cpus.parse_list(self.config.policy.reserved_cpus),
            )
            if isinstance(got, str):
                return Shortage(f"gpu-alloc: {got}; 'gpu-alloc status' shows the leases")
            placed = got
        lease, token = state.new_lease(
            tuple(g.uuid for g in picked), now, self.config.policy.pending_ttl
        )
        lease = replace(
            lease,
            name=req.name,
            owner=owner.user,
            owner_uid=owner.uid,
            pool=pool,
            cpus=placed.cpus,
            mems=placed.mems,
            memory=placed.memory,
            time_limit=limit,
        )
        state.leases[lease.id] = lease
        if old is not None and predecessor is not None:
            state.hand_over(old.id, lease.id, predecessor[1])
        return lease, token, old

    def place_share(
        self,
        state: State,
        ask: ShareAsk,
        inventory: Inventory,
        held: Mapping[str, Holder],
        owner: Owner,
        limit: float | None,
    ) -> shares.Placed | Shortage:
        """The shared GPU a share goes on (`core.placement.shares.place`), around what
        holds GPUs whole, reservations keep and the unhealthy; taking nothing."""
        out = shares.out_of(state.leases.values())
        kept = self.reserved(held, owner, limit)
        blocked = {u for u in kept if u not in out}
        sick = self.gather.unhealthy()  # never placed on, shares out or not
        healthy = [g for g in inventory.gpus if g.uuid not in sick]
        return shares.place(ask, healthy, self.gather.rules.sharing, out, blocked)

    def _take_share(
        self,
        state: State,
        req: LeaseRequest,
        ask: ShareAsk,
        scope: tuple[Inventory, str | None],
        held: Mapping[str, Holder],
        limit: float | None,
    ) -> Taken | Shortage | Refusal:
        """A share's lease: its GPU placed first (its fraction depends on the GPU's
        shares), then the owner's limit counting it."""
        inventory, pool = scope
        picked = self.place_share(state, ask, inventory, held, req.owner, limit)
        if isinstance(picked, Shortage):
            return picked
        holding = state.held_by(req.owner.user)
        asking = fraction(picked.slots, picked.of)
        refused = policy.over_limit(req.owner, holding, asking, self.gather.rules)
        if refused is not None:
            return refused
        lease, token = state.new_lease(
            (picked.gpu.uuid,), ledger.now(), self.config.policy.pending_ttl
        )
        lease = replace(
            lease,
            name=req.name,
            owner=req.owner.user,
            owner_uid=req.owner.uid,
            pool=pool,
            time_limit=limit,
            share_slots=picked.slots,
            share_of=picked.of,
            share_user=ask.user,
        )
        state.leases[lease.id] = lease
        return lease, token, None
