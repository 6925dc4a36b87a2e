"""The waiting line's part of the allocator: serving it, and what it keeps from others.

`serve_waiters` is the queue's own serving (`core.rules.queue.serve`), run by the shim's
Waitline at every wake-up.  `kept` is what every other lease must leave alone: a create
arriving now takes its place in the order (`core.rules.queue.ahead_of`), and the waiters ahead
of it keep the GPUs they would be given or could use (`core.rules.queue.kept`), tried on a
copy of the state so that nothing is granted.  The line itself lives in the shim
(``waiting``, set by its Waitline); elsewhere it is empty and this costs nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from allocator.core.grant_plan import LeaseRequest
from allocator.core.leases.holders import Holder
from allocator.core.leases.leases import Lease, State
from allocator.core.placement import Shortage
from allocator.core.rules import policy, queue
from allocator.host import metrics
from allocator.host.ledger import Ledger
from allocator.service.fair_share import FairShare
from allocator.service.gather import Gatherer
from allocator.service.placer import Placer
from allocator.service.recorder import Recorder

_KEPT = Holder(None, "", "kept for a create ahead in the queue", owner="the queue")


class Lineup:
    """The line's grants (`serve_waiters`) and what it keeps from others (`kept`).

    ``waiting`` returns the creates waiting in line; the shim's Waitline sets it, and
    elsewhere the line is empty.  ``fair_share``: each owner's decayed usage, which
    orders equal priorities when policy.fair_share is set.
    """

    def __init__(
        self,
        ledger: Ledger,
        gather: Gatherer,
        placer: Placer,
        recorder: Recorder,
        fair_share: FairShare,
    ):
        self.ledger = ledger
        self.gather = gather
        self.placer = placer
        self.recorder = recorder
        self.fair_share = fair_share
        self.waiting: Callable[[], list[queue.Waiter]] = list

    def serve_waiters(
        self, waiters: list[queue.Waiter]
    ) -> list[tuple[queue.Waiter, tuple[Lease, str]]]:
        """Grant what the queue allows now, in its order, under one ledger transaction.

        Each ``waiter.ask`` is a `LeaseRequest`.  The grant is the one plan's
        (`core.grant_plan.plan`, by `Placer.take`), so a waiter is granted exactly as a
        create arriving now would be, minus the GPUs kept for waiters ahead of it
        (`core.rules.queue.serve`).
        """
        if not waiters:
            return []
        usage = self.usage()  # before the lock
        with self.ledger.transaction() as state:
            held = {w.owner: state.held_by(w.owner) for w in waiters}
            granted = queue.serve(waiters, held, self._attempt(state, waiters), usage)
        now = time.time()  # the clock the line stamps `since` with
        for w, placed in granted:
            metrics.request("granted")
            waited = None if w.since is None else max(0.0, now - w.since)
            self.recorder.record(
                "grant", placed.result[0], reason="served from the queue", waited_s=waited
            )
        return [(w, placed.result) for w, placed in granted]

    def kept(self, state: State, req: LeaseRequest) -> dict[str, Holder]:
        """GPU -> who keeps it from ``req``, a create arriving now: the waiters ahead of it
        in the line's order (rule 4 of `core.rules.queue`)."""
        waiters = self.waiting()
        if not waiters:
            return {}
        owner, last = req.owner, max(w.arrived for w in waiters)
        rules = self.gather.rules
        newcomer = queue.Waiter("", owner.user, policy.priority_of(owner, rules), last + 1, 0)
        held = {w.owner: state.held_by(w.owner) for w in (*waiters, newcomer)}
        usage = self.usage()
        ahead = queue.ahead_of(newcomer, waiters, held, usage)
        if not ahead:
            return {}
        keeps = queue.kept(ahead, self._attempt(state.copy(), ahead))
        return {uuid: queue.keeper(w, w.ask.name) for uuid, w in keeps.items()}

    def usage(self) -> queue.Usage:
        """Each owner's decayed usage when policy.fair_share orders the line, else None."""
        return self.fair_share.usage(self.gather.rules.fair_share_half_life)

    def _attempt(self, state: State, waiters: Iterable[queue.Waiter]) -> queue.Attempt:
        """Place a waiter in ``state`` by the one grant plan (`Placer.take`), as a create
        arriving now is placed, besides ``blocked``; the host read once for ``waiters``."""
        host = self.placer.seen(any(w.ask.resources.any for w in waiters))

        def attempt(
            w: queue.Waiter, blocked: frozenset[str]
        ) -> queue.Placed | queue.Short | queue.OverLimit:
            req: LeaseRequest = w.ask
            taken = self.placer.take(state, req, dict.fromkeys(blocked, _KEPT), host=host)
            if isinstance(taken, tuple):
                return queue.Placed(taken[0].gpus, taken[:2], taken[0].gpus_held)
            if isinstance(taken, Shortage):
                return queue.Short(taken.usable)
            return queue.OverLimit(taken.msg)

        return attempt
