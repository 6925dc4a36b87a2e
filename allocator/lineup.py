"""The waiting line's part of the allocator: serving it, and what it keeps from others.

`serve_waiters` is the queue's own serving (`core.queue.serve`), run by the shim's
Waitline at every wake-up.  `kept` is what every other lease must leave alone: a create
arriving now takes its place in the order (`core.queue.ahead_of`), and the waiters ahead
of it keep the GPUs they would be given or could use (`core.queue.kept`), tried on a
copy of the state so that nothing is granted.  The line itself lives in the shim
(``waiting``, set by its Waitline); elsewhere it is empty and this costs nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol, Unpack

from allocator.core import policy, queue
from allocator.core.holders import Holder
from allocator.core.leases import Lease, State
from allocator.core.placement import usable
from allocator.core.policy import Refusal
from allocator.host import ledger, metrics

if TYPE_CHECKING:
    from allocator.core import cpus
    from allocator.core.inventory import Inventory
    from allocator.core.placement import Shortage
    from allocator.core.policy import Rules
    from allocator.gather import AuditFields
    from allocator.host.config import Config
    from allocator.host.ledger import Ledger
    from allocator.service import LeaseRequest


class _Service(Protocol):
    """What the line uses of the `allocator.service.Allocator` it is a part of."""

    ledger: Ledger
    config: Config
    waiting: Callable[[], list[queue.Waiter]]

    @property
    def rules(self) -> Rules: ...
    def record(
        self, kind: str, lease: Lease | None = None, **fields: Unpack[AuditFields]
    ) -> None: ...
    def inventory(self, cached: bool = False) -> Inventory: ...
    def unhealthy(self) -> dict[str, str]: ...
    def cpu_topology(self) -> cpus.Topology: ...
    def _attempt(self, state: State) -> queue.Attempt: ...
    def keep_reserved(
        self, held: dict[str, Holder], owner: policy.Owner, limit: float | None, now: float
    ) -> dict[str, Holder]: ...
    def _take(
        self,
        state: State,
        req: LeaseRequest,
        scope: tuple[Inventory, str | None],
        topology: cpus.Topology | None,
        kept: Mapping[str, Holder] | None = None,
    ) -> tuple[Lease, str, Lease | None] | Shortage | Refusal: ...


_KEPT = Holder(None, "", "kept for a create ahead in the queue", owner="the queue")


class Lineup:
    def serve_waiters(
        self: _Service, waiters: list[queue.Waiter]
    ) -> list[tuple[queue.Waiter, tuple[Lease, str]]]:
        """Grant what the queue allows now, in its order, under one ledger transaction.

        Each ``waiter.ask`` is a `LeaseRequest`.  The placement and limits are
        `_take`'s, so a waiter is granted exactly as a create arriving now would be,
        minus the GPUs kept for waiters ahead of it (`core.queue.serve`).
        """
        if not waiters:
            return []
        with self.ledger.transaction() as state:
            held = {w.owner: state.held_by(w.owner) for w in waiters}
            granted = queue.serve(waiters, held, self._attempt(state))
        for _, placed in granted:
            metrics.request("granted")
            self.record("grant", placed.result[0], reason="served from the queue")
        return [(w, placed.result) for w, placed in granted]

    def kept(self: _Service, state: State, req: LeaseRequest) -> dict[str, Holder]:
        """GPU -> who keeps it from ``req``, a create arriving now: the waiters ahead of it
        in the line's order (rule 4 of `core.queue`)."""
        waiters = self.waiting()
        if not waiters:
            return {}
        owner, last = req.owner, max(w.arrived for w in waiters)
        newcomer = queue.Waiter("", owner.user, policy.priority_of(owner, self.rules), last + 1, 0)
        held = {w.owner: state.held_by(w.owner) for w in (*waiters, newcomer)}
        ahead = queue.ahead_of(newcomer, waiters, held)
        if not ahead:
            return {}
        keeps = queue.kept(ahead, self._attempt(copy.deepcopy(state)))
        return {uuid: queue.keeper(w, w.ask.name) for uuid, w in keeps.items()}

    def _attempt(self: _Service, state: State) -> queue.Attempt:
        """Place a waiter in ``state`` as `_take` places any create, besides ``blocked``."""
        rules, inventory = self.rules, self.inventory()
        sick, mig = self.unhealthy(), self.config.policy.mig

        def attempt(
            w: queue.Waiter, blocked: frozenset[str]
        ) -> queue.Placed | queue.Short | queue.OverLimit:
            req: LeaseRequest = w.ask
            scope = policy.eligible(inventory, req.want, req.owner, rules, req.ask.required)
            if not isinstance(scope, tuple):
                return queue.OverLimit(scope.msg)
            topology = self.cpu_topology() if req.resources.any else None
            taken = self._take(state, req, scope, topology, dict.fromkeys(blocked, _KEPT))
            if isinstance(taken, tuple):
                return queue.Placed(taken[0].gpus, taken[:2])
            if isinstance(taken, Refusal):
                return queue.OverLimit(taken.msg)
            holders = state.holders(inventory.uuids)
            now = ledger.now()  # what reservations keep from it (reserving.py):
            holders = self.keep_reserved(holders, req.owner, req.limit, now)
            return queue.Short(usable(req.ask, scope[0], holders, sick, mig))

        return attempt
