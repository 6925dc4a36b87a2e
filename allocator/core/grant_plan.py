"""The grant, decided once: a create's request and the host as data in, a plan or why not out.

Every grant is decided here, and only here: a create arriving now (`LeaseBook.lease`, under
the ledger lock), a waiter served from the line and the GPUs a waiter keeps (`Lineup`),
``gpu-alloc explain`` (`LeaseBook.plan`, on a read of the ledger).  Their shell,
`Placer` (allocator/service/placer.py), reads the inputs and records what comes out; none
decides anything, so none can drift from the others.  (Not to be confused with
``core/access/grants.py``: what a create's fields grant a container, before any lease.)

Stages
------
1. ``scope``: the GPUs the policy lets the request have and their pool
   (`policy.eligible`: the pool, the request labels, GPUs given to swarm), and no more
   time than that pool's limit allows (`timelimits.refusal`: a 400).
2. The time limit the lease gets (`timelimits.effective`): reservations read it.
3. What holds GPUs: the ledger's leases and claims (a stopped holder said so), and the
   GPUs ``kept`` for waiters ahead in the line, held by them.
4. A share (``req.share``) is placed first, as share slots of one shared GPU, by the
   path whole GPUs and MIG slices take (`placement.place`, the share rules of
   `placement.shares` picking the GPU), then its fraction counted against the owner's
   limit; the rest of these stages are a whole GPU's.
5. A Compose predecessor lends its GPUs only when it is this owner's bound lease.
6. The owner's limit (`policy.over_limit`), the predecessor's GPUs not counted.
7. The GPUs reservations keep from this request (`reservations.blocked`, and `prefer` for
   a holder's count request), then the GPUs placed (`placement.place`).
8. The cores and memory near them (`cpus.place`), when the request asks for any.
9. The `Plan`; `record` turns it into the pending lease in the caller's state.

A shortage carries the free GPUs the request could have used (`Shortage.usable`): what a
waiter short of GPUs keeps from those behind it (`core.rules.queue`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from allocator.core.api.signals import Signal
from allocator.core.judging.ask import Ask
from allocator.core.leases.clock import Mark
from allocator.core.leases.holders import Holder
from allocator.core.leases.leases import Lease, Phase, State
from allocator.core.machine import cpus
from allocator.core.machine.inventory import GPU, Inventory, MigPolicy
from allocator.core.placement import POLICIES, Policy, Shortage, place, shares, usable
from allocator.core.rules import policy, sharing
from allocator.core.rules.policy import NOBODY, Invalid, Owner, Refusal, Rules, Wanted
from allocator.core.rules.sharing import ShareAsk, fraction
from allocator.core.timing import checkpoint, timelimits
from allocator.core.timing import reservations as rsv

_ELSEWHERE = Holder(None, "", "left free: the holder's own reserved GPUs answer it")


@dataclass(frozen=True)
class LeaseRequest:
    """What a create asks for, kept whole so a waiter can ask again.

    ``name``: the container's name (may be empty); ``labels``: the create's own labels
    (a Compose recreate is found by them); ``share``: part of one shared GPU
    (allocator/core/rules/sharing.py); ``resources``: cores and memory near the GPUs.
    """

    ask: Ask
    name: str = ""
    owner: Owner = NOBODY
    want: Wanted = Wanted()  # noqa: RUF009  # frozen
    resources: cpus.Resources = cpus.NOTHING
    labels: Mapping[str, str] | None = field(default=None, compare=False)
    share: ShareAsk | None = None


@dataclass(frozen=True)
class HostNow:
    """The host as the shell read it for this grant.

    ``inventory``: every GPU and slice; ``unhealthy``: UUID -> its event, never placed;
    ``mig``: ``policy.mig``; ``reservations``: those not over yet (re-picked around the
    unhealthy); ``topology``: the host's cores, read only for a request that asks for
    cores or memory (None: no cores, so such a request is refused, never granted
    without them); ``reserved_cpus``: ``policy.reserved_cpus``;
    ``pending_ttl``: how long a lease waits for its container; ``mark``: the boot's
    clock with ``now`` (`clock.Now.mark`), what that wait is measured on.
    """

    inventory: Inventory
    rules: Rules
    now: float
    mig: MigPolicy = MigPolicy.NONE
    unhealthy: Mapping[str, str] = field(default_factory=dict)
    placement: Policy = POLICIES["best-effort"]
    reservations: tuple[rsv.Reservation, ...] = ()
    topology: cpus.Topology | None = None
    reserved_cpus: tuple[int, ...] = ()
    pending_ttl: float = 300.0
    mark: Mark | None = None


@dataclass(frozen=True)
class Plan:
    """A grant decided: what the lease records.  ``share_*``: ``share_slots`` of the GPU's
    ``share_of`` shares, run as ``share_user`` (0 of 0: the GPUs whole);
    ``predecessor``: (lease id, current name) of the Compose predecessor whose GPUs this
    lease takes over; ``signal``: its checkpoint signal (allocator/core/timing/checkpoint.py)."""

    gpus: tuple[str, ...]
    pool: str | None
    time_limit: float | None
    cpus: tuple[int, ...] = ()
    mems: tuple[int, ...] = ()
    memory: int = 0
    share_slots: int = 0
    share_of: int = 0
    share_user: str = ""
    predecessor: tuple[str, str] | None = None
    signal: Signal | None = None


Scope = tuple[Inventory, str | None]
Decided = Plan | Shortage | Refusal | Invalid


def scope(req: LeaseRequest, inventory: Inventory, rules: Rules) -> Scope | Refusal | Invalid:
    """Stage 1: the GPUs the policy lets ``req`` have and their pool, or why none.  It
    needs no ledger, so a shell may ask it first to refuse without the lock; `plan`
    asks it again, and only its own answer counts."""
    eligible = policy.eligible(inventory, req.want, req.owner, rules, req.ask.required)
    return timelimits.within(eligible, rules, req.owner, req.want.time)


def plan(
    req: LeaseRequest,
    host: HostNow,
    state: State,
    kept: Mapping[str, Holder] | None = None,
    *,
    predecessor: tuple[str, str] | None = None,
    stopped: Mapping[str, str] | None = None,
) -> Decided:
    """The grant ``req`` gets now in ``state``, or why not (the module's stages, in order).

    ``kept``: GPUs kept for waiters ahead in the line (`core.rules.queue.kept`), held by them;
    ``predecessor``: (container id, current name) of the Compose container whose GPUs
    this create may take over; ``stopped``: container -> status, for the holders the
    Engine last listed not running.  ``state`` is only read.
    """
    scoped = scope(req, host.inventory, host.rules)
    if not isinstance(scoped, tuple):
        return scoped
    inventory, pool = scoped
    owner = req.owner
    limit = timelimits.effective(host.rules, owner, pool, req.want.time)
    held = state.holders(host.inventory.uuids, stopped)
    for uuid, keeper in (kept or {}).items():
        held.setdefault(uuid, keeper)
    if req.share is not None:
        got = _share(req, req.share, host, state, scoped, held, limit)
    else:
        got = _whole(req, host, state, scoped, dict(held), limit, predecessor)
    if isinstance(got, Shortage):
        reserved = _reserved(held, owner, limit, host)
        return replace(got, usable=usable(req.ask, inventory, reserved, host.unhealthy, host.mig))
    if isinstance(got, Plan):
        return replace(got, signal=checkpoint.signal_for(host.rules, owner, pool, req.want.signal))
    return got


def _whole(
    req: LeaseRequest,
    host: HostNow,
    state: State,
    scoped: Scope,
    held: dict[str, Holder],
    limit: float | None,
    predecessor: tuple[str, str] | None,
) -> Plan | Shortage | Refusal:
    """Stages 5 to 8, for GPUs whole."""
    inventory, pool = scoped
    owner = req.owner
    where = req.want.where(pool)
    old = state.lease_of(predecessor[0]) if predecessor else None
    # Only the owner's own predecessor lends its GPUs (leases from before owners were
    # recorded have none, and may).
    if predecessor and (
        old is None or old.phase is not Phase.BOUND or old.owner not in ("", owner.user)
    ):
        # It lends nothing: a shortage is said as placed now; `LeaseBook.lease` keeps its
        # first answer for anything else.
        short = _place(req, host, inventory, held, where, limit)
        if isinstance(short, Shortage):
            return short
        return Refusal("gpu-alloc: the predecessor is not this owner's bound lease")
    ask = req.ask
    asking = len(inventory.gpus) if ask.every else len(ask.required) + ask.count
    holding = state.held_by(owner.user, besides=old.id if old else None)
    refused = policy.over_limit(owner, holding, asking, host.rules)
    if refused is not None:
        return refused
    for uuid in old.gpus if old else ():
        held.pop(uuid, None)
    picked = _place(req, host, inventory, held, where, limit)
    if isinstance(picked, Shortage):
        return picked
    placed = cpus.Placed((), (), 0)
    if req.resources.any:  # a topology not read has no cores: refused, never granted without
        got = cpus.place(
            host.topology or cpus.Topology(()),
            req.resources,
            cpus.gpu_nodes(g.numa_node for g in picked),
            state.leased_cpus(but=old.id if old else None),
            state.leased_memory(but=old.id if old else None),
            host.reserved_cpus,
        )
        if isinstance(got, str):
            return Shortage(f"gpu-alloc: {got}; 'gpu-alloc status' shows the leases")
        placed = got
    handed = (old.id, predecessor[1]) if old is not None and predecessor is not None else None
    return Plan(
        tuple(g.uuid for g in picked),
        pool,
        limit,
        placed.cpus,
        placed.mems,
        placed.memory,
        predecessor=handed,
    )


def record(
    state: State, req: LeaseRequest, planned: Plan, host: HostNow
) -> tuple[Lease, str, Lease | None]:
    """Stage 9: the pending lease ``planned`` in ``state`` (the caller holds the lock and
    writes it); (lease, token, the predecessor's lease as it was, when it lent its GPUs)."""
    lease, token = state.new_lease(planned.gpus, host.now, host.pending_ttl, host.mark)
    lease = replace(
        lease,
        name=req.name,
        owner=req.owner.user,
        owner_uid=req.owner.uid,
        pool=planned.pool,
        cpus=planned.cpus,
        mems=planned.mems,
        memory=planned.memory,
        time_limit=planned.time_limit,
        share_slots=planned.share_slots,
        share_of=planned.share_of,
        share_user=planned.share_user,
    )
    if planned.signal is not None:
        lease = replace(lease, signal=planned.signal.name, signal_lead=planned.signal.lead)
    state.leases[lease.id] = lease
    old = None
    if planned.predecessor is not None:
        old_id, current_name = planned.predecessor
        old = state.leases[old_id]
        state.hand_over(old_id, lease.id, current_name)
    return lease, token, old


def _reserved(
    held: Mapping[str, Holder], owner: Owner, limit: float | None, host: HostNow
) -> dict[str, Holder]:
    """``held`` and the GPUs reservations keep from ``owner`` asking to run ``limit``
    seconds (rules 2 and 3 of `core.timing.reservations`)."""
    out = dict(held)
    for uuid, who in rsv.blocked(host.reservations, owner, limit, host.now).items():
        out.setdefault(uuid, who)
    return out


def _place(
    req: LeaseRequest,
    host: HostNow,
    inventory: Inventory,
    held: Mapping[str, Holder],
    where: str,
    limit: float | None,
) -> list[GPU] | Shortage:
    """Stage 7: the GPUs for ``req.ask`` among ``inventory`` (the host, or its part the
    policy allows), around ``held`` and what reservations keep."""
    ask, owner = req.ask, req.owner
    reserved = _reserved(held, owner, limit, host)
    placing = reserved
    if host.reservations and ask.count and not (ask.required or ask.every or ask.profile):
        # Rule 4: a holder's count request lands on its own free reserved GPUs.
        free = [
            g.uuid
            for g in host.inventory.units(host.mig)
            if g.uuid not in reserved and g.uuid not in host.unhealthy and not g.busy
        ]
        elsewhere = rsv.prefer(host.reservations, owner, ask.count, free, host.now)
        placing = dict(reserved)
        for uuid in elsewhere:
            placing.setdefault(uuid, _ELSEWHERE)
    units = len(host.inventory.units(host.mig))
    picked = place(
        ask,
        inventory,
        placing,
        host.placement,
        host.now,
        where,
        host.unhealthy,
        host.mig,
        units,
    )
    return picked


def _share(
    req: LeaseRequest,
    ask: ShareAsk,
    host: HostNow,
    state: State,
    scoped: Scope,
    held: Mapping[str, Holder],
    limit: float | None,
) -> Plan | Shortage | Refusal:
    """Stage 4: a share placed first (its fraction depends on its GPU's shares), by the
    path GPUs and MIG slices take (`placement.place`): among the share slots of the GPUs
    in scope (`sharing.listed`), around what holds GPUs whole, reservations keep and the
    unhealthy, with the share rules picking the GPU; then the owner's limit counting it."""
    inventory, pool = sharing.listed(scoped[0], host.rules.sharing), scoped[1]
    out = shares.out_of(state.leases.values())
    placing = shares.held_slots(_reserved(held, req.owner, limit, host), out)
    rules = shares.policy(ask, host.rules.sharing, out)
    picked = place(
        req.ask, inventory, placing, host.placement, unhealthy=host.unhealthy, share=rules
    )
    if isinstance(picked, Shortage):
        return picked
    asking = fraction(len(picked), picked[0].of)
    refused = policy.over_limit(req.owner, state.held_by(req.owner.user), asking, host.rules)
    if refused is not None:
        return refused
    return Plan(
        (picked[0].gpu.uuid,),
        pool,
        limit,
        share_slots=len(picked),
        share_of=picked[0].of,
        share_user=ask.user,
    )
