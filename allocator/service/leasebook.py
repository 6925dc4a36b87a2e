"""The lease book: every change to a lease, over the ledger.

One part of the composed service (allocator/service/wiring.py).  A lease is taken under the
ledger lock as the one grant plan decides it (`lease`, by `Placer.take`:
allocator/core/grant_plan.py), bound to its container when the Engine answers the
create (`settle`, `bind`), and ended when its container is proven gone (`settle` with
`Forget`, `release`).  The common path makes no Engine call: the ledger knows every
lease, and claims of containers gpu-alloc did not create are adopted once, by
`Reconciler.reconcile`, which runs whenever a create finds too few free GPUs: a GPU
freed by ``docker rm`` or ``--rm`` (which never pass the plugin with the container's
GPUs) is therefore reclaimed exactly when someone needs it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from allocator.core import grant_plan
from allocator.core.api import labels
from allocator.core.grant_plan import LeaseRequest
from allocator.core.judging import compose
from allocator.core.judging.ask import Ask
from allocator.core.leases.leases import Lease
from allocator.core.leases.outcomes import Bind, Forget, Unanswered
from allocator.core.machine import cpus
from allocator.core.placement import Shortage
from allocator.core.rules.policy import Invalid, Owner, Refusal, Wanted
from allocator.core.rules.sharing import ShareAsk
from allocator.host import metrics
from allocator.host.engine import Engine, EngineError
from allocator.host.ledger import Ledger
from allocator.service.lineup import Lineup
from allocator.service.placer import Placer
from allocator.service.reconciler import Reconciler
from allocator.service.recorder import Recorder
from allocator.service.restarts import Restarts

log = logging.getLogger("gpu-alloc")


class LeaseBook:
    """Grants (`lease`, `finish_grant`, `explain`) and their ends (`settle`, `bind`,
    `release`), each written to the ledger and told to the `Recorder`.

    It asks the ``reconciler`` before saying "short", the ``line`` what its waiters
    keep, and ``restarts`` to hold a Compose predecessor's restart policy down.
    """

    def __init__(
        self,
        engine: Engine | None,
        ledger: Ledger,
        recorder: Recorder,
        placer: Placer,
        line: Lineup,
        reconciler: Reconciler,
        restarts: Restarts,
    ):
        self.engine = engine
        self.ledger = ledger
        self.recorder = recorder
        self.placer = placer
        self.line = line
        self.reconciler = reconciler
        self.restarts = restarts

    def lease(
        self, req: LeaseRequest, *, durable: bool = True, waits: bool = False
    ) -> tuple[Lease, str] | Shortage | Refusal | Invalid:
        """Place and record a pending lease; on shortage, reconcile once and retry.

        The grant is on disk and in the audit trail when this returns, unless
        ``durable`` is False: then the caller runs `finish_grant` before it tells anyone
        (the shim, while dockerd creates the container).  A refusal is in the audit trail
        too, unless the create ``waits`` in line for it to pass: then the caller tells
        `Recorder.refused` if it never did.

        The policy decides first: the pool and request labels narrow the GPUs, and the
        owner's limit counts every GPU their leases hold, under the lock.

        A create that replaces a stopped container of the same Compose service (compose
        stops the old one and renames it ``<short id>_<name>`` before creating the new
        one) may take over the old container's GPUs, so recreating a service on a full
        host needs no more free GPUs than it had.  The old container's restart policy
        is turned off before (`Restarts.hold_down`): dockerd would start it unasked.
        """
        name, owner = req.name, req.owner
        early = self.placer.scope(req)  # the policy's own refusals need no lock
        if not isinstance(early, tuple):
            self.recorder.refused(early, name, owner)
            return early
        defer = not durable
        result = self._try_lease(req, defer=defer)
        # A removal that never passed the plugin (--rm, the daemon's own) still holds a
        # lease until reconciled: before saying "short" or "over your limit", reconcile.
        # Its listing says which holders are stopped: a shortage is placed again to say
        # so, when that is all it learnt (no Engine call: a stopped holder looks unused).
        stopped: dict[str, str] = {}
        if isinstance(result, Shortage | Refusal) and self.engine is not None:
            report = self.reconciler.reconcile()
            stopped = report.stopped
            if report or (isinstance(result, Shortage) and stopped):
                result = self._try_lease(req, stopped=stopped, defer=defer)
        # A Compose recreate may take over its predecessor's GPUs: when the host is full,
        # and when the owner is at their limit (the old container's GPUs count there).
        if isinstance(result, Shortage | Refusal) and self.engine is not None:
            predecessor = self._compose_predecessor(name, req.labels or {})
            was = self.restarts.hold_down(predecessor[0]) if predecessor is not None else None
            if predecessor is not None and was is not None:
                retry = self._try_lease(req, predecessor, stopped=stopped, defer=defer)
                if isinstance(retry, tuple):
                    self.restarts.held_down(predecessor, was, name)
                    result = retry
                else:
                    self.restarts.put_back(predecessor[0], was)
                    if isinstance(result, Shortage) and isinstance(retry, Shortage):
                        result = retry
        if isinstance(result, tuple):
            metrics.request("granted")
        elif not (waits and isinstance(result, Shortage | Refusal) and result.waitable):
            self.recorder.refused(result, name, owner)
        if durable and isinstance(result, tuple):
            self.ledger.sync_grant(result[0].id)
        return result

    def finish_grant(self, lease: Lease) -> None:
        """What a grant made with ``durable=False`` still owes: its record on disk, then
        its audit line."""
        try:
            self.ledger.sync_grant(lease.id)
        finally:
            self.recorder.record("grant", lease)

    def plan(self, req: LeaseRequest) -> grant_plan.Decided:
        """The plan `lease` would make now (its first try), taking nothing: the same
        `grant_plan.plan`, around the same GPUs the line keeps.

        The ledger is read without the lock, so the answer can be stale by one create.
        """
        early = self.placer.scope(req)
        if not isinstance(early, tuple):
            return early
        state = self.ledger.read()
        return self.placer.plan(state, req, self.line.kept(state, req))

    def explain(
        self,
        ask: Ask,
        owner: Owner,
        want: Wanted,
        share: ShareAsk | None = None,
        resources: cpus.Resources = cpus.NOTHING,
    ) -> tuple[list[str], str | None] | Shortage | Refusal | Invalid:
        """`plan` for a create asking this, as (GPUs, pool) or why not.  ``share``: part
        of a shared GPU (allocator/core/rules/sharing.py); ``resources``: cores and memory."""
        planned = self.plan(LeaseRequest(ask, "", owner, want, resources, share=share))
        if not isinstance(planned, grant_plan.Plan):
            return planned
        return list(planned.gpus), planned.pool

    def _try_lease(
        self,
        req: LeaseRequest,
        predecessor: tuple[str, str] | None = None,
        *,
        stopped: Mapping[str, str] | None = None,
        defer: bool = False,
    ) -> tuple[Lease, str] | Shortage | Refusal | Invalid:
        """`Placer.take` under the ledger lock, around the GPUs the line keeps, and its
        audit lines.  ``stopped``: container -> status, for the holders reconcile last
        listed not running (`Holder.stopped`)."""
        with self.ledger.transaction(grant=True) as state:
            kept = self.line.kept(state, req)
            taken = self.placer.take(state, req, kept, predecessor=predecessor, stopped=stopped)
        if not isinstance(taken, tuple):
            return taken
        lease, token, old = taken
        if not defer:
            self.recorder.record("grant", lease)
        if old is not None and predecessor is not None:
            self.recorder.record(
                "hand-over", old, reason=f"to lease {lease.id} replacing it ({req.name})"
            )
        return lease, token

    def _compose_predecessor(self, name: str, given: Mapping[str, str]) -> tuple[str, str] | None:
        """(id, current name) of the container this Compose create replaces, if any."""
        project = given.get(compose.PROJECT)
        if not (name and project and given.get(compose.SERVICE) and self.engine is not None):
            return None
        listed = self.engine.containers(label=f"{compose.PROJECT}={project}")
        return compose.predecessor(name, given, listed)

    def settle_unanswered(self, lease_id: str, label: str, token: str) -> None:
        """A create got an answer other than 201: free the lease only if no container has it.

        dockerd may have created the container and then failed the call (the plugin's
        AuthZRes broke, say), so an error status alone proves nothing.  Only the lease's
        own create counts: a failed create with a made-up header for it frees nothing.
        """
        lease = self.ledger.read().leases.get(lease_id)
        if lease is None or not lease.token_matches(token):
            return
        if self.engine is None:
            self.release(lease_id, "the Engine refused the create")
            return
        try:
            made = self.engine.containers(label=f"{labels.LEASE}={label}")
        except EngineError as e:
            log.warning("lease %s stays pending until reconciled: %s", lease_id, e)
            return
        if made:
            self.bind(lease_id, made[0]["Id"])
            log.warning(
                "lease %s: the create failed but container %s exists; bound to it",
                lease_id,
                made[0]["Id"][:12],
            )
        else:
            self.release(lease_id, "the Engine refused the create; no container has it")

    def bind(
        self, lease_id: str, container: str, token: str | None = None, admitted: bool = False
    ) -> bool:
        """Bind the lease to ``container``; with ``token``, only if it is the lease's (a
        create's answer: its lease header could have been made up), unless the plugin
        ``admitted`` the create by it already (`outcomes.Bind`)."""
        if token is not None and admitted:
            return self.ledger.record_bind(lease_id, container)
        lease = self.ledger.read().leases.get(lease_id)
        if lease is not None and token is not None and not lease.token_matches(token):
            log.warning("lease %s: a create with a forged lease header was answered", lease_id)
            return False
        if lease is not None and lease.container == container:
            return True  # the plugin's AuthZRes bound it already: no lock, no write
        if token is not None:
            if lease is None or lease.container is not None:
                return False  # gone, or the Engine named another container for it already
            return self.ledger.record_bind(lease_id, container)
        with self.ledger.transaction() as state:
            return state.bind(lease_id, container)

    def release(self, lease_id: str, reason: str = "the create failed") -> Lease | None:
        with self.ledger.transaction() as state:
            lease = state.release(lease_id)
        self.recorder.ended(lease, reason)
        return lease

    def settle(self, outcome: Bind | Unanswered | Forget | None) -> None:
        """Apply what the Engine's answer to a create or a removal means for the ledger
        (`outcomes.create_outcome` is the rule; the shim and the plugin both come here)."""
        if isinstance(outcome, Bind):
            self.bind(outcome.lease_id, outcome.container, outcome.token, outcome.admitted)
        elif isinstance(outcome, Unanswered):
            self.settle_unanswered(outcome.lease_id, outcome.label, outcome.token)
        elif isinstance(outcome, Forget):
            self._forget(outcome.ref)

    def _forget(self, ref: str) -> None:
        """After ``DELETE /containers/ref``: end the leases whose container is proven gone.

        dockerd resolved ``ref`` as full id, exact name, then unique id prefix, so a
        decoy named like another container's id prefix is what it removed.  ``ref``
        only picks the leases to ask about; each ends once its container's full id
        answers 404.  A lease missed here (a stale name) is freed by reconcile.
        """
        if self.engine is None:
            return
        name = ref.lstrip("/")
        asked = [
            le
            for le in self.ledger.read().leases.values()
            if le.container and (le.container.startswith(ref) or le.name == name)
        ]
        gone = [le for le in asked if self.engine.inspect(str(le.container)) is None]
        if not gone:
            return
        ended = []
        with self.ledger.transaction() as state:
            for le in gone:
                now = state.leases.get(le.id)
                if now is not None and now.container == le.container:
                    ended.append(state.release(le.id))
        for lease in ended:
            self.recorder.ended(lease, "container removed")
