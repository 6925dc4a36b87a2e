"""The allocator: ledger + inventory + Engine, for the shim, the plugin and the CLI.

Theory of operation
-------------------
A lease is taken under the ledger lock from the GPUs no lease or claim holds.
The common path makes no Engine call: the ledger knows every lease, and claims
of containers gpu-alloc did not create are adopted once, by `reconcile`.
`reconcile` asks the Engine what exists (outside the lock, so a slow Engine
never holds the lock), then, under the lock, frees leases whose container is
gone, binds pending leases whose container turned up (found by label), frees
pending leases past their deadline with no container, and adopts unknown
containers' GPU access as claims.  It runs at shim start, for `status`, and
whenever a create finds too few free GPUs: a GPU freed by ``docker rm`` or
``--rm`` (which never pass the plugin with the container's GPUs) is therefore
reclaimed exactly when someone needs it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import replace

from allocator.core import access, compose, labels
from allocator.core.access import EngineView
from allocator.core.ask import Ask
from allocator.core.inventory import Inventory
from allocator.core.leases import Claim, Lease, Phase, StateError
from allocator.core.placement import POLICIES, Shortage, place
from allocator.core.reconcile import Report, apply
from allocator.core.verdicts import (
    ALLOW,
    HINT,
    Bind,
    Decision,
    Deny,
    Facts,
    Forget,
    NeedsLease,
    Release,
    StartCheck,
)
from allocator.host import ledger
from allocator.host.config import Config
from allocator.host.engine import Engine, EngineError
from allocator.host.filesystem import Host
from allocator.host.health import HealthFile
from allocator.host.inventory import load as load_inventory
from allocator.host.ledger import Ledger

INVENTORY_MAX_AGE = 10.0
log = logging.getLogger("gpu-alloc")
ENGINE_VIEW_MAX_AGE = 30.0


class Allocator:
    def __init__(self, config: Config, engine: Engine | None = None, host: Host | None = None):
        self.config = config
        self.engine = engine
        self.ledger = Ledger(config.state_dir, config.policy.lock_timeout)
        self.health = HealthFile(self.ledger)
        self.policy = POLICIES[config.policy.placement]
        self.host = (host or Host()).with_protected(config.state_dir)
        self._inventory: tuple[object, Inventory] | None = None
        self._view: tuple[float, EngineView] | None = None
        self._no_gpu: set[str] = set()  # containers inspected and found without GPUs
        self._lock = threading.Lock()
        self._reconciling = threading.Condition()
        self._reconcile_running = False
        self._last_reconcile: tuple[float, bool, Report] | None = None

    # ------------------------------------------------------------- facts

    def inventory(self) -> Inventory:
        """NVML is asked again every few seconds; a simulated file whenever it changes."""
        stamp = self._inventory_stamp()
        with self._lock:
            if self._inventory is None or self._inventory[0] != stamp:
                self._inventory = (stamp, load_inventory(self.config.gpus))
            return self._inventory[1]

    def _inventory_stamp(self) -> object:
        if self.config.gpus == "nvml":
            return int(time.monotonic() // INVENTORY_MAX_AGE)
        try:
            st = os.stat(self.config.gpus)
        except OSError:
            return None  # load_inventory reports it
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def engine_view(self) -> EngineView:
        """The Engine's runtimes; without an Engine, assume nothing but runc is safe."""
        with self._lock:
            if self._view and time.monotonic() - self._view[0] < ENGINE_VIEW_MAX_AGE:
                return self._view[1]
        view = EngineView.from_info(self.engine.info()) if self.engine else EngineView()
        with self._lock:
            self._view = (time.monotonic(), view)
        return view

    def facts(self, engine_view: EngineView | None = None) -> Facts:
        mounts_of = self._bind_mounts if self.engine is not None else None
        return Facts(self.inventory(), engine_view or self.engine_view(), self.host, mounts_of)

    def _bind_mounts(self, container: str) -> list[tuple[str, str]] | None:
        info = self.engine.inspect(container) if self.engine else None
        if info is None:
            return None
        return [
            (str(m.get("Source") or ""), str(m.get("Destination") or ""))
            for m in info.get("Mounts") or ()
            if m.get("Type") == "bind"
        ]

    # ------------------------------------------------------------ leases

    def lease(
        self, ask: Ask, name: str = "", labels: dict[str, str] | None = None
    ) -> tuple[Lease, str] | Shortage:
        """Place and record a pending lease; on shortage, reconcile once and retry.

        A create that replaces a stopped container of the same Compose service (compose
        stops the old one and renames it ``<short id>_<name>`` before creating the new
        one) may take over the old container's GPUs, so recreating a service on a full
        host needs no more free GPUs than it had.
        """
        result = self._try_lease(ask, name)
        if isinstance(result, Shortage) and self.engine is not None:
            if self.reconcile():
                result = self._try_lease(ask, name)
            predecessor = None
            if isinstance(result, Shortage):
                predecessor = self._compose_predecessor(name, labels or {})
            if predecessor is not None:
                result = self._try_lease(ask, name, predecessor)
                if not isinstance(result, Shortage):
                    self._keep_down(predecessor[0])
        return result

    def _keep_down(self, container: str) -> None:
        """A predecessor that lent its GPUs must not come back by itself.

        dockerd restarts ``restart: always`` containers at its own start without asking
        the plugin, so the policy is turned off; the replacement has its own.
        """
        try:
            assert self.engine is not None
            self.engine.update(container, {"RestartPolicy": {"Name": "no"}})
        except EngineError as e:
            log.warning("could not turn off the restart policy of %s: %s", container[:12], e)

    def _try_lease(
        self, ask: Ask, name: str, predecessor: tuple[str, str] | None = None
    ) -> tuple[Lease, str] | Shortage:
        inventory = self.inventory()
        with self.ledger.transaction() as state:
            sick, mig = self.unhealthy(), self.config.policy.mig
            held = state.holders(inventory.uuids)
            old = state.lease_of(predecessor[0]) if predecessor else None
            if predecessor and (old is None or old.phase is not Phase.BOUND):
                return place(ask, inventory, held, self.policy, sick, mig)  # the shortage, as is
            for uuid in old.gpus if old else ():
                held.pop(uuid, None)
            picked = place(ask, inventory, held, self.policy, sick, mig)
            if isinstance(picked, Shortage):
                return picked
            lease, token = state.new_lease(
                tuple(g.uuid for g in picked), ledger.now(), self.config.policy.pending_ttl
            )
            state.leases[lease.id] = lease = replace(lease, name=name)
            if old is not None and predecessor is not None:
                state.hand_over(old.id, lease.id, predecessor[1])
            return lease, token

    def unhealthy(self) -> dict[str, str]:
        """UUID -> its event; nothing when the operator turned health off."""
        return {} if self.config.health.disabled else self.health.read().unhealthy()

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
            why = self.authorize(decision.lease_id, decision.token, decision.gpus)
            if why is not None:
                return Deny(f"gpu-alloc refused the container create: {why}; {HINT}")
            log.info("allowed leased create (lease %s)", decision.lease_id)
            return ALLOW
        if isinstance(decision, StartCheck):
            why = self.start_refusal(decision.ref)
            return ALLOW if why is None else Deny(why)
        return decision

    def start_refusal(self, ref: str) -> str | None:
        """Why a start of container ``ref`` must be refused, if it must.

        Two containers can share GPUs for a moment during a Compose recreate: the old one
        that handed them over may not start again, and the new one may not start while
        the old one still runs.  When the ledger cannot be read, the container itself is
        asked: one without GPUs starts anyway, so a broken state file stops GPU work only.
        """
        try:
            state = self.ledger.read()
        except StateError as e:
            info = self.engine.inspect(ref) if self.engine else None
            if info is None:
                return None  # dockerd answers "no such container"
            facts = self.facts()
            grants = access.of_container(info, facts.engine, facts.inventory, facts.host)
            return None if grants.none else f"gpu-alloc refused to start {ref}: {e}"
        if not state.handing_over():
            return None  # the common case: no recreate in progress, no Engine call
        info = self.engine.inspect(ref) if self.engine else None
        lease = state.lease_of(info["Id"]) if info else None
        if lease is None:
            return None
        if lease.phase is Phase.HANDED_OVER:
            return (
                f"gpu-alloc refused to start {ref}: its GPUs were handed to the container "
                f"replacing it (lease {lease.handed_to}); remove it, or remove its "
                "replacement first"
            )
        old = state.predecessor_of(lease.id)
        info = self.engine.inspect(old.container) if old and old.container and self.engine else None
        if info and (info.get("State") or {}).get("Running"):
            return (
                f"gpu-alloc refused to start {ref}: the container it replaces "
                f"({old.name or old.container}) still runs on its GPUs; stop that one first"
            )
        return None

    def settle_unanswered(self, lease_id: str, label: str) -> None:
        """A create got an answer other than 201: free the lease only if no container has it.

        dockerd may have created the container and then failed the call (the plugin's
        AuthZRes broke, say), so an error status alone proves nothing.
        """
        if self.engine is None:
            self.release(lease_id)
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
            self.release(lease_id)

    def authorize(self, lease_id: str, token: str, gpus: frozenset[str]) -> str | None:
        with self.ledger.transaction() as state:
            return state.authorize(lease_id, token, gpus)

    def bind(self, lease_id: str, container: str) -> bool:
        lease = self.ledger.read().leases.get(lease_id)
        if lease is not None and lease.container == container:
            return True  # the plugin's AuthZRes bound it already: no lock, no write
        with self.ledger.transaction() as state:
            return state.bind(lease_id, container)

    def release(self, lease_id: str) -> Lease | None:
        with self.ledger.transaction() as state:
            return state.release(lease_id)

    def settle(self, outcome: Bind | Release | Forget | None) -> None:
        """Apply what the Engine's answer to a create or a removal means for the ledger."""
        if isinstance(outcome, Bind):
            self.bind(outcome.lease_id, outcome.container)
        elif isinstance(outcome, Release):
            self.release(outcome.lease_id)
        elif isinstance(outcome, Forget):
            gone = [
                le.id
                for le in self.ledger.read().leases.values()
                if (le.container or "").startswith(outcome.ref)
            ]
            if len(gone) == 1:
                with self.ledger.transaction() as state:
                    lease = state.leases.get(gone[0])
                    if lease and (lease.container or "").startswith(outcome.ref):
                        state.release(lease.id)

    # --------------------------------------------------------- reconcile

    def reconcile(self, adopt: bool = False) -> Report:
        """Make the ledger agree with the Engine; see the module docstring.

        Concurrent callers share one run: each waits for a run that began after it
        asked, so a create never reuses a reconcile older than its own shortage.
        """
        if self.engine is None:
            return Report()
        asked = time.monotonic()
        with self._reconciling:
            while True:
                done = self._last_reconcile
                if done and done[0] >= asked and (done[1] or not adopt):
                    return done[2]
                if not self._reconcile_running:
                    self._reconcile_running = True
                    break
                self._reconciling.wait()
        began, report = time.monotonic(), None
        try:
            report = self._reconcile(adopt)
            return report
        finally:
            with self._reconciling:
                self._reconcile_running = False
                if report is not None:
                    self._last_reconcile = (began, adopt, report)
                self._reconciling.notify_all()

    def _reconcile(self, adopt: bool) -> Report:
        assert self.engine is not None
        # The snapshot must come before the listing: only what was already recorded when
        # the Engine was asked can be proven gone by the Engine's answer.
        snapshot = self.ledger.read()
        # gpu-alloc's own containers carry its label; adopted ones are asked by id.  Only an
        # adopting run lists everything, so a create costs the same with 10 or 10,000
        # containers on the host.
        listed = {c["Id"]: c for c in self.engine.containers(label=labels.LEASE)}
        if snapshot.claims:
            listed.update((c["Id"], c) for c in self.engine.containers(ids=list(snapshot.claims)))
        if adopt:
            listed.update((c["Id"], c) for c in self.engine.containers())
        facts = self.facts()
        by_label: dict[str, str] = {}
        for cid, c in listed.items():
            lease = snapshot.leases.get(labels.parse_lease(c.get("Labels"))[0])
            if lease and lease.container is None and self._carries(cid, lease, facts):
                by_label[lease.id] = cid
        found: dict[str, Claim] = {}
        if adopt:
            known = {le.container for le in snapshot.leases.values()} | set(snapshot.claims)
            for cid in listed.keys() - known - self._no_gpu - set(by_label.values()):
                claim = self._claim_of(cid, facts)
                if claim is None:
                    self._no_gpu.add(cid)
                else:
                    found[cid] = claim
            self._no_gpu &= set(listed)
        with self.ledger.transaction() as state:
            return apply(state, snapshot, listed, by_label, found, ledger.now())

    def _carries(self, cid: str, lease: Lease, facts: Facts) -> bool:
        """Does this container really hold the lease's GPUs (not a label copied by commit)?"""
        info = self.engine.inspect(cid) if self.engine else None
        if info is None:
            return False
        grants = access.of_container(info, facts.engine, facts.inventory, facts.host)
        return grants.pinned and grants.gpus(facts.inventory) == frozenset(lease.gpus)

    def _claim_of(self, cid: str, facts: Facts) -> Claim | None:
        info = self.engine.inspect(cid) if self.engine else None
        if info is None:
            return None
        grants = access.of_container(info, facts.engine, facts.inventory, facts.host)
        if grants.none:
            return None
        gpus = tuple(sorted(grants.gpus(facts.inventory))) if grants.pinned else None
        why = "; ".join(g.describe() for g in grants.grants)
        return Claim(cid, str(info.get("Name") or "").lstrip("/"), gpus, why)
