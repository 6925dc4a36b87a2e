"""The service: for each event, gather the facts, call the core, apply what it returns.

Theory of operation
-------------------
A lease is taken under the ledger lock from the GPUs no lease or claim holds.
The common path makes no Engine call: the ledger knows every lease, and claims
of containers gpu-alloc did not create are adopted once, by `reconcile`
(allocator/reconciler.py).  Reconcile runs at shim start, for `status`, and
whenever a create finds too few free GPUs: a GPU freed by ``docker rm`` or
``--rm`` (which never pass the plugin with the container's GPUs) is therefore
reclaimed exactly when someone needs it.  The facts come from
allocator/gather.py; every decision itself is made in allocator/core/.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace

from allocator.core import compose, cpus, labels, plugins, policy, timelimits
from allocator.core.ask import Ask
from allocator.core.holders import Holder
from allocator.core.inflight import Target
from allocator.core.inventory import Inventory
from allocator.core.leases import Claim, Lease, Phase, State, StateError, admission
from allocator.core.outcomes import Bind, Forget, Unanswered
from allocator.core.placement import Shortage, place
from allocator.core.policy import NOBODY, Invalid, Owner, Refusal, Wanted
from allocator.core.verdicts import (
    ALLOW,
    HINT,
    AllowStart,
    Decision,
    Deny,
    NeedsLease,
    StartCheck,
    UpdateCheck,
)
from allocator.host import ledger, metrics
from allocator.host.config import Config
from allocator.host.engine import Engine, EngineError
from allocator.lineup import Lineup
from allocator.lookups import Lookups
from allocator.restarts import Restarts

log = logging.getLogger("gpu-alloc")


@dataclass(frozen=True)
class LeaseRequest:
    """What a create asks of `Allocator.lease`, kept whole so a waiter can ask again."""

    ask: Ask
    name: str
    owner: Owner
    want: Wanted
    resources: cpus.Resources = cpus.NOTHING


class Allocator(Lineup, Lookups, Restarts):
    # ------------------------------------------------------------ leases

    def lease(
        self,
        ask: Ask,
        name: str = "",
        labels: dict[str, str] | None = None,
        owner: Owner = NOBODY,
        want: Wanted = Wanted(),  # noqa: B008  # frozen
        resources: cpus.Resources = cpus.NOTHING,
        *,
        durable: bool = True,
        waits: bool = False,
    ) -> tuple[Lease, str] | Shortage | Refusal | Invalid:
        """Place and record a pending lease; on shortage, reconcile once and retry.

        The grant is on disk and in the audit trail when this returns, unless
        ``durable`` is False: then the caller runs `finish_grant` before it tells anyone
        (the shim, while dockerd creates the container).  A refusal is in the audit trail
        too, unless the create ``waits`` in line for it to pass: then the caller tells
        `refused` if it never did.

        The policy decides first: the pool and request labels narrow the GPUs, and the
        owner's limit counts every GPU their leases hold, under the lock.

        A create that replaces a stopped container of the same Compose service (compose
        stops the old one and renames it ``<short id>_<name>`` before creating the new
        one) may take over the old container's GPUs, so recreating a service on a full
        host needs no more free GPUs than it had.  The old container's restart policy
        is turned off before (`Restarts.hold_down`): dockerd would start it unasked.
        """
        rules = self.rules
        scope = policy.eligible(self.inventory(), want, owner, rules, ask.required)
        scope = timelimits.within(scope, rules, owner, want.time)
        if not isinstance(scope, tuple):
            self.refused(scope, name, owner)
            return scope
        topology = self.cpu_topology() if resources.any else None
        req = LeaseRequest(ask, name, owner, want, resources)
        defer = not durable
        result = self._try_lease(req, scope, topology, defer=defer)
        # A removal that never passed the plugin (--rm, the daemon's own) still holds a
        # lease until reconciled: before saying "short" or "over your limit", reconcile.
        # Its listing says which holders are stopped: a shortage is placed again to say
        # so, when that is all it learnt (no Engine call: a stopped holder looks unused).
        stopped: dict[str, str] = {}
        if isinstance(result, Shortage | Refusal) and self.engine is not None:
            report = self.reconcile()
            stopped = report.stopped
            if report or (isinstance(result, Shortage) and stopped):
                result = self._try_lease(req, scope, topology, stopped=stopped, defer=defer)
        # A Compose recreate may take over its predecessor's GPUs: when the host is full,
        # and when the owner is at their limit (the old container's GPUs count there).
        if isinstance(result, Shortage | Refusal) and self.engine is not None:
            predecessor = self._compose_predecessor(name, labels or {})
            was = self.hold_down(predecessor[0]) if predecessor is not None else None
            if predecessor is not None and was is not None:
                retry = self._try_lease(
                    req, scope, topology, predecessor, stopped=stopped, defer=defer
                )
                if isinstance(retry, tuple):
                    self.held_down(predecessor, was, name)
                    result = retry
                else:
                    self.put_back(predecessor[0], was)
                    if isinstance(result, Shortage) and isinstance(retry, Shortage):
                        result = retry
        if isinstance(result, tuple):
            metrics.request("granted")
        elif not (waits and result.waitable):
            self.refused(result, name, owner)
        if durable and isinstance(result, tuple):
            self.ledger.sync_grant(result[0].id)
        return result

    def finish_grant(self, lease: Lease) -> None:
        """What a grant made with ``durable=False`` still owes: its record on disk, then
        its audit line."""
        try:
            self.ledger.sync_grant(lease.id)
        finally:
            self.record("grant", lease)

    def refused(self, result: Shortage | Refusal | Invalid, name: str, owner: Owner) -> None:
        """Metrics and the audit trail for a create that gets no lease."""
        metrics.request("short" if isinstance(result, Shortage) else "policy")
        self.record("refusal", name=name, owner=owner.user, reason=result.msg)

    def explain(
        self, ask: Ask, owner: Owner, want: Wanted
    ) -> tuple[list[str], str | None] | Shortage | Refusal | Invalid:
        """What `lease` would answer now, taking nothing: (GPUs, pool) or the refusal.

        The ledger is read without the lock, so the answer can be stale by one create.
        """
        scope = policy.eligible(self.inventory(), want, owner, self.rules, ask.required)
        scope = timelimits.within(scope, self.rules, owner, want.time)
        if not isinstance(scope, tuple):
            return scope
        inventory, pool = scope
        state = self.ledger.read()
        asking = len(inventory.gpus) if ask.every else len(ask.required) + ask.count
        refused = policy.over_limit(owner, state.held_by(owner.user), asking, self.rules)
        if refused is not None:
            return refused
        held = state.holders(self.inventory().uuids)
        for uuid, keeper in self.kept(state, LeaseRequest(ask, "", owner, want)).items():
            held.setdefault(uuid, keeper)
        picked = place(
            ask,
            inventory,
            held,
            self.policy,
            ledger.now(),
            want.where(pool),
            self.unhealthy(),
            self.config.policy.mig,
            len(self.inventory().units(self.config.policy.mig)),
        )
        if isinstance(picked, Shortage):
            return picked
        return [g.uuid for g in picked], pool

    def _try_lease(
        self,
        req: LeaseRequest,
        scope: tuple[Inventory, str | None],
        topology: cpus.Topology | None,
        predecessor: tuple[str, str] | None = None,
        *,
        stopped: Mapping[str, str] | None = None,
        defer: bool = False,
    ) -> tuple[Lease, str] | Shortage | Refusal:
        """`_take` under the ledger lock, and its audit lines.  ``stopped``: container ->
        status, for the holders reconcile last listed not running (`Holder.stopped`)."""
        with self.ledger.transaction(grant=True) as state:
            kept = self.kept(state, req)
            taken = self._take(
                state, req, scope, topology, kept, predecessor=predecessor, stopped=stopped
            )
        if not isinstance(taken, tuple):
            return taken
        lease, token, old = taken
        if not defer:
            self.record("grant", lease)
        if old is not None and predecessor is not None:
            self.record("hand-over", old, reason=f"to lease {lease.id} replacing it ({req.name})")
        return lease, token

    def _take(
        self,
        state: State,
        req: LeaseRequest,
        scope: tuple[Inventory, str | None],
        topology: cpus.Topology | None,
        kept: Mapping[str, Holder] | None = None,
        predecessor: tuple[str, str] | None = None,
        stopped: Mapping[str, str] | None = None,
    ) -> tuple[Lease, str, Lease | None] | Shortage | Refusal:
        """Place and record a pending lease in ``state`` (the caller holds the lock).

        ``kept`` GPUs are kept for a waiter ahead in the line (`Lineup.kept`): they
        count as held, by that waiter; ``stopped`` holders are said to be (`_try_lease`).  Returns
        (lease, token, the predecessor's lease if it lent its GPUs).
        """
        ask, owner, want = req.ask, req.owner, req.want
        inventory, pool = scope
        where = want.where(pool)
        now = ledger.now()
        sick, mig = self.unhealthy(), self.config.policy.mig
        host = len(self.inventory().units(mig))
        held = state.holders(self.inventory().uuids, stopped)
        for uuid, keeper in (kept or {}).items():
            held.setdefault(uuid, keeper)
        old = state.lease_of(predecessor[0]) if predecessor else None
        # Only the owner's own predecessor lends its GPUs (leases from before owners
        # were recorded have none, and may).
        if predecessor and (
            old is None or old.phase is not Phase.BOUND or old.owner not in ("", owner.user)
        ):
            # It lends nothing: a shortage is said as placed now; `lease` keeps its first
            # answer for anything else.
            short = place(ask, inventory, held, self.policy, now, where, sick, mig, host)
            if isinstance(short, Shortage):
                return short
            return Refusal("gpu-alloc: the predecessor is not this owner's bound lease")
        asking = len(inventory.gpus) if ask.every else len(ask.required) + ask.count
        holding = state.held_by(owner.user, besides=old.id if old else None)
        refused = policy.over_limit(owner, holding, asking, self.rules)
        if refused is not None:
            return refused
        for uuid in old.gpus if old else ():
            held.pop(uuid, None)
        picked = place(ask, inventory, held, self.policy, now, where, sick, mig, host)
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
            time_limit=timelimits.effective(self.rules, owner, pool, want.time),
        )
        state.leases[lease.id] = lease
        if old is not None and predecessor is not None:
            state.hand_over(old.id, lease.id, predecessor[1])
        return lease, token, old

    def _compose_predecessor(self, name: str, given: dict[str, str]) -> tuple[str, str] | None:
        """(id, current name) of the container this Compose create replaces, if any."""
        project = given.get(compose.PROJECT)
        if not (name and project and given.get(compose.SERVICE) and self.engine is not None):
            return None
        listed = self.engine.containers(label=f"{compose.PROJECT}={project}")
        return compose.predecessor(name, given, listed)

    def resolve(self, decision: Decision) -> Decision:
        """Settle the decisions that need the ledger into `Allow` or `Deny`."""
        if isinstance(decision, NeedsLease):
            lease = self.ledger.lease(decision.lease_id)
            why = admission(lease, decision.lease_id, decision.token, decision.gpus)
            if why is not None:
                return Deny(
                    f"gpu-alloc refused the container create: {why}; {HINT}", "Config.Labels"
                )
            log.debug("allowed leased create (lease %s)", decision.lease_id)
            return ALLOW
        if isinstance(decision, StartCheck):
            info = self.engine.inspect(decision.ref) if self.engine else None
            why = self.start_refusal(decision.ref, info)
            return AllowStart(Target.of(info)) if why is None else Deny(why)
        if isinstance(decision, UpdateCheck):
            why = decision.restart and self.restart_refusal(decision.ref, decision.restart)
            why = why or (
                self.update_refusal(decision.ref, decision.fields) if decision.fields else None
            )
            return ALLOW if why is None else Deny(why)
        if isinstance(decision, plugins.PluginCheck):  # no Engine: no managed plugin
            why = plugins.refusal(decision, self.engine.plugins() if self.engine else [])
            return ALLOW if why is None else Deny(why)
        return decision

    def update_refusal(self, ref: str, fields: tuple[str, ...]) -> str | None:
        """``docker update`` may not move a lease's cores or memory: others lease the rest."""
        try:
            state = self.ledger.read()
        except StateError as e:  # cores and memory are not GPUs: keep updates working
            log.warning("update of %s allowed unchecked: %s", ref, e)
            return None
        every: tuple[Lease | Claim, ...] = (*state.leases.values(), *state.claims.values())
        if not any(h.cpus or h.memory for h in every):
            return None  # the common case: no CPU or memory lease, no Engine call
        held: Lease | Claim | None
        if self.engine is None:  # no Engine to resolve the name: the ledger's own words
            held = next((h for h in every if ref in (h.container, h.name)), None)
        else:
            info = self.engine.inspect(ref)
            held = (state.lease_of(info["Id"]) or state.claims.get(info["Id"])) if info else None
        owned = cpus.owned_fields(held.cpus, held.memory) if held else ()
        clash = [f for f in fields if f in owned]
        if not clash:
            return None
        how = f"lease {held.id}" if isinstance(held, Lease) else "adopted after a repair"
        return (
            f"gpu-alloc refused the container update: {', '.join(clash)} of {ref} were leased "
            f"with its GPUs ({how}), and other containers lease "
            "the cores and memory around them; recreate the container with other "
            "io.gpu-alloc.request.* labels instead"
        )

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
        self._ended(lease, reason)
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
            self._ended(lease, "container removed")


def connect(config: Config) -> Allocator:
    """The service for this host: its config, and the Engine its config names."""
    return Allocator(config, Engine(config.engine.socket, config.engine.timeout))
