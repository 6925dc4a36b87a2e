"""The grant plan's shell: what it reads of the host, and where its plan is recorded.

One part of the composed service (allocator/service/wiring.py).  The grant itself is decided in
the core, once (`core.grant_plan.plan`); every grant goes through it by this shell: a
create arriving now (`LeaseBook.lease`), a waiter served from the line and the GPUs a
waiter keeps (`Lineup`), and `LeaseBook.explain`, so each is granted exactly as the
others would be.  `seen` is the one read of what the plan takes from the host (the
inventory, the policy, the unhealthy GPUs, the reservations, the clock, the cores);
`take` records a plan in the caller's ledger state (the caller holds the lock and
writes it).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from allocator.core import grant_plan
from allocator.core.grant_plan import Decided, HostNow, LeaseRequest, Scope
from allocator.core.leases.holders import Holder
from allocator.core.leases.leases import Lease, State
from allocator.core.machine import cpus
from allocator.core.placement import POLICIES, Shortage
from allocator.core.rules.policy import Invalid, Refusal
from allocator.core.timing import clock
from allocator.host import clock as hostclock
from allocator.host.config import Config
from allocator.service.gather import Gatherer
from allocator.service.reserving import Reservations

__all__ = ["LeaseRequest", "Placer", "Taken"]

Taken = tuple[Lease, str, Lease | None]


class Placer:
    """``seen`` reads the host for a grant, ``scope``/``plan`` ask the core, ``take``
    records a plan in a ledger state."""

    def __init__(self, config: Config, gather: Gatherer, reservations: Reservations):
        self.config = config
        self.gather = gather
        self.reservations = reservations

    def seen(self, cores: bool) -> HostNow:
        """The host now, as `grant_plan.plan` takes it; ``cores``: read the CPU topology
        too (a request asks for cores or memory)."""
        clocks = hostclock.read()
        # the wall clock, held to its time before a jump: reservations go by it
        now = clock.schedule(clocks, hostclock.jumped(Path(self.config.state_dir)))
        pol = self.gather.policy  # as the file says now: every key of it reloads
        return HostNow(
            self.gather.inventory(),
            pol.rules,
            now,
            pol.mig,
            self.gather.unhealthy(),
            POLICIES[pol.placement],
            tuple(self.reservations.current(now)),
            self.gather.cpu_topology() if cores else None,
            tuple(cpus.parse_list(pol.reserved_cpus)),
            pol.pending_ttl,
            clocks.mark,
        )

    def scope(self, req: LeaseRequest) -> Scope | Refusal | Invalid:
        """`grant_plan.scope`: the policy's first word, which needs no ledger, so a create
        is refused by it without the lock (`plan` asks it again)."""
        return grant_plan.scope(req, self.gather.inventory(), self.gather.rules)

    def plan(
        self,
        state: State,
        req: LeaseRequest,
        kept: Mapping[str, Holder] | None = None,
        *,
        predecessor: tuple[str, str] | None = None,
        stopped: Mapping[str, str] | None = None,
        host: HostNow | None = None,
    ) -> Decided:
        """`grant_plan.plan` for ``req`` in ``state`` as the host is now (or ``host``,
        read already), taking nothing."""
        host = host or self.seen(req.resources.any)
        return grant_plan.plan(req, host, state, kept, predecessor=predecessor, stopped=stopped)

    def take(
        self,
        state: State,
        req: LeaseRequest,
        kept: Mapping[str, Holder] | None = None,
        *,
        predecessor: tuple[str, str] | None = None,
        stopped: Mapping[str, str] | None = None,
        host: HostNow | None = None,
    ) -> Taken | Shortage | Refusal | Invalid:
        """Plan and record a pending lease in ``state`` (the caller holds the lock):
        (lease, token, the predecessor's lease if it lent its GPUs), or why not."""
        host = host or self.seen(req.resources.any)
        planned = grant_plan.plan(req, host, state, kept, predecessor=predecessor, stopped=stopped)
        if not isinstance(planned, grant_plan.Plan):
            return planned
        return grant_plan.record(state, req, planned, host)
