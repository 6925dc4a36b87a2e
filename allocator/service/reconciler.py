"""Reconcile: make the ledger agree with what the Engine proves.

`reconcile` asks the Engine what exists (outside the lock, so a slow Engine never
holds the lock), then, under the lock, applies `allocator.core.leases.reconcile.apply`:
frees leases whose container is gone, binds pending leases whose container turned
up (found by label), frees pending leases past their deadline with no container,
expires stopped ones past ``release_stopped_after``, and adopts unknown containers'
GPU access as claims, or, for a share the shim made (its lease lost by ``repair
--reset``), as that share's lease again.  Every lease that ends is one audit line
(`Recorder.ended`).

A stopped container whose lease expires still exists, and dockerd starts it again at
its own start if its restart policy says so, without asking the plugin: the policy is
turned off before the lease ends (`allocator.core.leases.restarts`, rule 2), and a lease
whose container's policy cannot be turned off is kept until a later run can.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

from allocator.core.access import access, privileged
from allocator.core.api import labels
from allocator.core.judging import service_limits
from allocator.core.judging.verdicts import ACCESS_READS, Facts
from allocator.core.leases import restarts
from allocator.core.leases.leases import Claim, Lease, Phase, State
from allocator.core.leases.reconcile import STOPPED, Report, apply, share_lease, stopped_since
from allocator.core.rules import policy, sharing
from allocator.core.timing import reservations as rsv
from allocator.core.timing.clock import Now
from allocator.host import clock as hostclock
from allocator.host.creators import Creators
from allocator.host.engine import Engine, EngineError, go_time
from allocator.host.ledger import Ledger
from allocator.service.gather import Gatherer
from allocator.service.recorder import Recorder
from allocator.service.reserving import Reservations

log = logging.getLogger("gpu-alloc")


def _stamps(stopped: dict[str, tuple[float, str, float]]) -> dict[str, Now]:
    """`State.stopped` as the clock readings `policy.expired` measures from."""
    return {cid: Now(*stamp) for cid, stamp in stopped.items()}


class Reconciler:
    """``reconcile`` the ledger with the Engine; ``without_gpus`` are the containers it
    inspected and found holding no GPU (never inspected again while they exist)."""

    def __init__(
        self,
        engine: Engine | None,
        ledger: Ledger,
        gather: Gatherer,
        recorder: Recorder,
        reservations: Reservations | None = None,
    ):
        self.reservations = reservations
        self.engine = engine
        self.ledger = ledger
        self.gather = gather
        self.recorder = recorder
        self.without_gpus: set[str] = set()
        self._reconciling = threading.Condition()
        self._reconcile_running = False
        self._last_reconcile: tuple[float, bool, Report] | None = None

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
        held = partial(self._holders, snapshot, listed, adopt)
        by_label, found = self.gather.decide(held, ACCESS_READS, now=True)
        finished, policies = self._stopped_since(snapshot, listed)
        clocks = hostclock.read()
        due = policy.expired(
            [(le.id, le.container or "") for le in snapshot.leases.values()],
            _stamps(stopped_since(snapshot.stopped, finished, clocks)),
            clocks,
            self.gather.rules,
        )
        gave_up = self._yielding(snapshot, listed)
        held_down = {
            lease_id: snapshot.leases[lease_id]
            for lease_id in [*due, *gave_up]
            if self._restart_off(str(snapshot.leases[lease_id].container))
        }
        with self.ledger.transaction() as state:
            before = dict(state.leases)
            clocks = hostclock.read()
            now = clocks.wall
            report = apply(state, snapshot, listed, by_label, found, clocks)
            state.stopped = stopped_since(state.stopped, finished, clocks)
            stopped = _stamps(state.stopped)
            bound = [(le.id, le.container or "") for le in state.leases.values()]
            expired = [
                i
                for i in policy.expired(bound, stopped, clocks, self.gather.rules)
                if i in held_down
            ]
            expired += [i for i in gave_up if i in held_down and i in state.leases]
            expired = list(dict.fromkeys(expired))
            for lease_id in expired:
                state.expire(lease_id, now)
                report.freed.append(lease_id)
                log.info("lease %s: its container stayed stopped too long; freed", lease_id)
            for cid in set(state.expired) - set(listed):
                if cid in snapshot.expired:
                    del state.expired[cid]  # removed: nothing left to refuse
        for lease_id in expired:
            # Once more, now that no lease vouches for it: an update judged while the
            # lease still held may have landed after the first turn-off.
            self._restart_off(str(held_down[lease_id].container))
            self._restart_audit(held_down[lease_id], policies, "its lease expired")
        for lease_id in report.freed:
            lease = before.get(lease_id)
            why = "container gone" if lease and lease.container else "create never completed"
            if lease_id in expired:
                why = "stopped longer than policy.release_stopped_after"
            if lease_id in expired and lease_id in gave_up:
                why = rsv.gave_up(gave_up[lease_id], now)
            self.recorder.ended(lease, f"reconcile: {why}")
        for cid in report.adopted:
            adopted = found[cid]
            if isinstance(adopted, Lease):
                self.recorder.record("adoption", adopted, reason="a share, by its container")
                continue
            self.recorder.record(
                "adoption",
                gpus=adopted.gpus or (),
                container=cid,
                name=adopted.name,
                reason=adopted.why,
            )
        return report

    def _yielding(self, snapshot: State, listed: dict[str, dict]) -> dict[str, rsv.Reservation]:
        """Lease id -> the reservation whose window began on a GPU of the lease, for
        another holder, while the lease's container is created or stopped: it gives the
        GPU up (`core.timing.reservations.yielding`).  Nothing is read without a reservation."""
        if self.reservations is None:
            return {}
        now = hostclock.schedule(Path(self.gather.config.state_dir))
        kept = [r for r in self.reservations.current(now) if r.active(now)]
        if not kept:
            return {}
        bound = [
            le
            for le in snapshot.leases.values()
            if le.phase is Phase.BOUND
            and le.container in listed
            and any(u in r.gpus for r in kept for u in le.gpus)
        ]
        idle = {
            str(le.container) for le in bound if listed[str(le.container)].get("State") in STOPPED
        }
        owned = [(le, self.reservations.owner_of(le, kept)) for le in bound]
        return rsv.yielding(owned, idle, kept, now)

    def _stopped_since(
        self, snapshot: State, listed: dict[str, dict]
    ) -> tuple[dict[str, float], dict[str, str]]:
        """When each leased container that is not running stopped (or was created), and
        the restart policy (`restarts.standing`) of each that has one.

        Asked only when ``release_stopped_after`` is set, and only of containers the
        listing shows stopped, so a host without the rule pays nothing.
        """
        since: dict[str, float] = {}
        policies: dict[str, str] = {}
        if self.gather.rules.release_stopped_after is None or self.engine is None:
            return since, policies
        leased = {
            le.container
            for le in snapshot.leases.values()
            if le.phase is Phase.BOUND and le.container is not None
        }
        for cid in leased & set(listed):
            if listed[cid].get("State") not in STOPPED:
                continue
            info = self.engine.inspect(cid)
            st = (info or {}).get("State") or {}
            stamp = go_time(st.get("FinishedAt")) or go_time((info or {}).get("Created"))
            if info and not st.get("Running") and stamp:
                since[cid] = stamp
                if restarts.standing(info):
                    policies[cid] = restarts.standing(info)
        return since, policies

    def _restart_off(self, cid: str) -> bool:
        """Turn off ``cid``'s restart policy before gpu-alloc stops vouching for its GPUs,
        also when the inspect showed none (one may have been set since).  False when the
        Engine failed: the caller keeps vouching, and a later run tries again."""
        if self.engine is None:
            return True
        try:
            self.engine.update(cid, restarts.OFF)
        except EngineError as e:
            log.warning("kept the lease of %s: restart policy not turned off: %s", cid[:12], e)
            return False
        return True

    def _restart_audit(self, lease: Lease, policies: dict[str, str], why: str) -> None:
        """The audit line (and log line) for a policy `_restart_off` turned off."""
        was = policies.get(str(lease.container))
        if was:
            log.info("container %s: restart policy %s turned off (%s)", lease.name, was, why)
            self.recorder.record(
                "restart-off", lease, reason=f"restart policy {was} turned off: {why}"
            )

    def _holders(
        self, snapshot: State, listed: dict[str, dict], adopt: bool, facts: Facts
    ) -> tuple[dict[str, str], dict[str, Claim | Lease]]:
        """Which pending lease each listed container carries (by its label, and its
        access), and (``adopt``) what GPU holders the ledger does not know are adopted as."""
        facts.require_inventory()  # which GPUs a claim holds needs the inventory
        by_label: dict[str, str] = {}
        for cid, c in listed.items():
            lease = snapshot.leases.get(labels.lease_of(c.get("Labels")))
            if lease and lease.container is None and self._carries(cid, lease, facts):
                by_label[lease.id] = cid
        found: dict[str, Claim | Lease] = {}
        if adopt:
            known = {le.container for le in snapshot.leases.values()} | set(snapshot.claims)
            known |= set(snapshot.expired)  # their GPUs went back: never adopt them
            for cid in listed.keys() - known - self.without_gpus - set(by_label.values()):
                held = self._adopted(cid, facts)
                if held is None:
                    self.without_gpus.add(cid)
                else:
                    found[cid] = held
            self.without_gpus &= set(listed)
        return by_label, found

    def recorded_owner(self, cid: str, state: State | None = None) -> str:
        """Whose gpu-alloc recorded ``cid`` to be (its lease's in ``state``, else the
        creator the shim recorded): the owner a bind of the Engine's socket in it
        (`core.judging.socket_binds`) and its powers (`core.access.power_grants`) are
        judged for.  Read only while the policy names anyone who may hold either; never
        taken from the container's labels, which an image sets."""
        if not cid or not self.gather.rules.grants_owners:
            return ""
        lease = state.lease_of(cid) if state is not None else None
        if lease is not None and lease.owner:
            return lease.owner
        found = Creators(self.gather.config.state_dir, self.gather.policy_in_force.lock_timeout)
        return (found.of(cid) or (None, ""))[1]

    def _task_owner(self, info: Mapping[str, Any]) -> str:
        """The owner of the swarm service whose task ``info`` is (the shim's label on its
        marked spec, `core.judging.service_marks`), for `recorded_owner`'s question; read only
        while the policy names anyone, and only where services can be read (a manager)."""
        given = (info.get("Config") or {}).get("Labels") or {}
        sid = str(given.get("com.docker.swarm.service.id") or "")
        if not sid or not self.gather.rules.grants_owners or self.engine is None:
            return ""
        try:
            found = self.engine.service(sid)
        except EngineError:  # a worker: no service to read, so no owner (fail closed)
            return ""
        return service_limits.owner_of((found or {}).get("Spec") or {})

    def _carries(self, cid: str, lease: Lease, facts: Facts) -> bool:
        """Does this container really hold the lease's GPUs (not a label copied by commit)?"""
        info = self.engine.inspect(cid) if self.engine else None
        if info is None:
            return False
        inventory = facts.require_inventory()
        owner = lease.owner if self.gather.rules.grants_owners else ""
        grants = access.of_container(
            info, facts.engine, inventory, facts.host, facts.volume_of, owner
        )
        if privileged.admitted(grants, inventory, lease.gpus):  # policy.privileged: lease-all
            return True
        return grants.pinned and grants.gpus(inventory) == frozenset(lease.gpus)

    def _adopted(self, cid: str, facts: Facts) -> Claim | Lease | None:
        """A GPU holder the ledger does not know, as a claim; a share the shim made, as
        its lease again, so its GPU's MPS daemon is not told to quit under it."""
        info = self.engine.inspect(cid) if self.engine else None
        if info is None:
            return None
        claim = self._claim_of(cid, info, facts)
        if claim is None or claim.gpus is None or len(claim.gpus) != 1:
            return claim
        (uuid,) = claim.gpus
        gpu = next((g for g in facts.require_inventory().gpus if g.uuid == uuid), None)
        rule = sharing.rule_for(gpu, self.gather.rules.sharing) if gpu else None
        config = info.get("Config") or {}
        given = config.get("Labels") or {}
        binds = (info.get("HostConfig") or {}).get("Binds") or ()
        share = sharing.held_share(given, binds, uuid, rule, self.gather.config.mps.dir)
        if share is None:
            return claim
        user = sharing.user_of(str(config.get("User") or ""), "")  # the image's, merged
        return share_lease(claim, labels.lease_of(given), *share, user)

    def _claim_of(self, cid: str, info: Mapping[str, Any], facts: Facts) -> Claim | None:
        inventory = facts.require_inventory()
        owner = self.recorded_owner(cid) or self._task_owner(info)
        grants = access.of_container(
            info, facts.engine, inventory, facts.host, facts.volume_of, owner
        )
        if grants.none:
            return None
        gpus = tuple(sorted(grants.gpus(inventory))) if grants.pinned else None
        why = "; ".join(g.describe() for g in grants.grants)
        name = str(info.get("Name") or "").lstrip("/")
        since = go_time(info.get("Created"))
        return Claim(cid, name, gpus, why, **labels.placed_of(info), **_owner_of(info), since=since)


def _owner_of(info: Mapping[str, Any]) -> dict[str, Any]:
    """Whose a container the shim made for a lease was, and the pool it was placed in, by
    its `policy.OWNER` and `policy.POOL` labels (only gpu-alloc sets either there)."""
    given = (info.get("Config") or {}).get("Labels") or {}
    if not labels.lease_of(given):
        return {}
    pool = {"pool": str(given[policy.POOL])} if given.get(policy.POOL) else {}
    found = policy.labelled_owner(given)
    return pool if found is None else {"owner": found[1], "owner_uid": found[0], **pool}
