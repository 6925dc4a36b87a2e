"""Reconcile: make the ledger agree with what the Engine proves.

`reconcile` asks the Engine what exists (outside the lock, so a slow Engine never
holds the lock), then, under the lock, applies `allocator.core.reconcile.apply`:
frees leases whose container is gone, binds pending leases whose container turned
up (found by label), frees pending leases past their deadline with no container,
expires stopped ones past ``release_stopped_after``, and adopts unknown containers'
GPU access as claims.  Every lease that ends is one audit line (`Gatherer.record`).
"""

from __future__ import annotations

import logging
import time

from allocator.core import access, labels, policy, privileged
from allocator.core.leases import Claim, Lease, Phase, State
from allocator.core.reconcile import STOPPED, Report, apply
from allocator.core.verdicts import (
    Facts,
)
from allocator.gather import Gatherer
from allocator.host import ledger, metrics
from allocator.host.engine import go_time

log = logging.getLogger("gpu-alloc")


class Reconciler(Gatherer):
    """Reconcile, on top of the gathered facts."""

    def _ended(self, lease: Lease | None, reason: str) -> None:
        if lease is not None:
            metrics.lease_ended(ledger.now() - lease.created)
            self.record("release", lease, reason=reason)
            for listener in self.listeners:
                listener()

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
            lease = snapshot.leases.get(labels.lease_of(c.get("Labels")))
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
            if listed[cid].get("State") not in STOPPED:
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
        if privileged.admitted(grants, inventory, lease.gpus):  # policy.privileged: lease-all
            return True
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
        name = str(info.get("Name") or "").lstrip("/")
        since = go_time(info.get("Created"))
        return Claim(cid, name, gpus, why, **labels.placed_of(info), **_owner_of(info), since=since)


def _owner_of(info: dict) -> dict[str, object]:
    """Whose a container the shim made for a lease was, by its `policy.OWNER` label."""
    given = (info.get("Config") or {}).get("Labels") or {}
    if not labels.lease_of(given):
        return {}
    uid, _, user = str(given.get(policy.OWNER) or "").rpartition(":")
    if not user:
        return {}
    return {"owner": user, "owner_uid": int(uid) if uid.isascii() and uid.isdigit() else None}
