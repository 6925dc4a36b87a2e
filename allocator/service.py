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
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, cast

from allocator.core import access, compose, cpus, events, labels, policy, queue, starts
from allocator.core.access import EngineView
from allocator.core.ask import Ask
from allocator.core.inventory import Inventory, InventoryError
from allocator.core.leases import Claim, Holder, Lease, Phase, State, StateError
from allocator.core.placement import POLICIES, Shortage, place, usable
from allocator.core.policy import NOBODY, Invalid, Owner, Refusal, Rules, Wanted
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
    StartCheck,
    Unanswered,
    UpdateCheck,
)
from allocator.host import config as configmod
from allocator.host import cpus as host_cpus
from allocator.host import ledger, metrics
from allocator.host.audit import AuditLog
from allocator.host.config import Config, ConfigError
from allocator.host.engine import Engine, EngineError, go_time
from allocator.host.filesystem import Host, engine_paths
from allocator.host.health import HealthFile
from allocator.host.inventory import load as load_inventory
from allocator.host.ledger import Ledger

INVENTORY_MAX_AGE = 10.0
log = logging.getLogger("gpu-alloc")
ENGINE_VIEW_MAX_AGE = 30.0
_KEPT = Holder(None, "", "kept for a create ahead in the queue", owner="the queue")


@dataclass(frozen=True)
class LeaseRequest:
    """What a create asks of `Allocator.lease`, kept whole so a waiter can ask again."""

    ask: Ask
    name: str
    owner: Owner
    want: Wanted
    resources: cpus.Resources = cpus.NOTHING


class Allocator:
    def __init__(self, config: Config, engine: Engine | None = None, host: Host | None = None):
        self.config = config
        self.engine = engine
        self.ledger = Ledger(config.state_dir, config.policy.lock_timeout)
        self.audit = AuditLog(config.state_dir)
        self.health = HealthFile(self.ledger)
        self.policy = POLICIES[config.policy.placement]
        # gpu-alloc's state and its plugin's socket, then (once asked) the Engine's own
        # paths.  The shim's socket is the users' way in and vets every call: not protected.
        self.host = (host or Host()).with_protected(config.state_dir, config.plugin.socket)
        self._inventory: tuple[object, Inventory | InventoryError] | None = None
        self._view: tuple[float, EngineView, Host] | None = None
        self._no_gpu: set[str] = set()  # containers inspected and found without GPUs
        self._lock = threading.Lock()
        self._reconciling = threading.Condition()
        self._reconcile_running = False
        self._last_reconcile: tuple[float, bool, Report] | None = None
        self._rules = config.policy.rules
        self._policy_lock = threading.RLock()  # re-entrant: SIGHUP runs on the main thread
        self._rules_stamp = self._config_stamp()
        self._topology: cpus.Topology | None = None
        # Called (from any thread) after a lease ends here: the shim's queue wakes up.
        self.listeners: list[Callable[[], None]] = []

    # ------------------------------------------------------------- facts

    def inventory(self) -> Inventory:
        """NVML is asked again every few seconds; a simulated file whenever it changes.

        A failure is remembered as long as a success would be, so a host whose NVML
        fails does not ask it again for every call that touches no GPU.
        """
        stamp = self._inventory_stamp()
        with self._lock:
            if self._inventory is None or self._inventory[0] != stamp:
                try:
                    loaded: Inventory | InventoryError = load_inventory(self.config.gpus)
                except InventoryError as e:
                    loaded = e
                self._inventory = (stamp, loaded)
            found = self._inventory[1]
        if isinstance(found, InventoryError):
            raise found
        return found

    def _inventory_stamp(self) -> object:
        if self.config.gpus == "nvml":
            return int(time.monotonic() // INVENTORY_MAX_AGE)
        try:
            st = os.stat(self.config.gpus)
        except OSError:
            return None  # load_inventory reports it
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def cpu_topology(self) -> cpus.Topology:
        """Read from sysfs once, on the first create that asks for cores or memory."""
        if self._topology is None:
            self._topology = host_cpus.read(self.config.sysfs)
        return self._topology

    def engine_view(self) -> EngineView:
        """The Engine's runtimes and version; without an Engine, judge it as the oldest."""
        return self._engine_facts()[0]

    def _engine_facts(self) -> tuple[EngineView, Host]:
        """What the Engine says it is, and the host with the Engine's own paths protected."""
        with self._lock:
            if self._view and time.monotonic() - self._view[0] < ENGINE_VIEW_MAX_AGE:
                return self._view[1], self._view[2]
        view, host = EngineView(), self.host
        if self.engine is not None:
            info = self.engine.info()
            view = EngineView.from_info(info, self.engine.version())
            sock = self.config.engine
            host = host.with_protected(*engine_paths(info, sock.daemon_json, sock.socket))
        with self._lock:
            self._view = (time.monotonic(), view, host)
        return view, host

    def facts(self, engine_view: EngineView | None = None) -> Facts:
        """The facts for a decision; an unreadable inventory is one of them, not an error."""
        with_engine = self.engine is not None
        try:
            inventory, missing = self.inventory(), ""
        except InventoryError as e:
            inventory, missing = None, str(e)
        view, host = self._engine_facts()
        return Facts(
            inventory,
            engine_view or view,
            host,
            mounts_of=self._bind_mounts if with_engine else None,
            inventory_error=missing,
            volume_of=self._volume if with_engine else None,
            shim_socket=self.config.shim.socket,
        )

    def lazy_facts(self) -> Facts:
        """`facts`, read on first use: most calls are judged without the inventory or /info."""
        return cast(Facts, _LazyFacts(self))

    def _volume(self, name: str) -> tuple[str, dict[str, str]] | None:
        """(driver, options) of the named volume; None when the Engine knows no such one."""
        info = self.engine.volume(name) if self.engine else None
        if info is None:
            return None
        return str(info.get("Driver") or "local"), dict(info.get("Options") or {})

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

    @property
    def rules(self) -> Rules:
        """The policy's limits, pools and defaults as the config file says now.

        The file is re-read when it changes (one stat per create, never on the fast
        path) or on `reload_policy` (SIGHUP); a bad new file keeps the policy in force.
        """
        stamp = self._config_stamp()
        if stamp != self._rules_stamp:
            self.reload_policy(stamp)
        return self._rules

    def reload_policy(self, stamp: object = None) -> None:
        stamp = stamp or self._config_stamp()
        with self._policy_lock:
            self._rules_stamp = stamp
            try:
                new = configmod.load(self.config.source).policy.rules
            except ConfigError as e:
                log.error("policy not reloaded, the one in force stays: %s", e)
                return
            if new != self._rules:
                log.info("policy reloaded from %s", self.config.source)
                self._rules = new

    def _config_stamp(self) -> object:
        if self.config.source.startswith("<"):
            return None  # built in code (tests) or the defaults: nothing to re-read
        try:
            st = os.stat(self.config.source)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def lease(
        self,
        ask: Ask,
        name: str = "",
        labels: dict[str, str] | None = None,
        owner: Owner = NOBODY,
        want: Wanted = Wanted(),  # noqa: B008  # frozen
        resources: cpus.Resources = cpus.NOTHING,
    ) -> tuple[Lease, str] | Shortage | Refusal | Invalid:
        """Place and record a pending lease; on shortage, reconcile once and retry.

        The policy decides first: the pool and request labels narrow the GPUs, and the
        owner's limit counts every GPU their leases hold, under the lock.

        A create that replaces a stopped container of the same Compose service (compose
        stops the old one and renames it ``<short id>_<name>`` before creating the new
        one) may take over the old container's GPUs, so recreating a service on a full
        host needs no more free GPUs than it had.
        """
        rules = self.rules
        scope = policy.eligible(self.inventory(), want, owner, rules, ask.required)
        if not isinstance(scope, tuple):
            return scope
        topology = self.cpu_topology() if resources.any else None
        req = LeaseRequest(ask, name, owner, want, resources)
        result = self._try_lease(req, scope, topology)
        if isinstance(result, Shortage) and self.engine is not None and self.reconcile():
            result = self._try_lease(req, scope, topology)
        # A Compose recreate may take over its predecessor's GPUs: when the host is full,
        # and when the owner is at their limit (the old container's GPUs count there).
        if isinstance(result, Shortage | Refusal) and self.engine is not None:
            predecessor = self._compose_predecessor(name, labels or {})
            if predecessor is not None:
                retry = self._try_lease(req, scope, topology, predecessor)
                if isinstance(retry, tuple):
                    self._keep_down(predecessor[0])
                    result = retry
                elif isinstance(result, Shortage) and isinstance(retry, Shortage):
                    result = retry
        self._count(result, name)
        return result

    def _count(self, result: object, name: str) -> None:
        """Metrics and the audit trail for a lease decision."""
        if isinstance(result, tuple):
            metrics.request("granted")
            return
        outcome = "short" if isinstance(result, Shortage) else "policy"
        metrics.request(outcome)
        self.record("refusal", name=name, reason=str(getattr(result, "msg", result)))

    def explain(
        self, ask: Ask, owner: Owner, want: Wanted
    ) -> tuple[list[str], str | None] | Shortage | Refusal | Invalid:
        """What `lease` would answer now, taking nothing: (GPUs, pool) or the refusal.

        The ledger is read without the lock, so the answer can be stale by one create.
        """
        scope = policy.eligible(self.inventory(), want, owner, self.rules, ask.required)
        if not isinstance(scope, tuple):
            return scope
        inventory, pool = scope
        state = self.ledger.read()
        asking = len(inventory.gpus) if ask.every else len(ask.required) + ask.count
        refused = policy.over_limit(owner, state.held_by(owner.user), asking, self.rules)
        if refused is not None:
            return refused
        held = state.holders(self.inventory().uuids)
        picked = place(
            ask,
            inventory,
            held,
            self.policy,
            ledger.now(),
            want.where(pool),
            self.unhealthy(),
            self.config.policy.mig,
        )
        if isinstance(picked, Shortage):
            return picked
        return [g.uuid for g in picked], pool

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
        self,
        req: LeaseRequest,
        scope: tuple[Inventory, str | None],
        topology: cpus.Topology | None,
        predecessor: tuple[str, str] | None = None,
    ) -> tuple[Lease, str] | Shortage | Refusal:
        with self.ledger.transaction() as state:
            taken = self._take(state, req, scope, topology, predecessor=predecessor)
        if not isinstance(taken, tuple):
            return taken
        lease, token, old = taken
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
        blocked: frozenset[str] = frozenset(),
        predecessor: tuple[str, str] | None = None,
    ) -> tuple[Lease, str, Lease | None] | Shortage | Refusal:
        """Place and record a pending lease in ``state`` (the caller holds the lock).

        ``blocked`` GPUs are kept for a waiter ahead in the queue (`core.queue`): they
        count as held.  Returns (lease, token, the predecessor's lease if it lent its GPUs).
        """
        ask, owner, want = req.ask, req.owner, req.want
        inventory, pool = scope
        where = want.where(pool)
        now = ledger.now()
        sick, mig = self.unhealthy(), self.config.policy.mig
        held = state.holders(self.inventory().uuids)
        for uuid in blocked:
            held.setdefault(uuid, _KEPT)
        old = state.lease_of(predecessor[0]) if predecessor else None
        # Only the owner's own predecessor lends its GPUs (leases from before owners
        # were recorded have none, and may).
        if predecessor and (
            old is None or old.phase is not Phase.BOUND or old.owner not in ("", owner.user)
        ):
            return place(ask, inventory, held, self.policy, now, where, sick, mig)  # type: ignore[return-value]
        asking = len(inventory.gpus) if ask.every else len(ask.required) + ask.count
        holding = state.held_by(owner.user, besides=old.id if old else None)
        refused = policy.over_limit(owner, holding, asking, self.rules)
        if refused is not None:
            return refused
        for uuid in old.gpus if old else ():
            held.pop(uuid, None)
        picked = place(ask, inventory, held, self.policy, now, where, sick, mig)
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
        )
        state.leases[lease.id] = lease
        if old is not None and predecessor is not None:
            state.hand_over(old.id, lease.id, predecessor[1])
        return lease, token, old

    def serve_waiters(
        self, waiters: list[queue.Waiter]
    ) -> list[tuple[queue.Waiter, tuple[Lease, str]]]:
        """Grant what the queue allows now, in its order, under one ledger transaction.

        Each ``waiter.ask`` is a `LeaseRequest`.  The placement and limits are
        `_take`'s, so a waiter is granted exactly as a create arriving now would be,
        minus the GPUs kept for waiters ahead of it (`core.queue.serve`).
        """
        if not waiters:
            return []
        rules, inventory = self.rules, self.inventory()
        sick, mig = self.unhealthy(), self.config.policy.mig
        with self.ledger.transaction() as state:
            held = {w.owner: state.held_by(w.owner) for w in waiters}

            def attempt(
                w: queue.Waiter, blocked: frozenset[str]
            ) -> queue.Placed | queue.Short | queue.OverLimit:
                req: LeaseRequest = w.ask
                scope = policy.eligible(inventory, req.want, req.owner, rules, req.ask.required)
                if not isinstance(scope, tuple):
                    return queue.OverLimit(scope.msg)
                topology = self.cpu_topology() if req.resources.any else None
                taken = self._take(state, req, scope, topology, blocked)
                if isinstance(taken, tuple):
                    return queue.Placed(taken[0].gpus, taken[:2])
                if isinstance(taken, Refusal):
                    return queue.OverLimit(taken.msg)
                holders = state.holders(inventory.uuids)
                return queue.Short(usable(req.ask, scope[0], holders, sick, mig))

            granted = queue.serve(waiters, held, attempt)
        for _, placed in granted:
            metrics.request("granted")
            self.record("grant", placed.result[0], reason="served from the queue")
        return [(w, placed.result) for w, placed in granted]

    # ------------------------------------------------------------- audit

    def record(self, kind: str, lease: Lease | None = None, **fields: object) -> None:
        """One audit line for a decision already applied (never under the ledger lock)."""
        if lease is not None:
            fields = {
                "gpus": lease.gpus,
                "lease": lease.id,
                "container": lease.container,
                "name": lease.name,
                "owner": lease.owner,
                **fields,
            }
        gpus = fields.get("gpus") or ()
        indices = {}
        if gpus:
            try:
                indices = {g.uuid: g.index for g in self.inventory().gpus}
            except InventoryError:  # the record matters more than the index
                indices = {}
        self.audit.write(events.record(kind, ledger.now(), indices=indices, **fields))  # type: ignore[arg-type]

    def _ended(self, lease: Lease | None, reason: str) -> None:
        if lease is not None:
            metrics.lease_ended(ledger.now() - lease.created)
            self.record("release", lease, reason=reason)
            for listener in self.listeners:
                listener()

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
                return Deny(
                    f"gpu-alloc refused the container create: {why}; {HINT}", "Config.Labels"
                )
            log.info("allowed leased create (lease %s)", decision.lease_id)
            return ALLOW
        if isinstance(decision, StartCheck):
            why = self.start_refusal(decision.ref)
            return ALLOW if why is None else Deny(why)
        if isinstance(decision, UpdateCheck):
            why = self.update_refusal(decision.ref, decision.fields)
            return ALLOW if why is None else Deny(why)
        return decision

    def update_refusal(self, ref: str, fields: tuple[str, ...]) -> str | None:
        """``docker update`` may not move a lease's cores or memory: others lease the rest."""
        try:
            state = self.ledger.read()
        except StateError as e:  # cores and memory are not GPUs: keep updates working
            log.warning("update of %s allowed unchecked: %s", ref, e)
            return None
        if not any(le.cpus or le.memory for le in state.leases.values()):
            return None  # the common case: no CPU or memory lease, no Engine call
        if self.engine is None:  # no Engine to resolve the name: the ledger's own words
            lease = next(
                (le for le in state.leases.values() if ref in (le.container, le.name)), None
            )
        else:
            info = self.engine.inspect(ref)
            lease = state.lease_of(info["Id"]) if info else None
        owned = cpus.owned_fields(lease.cpus, lease.memory) if lease else ()
        clash = [f for f in fields if f in owned]
        if not clash:
            return None
        return (
            f"gpu-alloc refused the container update: {', '.join(clash)} of {ref} were leased "
            f"with its GPUs (lease {lease.id if lease else ''}), and other containers lease "
            "the cores and memory around them; recreate the container with other "
            "io.gpu-alloc.request.* labels instead"
        )

    def start_refusal(self, ref: str) -> str | None:
        """Why a start (or restart) of container ``ref`` must be refused, if it must.

        dockerd grants at start: the container is inspected now (the Engine resolves
        ``ref`` as it will for the start) and its access judged with host facts read
        now, by `starts.refusal`.  The plugin's own inspect is a GET, which its fast
        path clears without a worker's lock.  When the ledger cannot be read, a
        container without GPUs still starts, so a broken state file stops GPU work only.
        """
        try:
            state: State | str = self.ledger.read()
        except StateError as e:
            state = str(e)
        info = self.engine.inspect(ref) if self.engine else None
        if info and not isinstance(state, str) and info["Id"] in state.expired:
            return policy.expired_text(ref, self.rules)
        old_info = None
        if info is not None and not isinstance(state, str) and self.engine is not None:
            lease = state.lease_of(str(info.get("Id") or ""))
            old = state.predecessor_of(lease.id) if lease else None
            if old is not None and old.container:
                old_info = self.engine.inspect(old.container)  # by full id: None if gone
        facts = self.facts()
        return starts.refusal(
            ref, info, state, facts.engine, facts.known_gpus, facts.host, old_info, facts.volume_of
        )

    def settle_unanswered(self, lease_id: str, label: str) -> None:
        """A create got an answer other than 201: free the lease only if no container has it.

        dockerd may have created the container and then failed the call (the plugin's
        AuthZRes broke, say), so an error status alone proves nothing.
        """
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

    def authorize(self, lease_id: str, token: str, gpus: frozenset[str]) -> str | None:
        with self.ledger.transaction() as state:
            return state.authorize(lease_id, token, gpus)

    def bind(self, lease_id: str, container: str) -> bool:
        lease = self.ledger.read().leases.get(lease_id)
        if lease is not None and lease.container == container:
            return True  # the plugin's AuthZRes bound it already: no lock, no write
        with self.ledger.transaction() as state:
            return state.bind(lease_id, container)

    def release(self, lease_id: str, reason: str = "the create failed") -> Lease | None:
        with self.ledger.transaction() as state:
            lease = state.release(lease_id)
        self._ended(lease, reason)
        return lease

    def settle(self, outcome: Bind | Unanswered | Forget | None) -> None:
        """Apply what the Engine's answer to a create or a removal means for the ledger
        (`verdicts.create_outcome` is the rule; the shim and the plugin both come here)."""
        if isinstance(outcome, Bind):
            self.bind(outcome.lease_id, outcome.container)
        elif isinstance(outcome, Unanswered):
            self.settle_unanswered(outcome.lease_id, outcome.label)
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
        facts.require_inventory()  # which GPUs a claim holds needs the inventory
        by_label: dict[str, str] = {}
        for cid, c in listed.items():
            lease = snapshot.leases.get(labels.parse_lease(c.get("Labels"))[0])
            if lease and lease.container is None and self._carries(cid, lease, facts):
                by_label[lease.id] = cid
        found: dict[str, Claim] = {}
        if adopt:
            known = {le.container for le in snapshot.leases.values()} | set(snapshot.claims)
            known |= set(snapshot.expired)  # their GPUs went back: never adopt them
            for cid in listed.keys() - known - self._no_gpu - set(by_label.values()):
                claim = self._claim_of(cid, facts)
                if claim is None:
                    self._no_gpu.add(cid)
                else:
                    found[cid] = claim
            self._no_gpu &= set(listed)
        stopped = self._stopped_since(snapshot, listed)
        with self.ledger.transaction() as state:
            before = dict(state.leases)
            now = ledger.now()
            report = apply(state, snapshot, listed, by_label, found, now)
            bound = [(le.id, le.container or "") for le in state.leases.values()]
            expired = policy.expired(bound, stopped, now, self.rules)
            for lease_id in expired:
                state.expire(lease_id, now)
                report.freed.append(lease_id)
                log.info("lease %s: its container stayed stopped too long; freed", lease_id)
            for cid in set(state.expired) - set(listed):
                if cid in snapshot.expired:
                    del state.expired[cid]  # removed: nothing left to refuse
        for lease_id in report.freed:
            lease = before.get(lease_id)
            why = "container gone" if lease and lease.container else "create never completed"
            if lease_id in expired:
                why = "stopped longer than policy.release_stopped_after"
            self._ended(lease, f"reconcile: {why}")
        for cid in report.adopted:
            claim = found[cid]
            self.record(
                "adoption", gpus=claim.gpus or (), container=cid, name=claim.name, reason=claim.why
            )
        return report

    def _stopped_since(self, snapshot: State, listed: dict[str, dict]) -> dict[str, float]:
        """When each leased container that is not running stopped (or was created).

        Asked only when ``release_stopped_after`` is set, and only of containers the
        listing shows stopped, so a host without the rule pays nothing.
        """
        if self.rules.release_stopped_after is None or self.engine is None:
            return {}
        leased = {le.container for le in snapshot.leases.values() if le.phase is Phase.BOUND}
        since: dict[str, float] = {}
        for cid in leased & set(listed):
            if listed[cid].get("State") not in ("exited", "created", "dead"):
                continue
            info = self.engine.inspect(cid)
            st = (info or {}).get("State") or {}
            stamp = go_time(st.get("FinishedAt")) or go_time((info or {}).get("Created"))
            if info and not st.get("Running") and stamp:
                since[cid] = stamp
        return since

    def _carries(self, cid: str, lease: Lease, facts: Facts) -> bool:
        """Does this container really hold the lease's GPUs (not a label copied by commit)?"""
        info = self.engine.inspect(cid) if self.engine else None
        if info is None:
            return False
        inventory = facts.require_inventory()
        grants = access.of_container(info, facts.engine, inventory, facts.host, facts.volume_of)
        return grants.pinned and grants.gpus(inventory) == frozenset(lease.gpus)

    def _claim_of(self, cid: str, facts: Facts) -> Claim | None:
        info = self.engine.inspect(cid) if self.engine else None
        if info is None:
            return None
        inventory = facts.require_inventory()
        grants = access.of_container(info, facts.engine, inventory, facts.host, facts.volume_of)
        if grants.none:
            return None
        gpus = tuple(sorted(grants.gpus(inventory))) if grants.pinned else None
        why = "; ".join(g.describe() for g in grants.grants)
        return Claim(cid, str(info.get("Name") or "").lstrip("/"), gpus, why)


class _LazyFacts:
    """Stands in for `Facts`; computes them on the first attribute read."""

    def __init__(self, alloc: Allocator):
        self._alloc = alloc
        self._facts: Facts | None = None

    def __getattr__(self, name: str) -> Any:
        if self._facts is None:
            self._facts = self._alloc.facts()
        return getattr(self._facts, name)
