"""The audit trail of applied decisions, and who hears when a lease ends.

One part of the composed service (allocator/service/wiring.py).  Every other part that
applies a decision (a grant, a refusal, a release, an adoption, a restart policy turned
off) writes its one audit line here, never under the ledger lock.  `ended` is the one
way a lease's end is told: the metrics, fair share's record (allocator/host/held.py),
its audit line, then the ``listeners`` (the shim's waiting line wakes up).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict, Unpack

from allocator.core.leases import clock, events
from allocator.core.leases.leases import Lease
from allocator.core.machine.inventory import InventoryError
from allocator.core.placement import Shortage
from allocator.core.rules.policy import Invalid, Owner, Refusal
from allocator.host import clock as hostclock
from allocator.host import ledger, metrics
from allocator.host.audit import AuditLog
from allocator.host.held import HeldRecord
from allocator.service.gather import Gatherer


class AuditFields(TypedDict, total=False):
    """What `Recorder.record` passes on to `events.record`."""

    gpus: tuple[str, ...] | list[str]
    container: str | None
    name: str
    owner: str | None
    reason: str
    waited_s: float | None
    pool: str | None
    share: str


class Recorder:
    """``record`` an audit line; ``refused`` a create; ``ended`` a lease.

    ``gather`` gives the inventory, to name GPUs by index as well as UUID.
    """

    def __init__(self, audit: AuditLog, gather: Gatherer, held: HeldRecord):
        self.audit = audit
        self.gather = gather
        self.held = held
        # Called (from any thread) after a lease ends here: the shim's queue wakes up.
        self.listeners: list[Callable[[], None]] = []
        # Called with each audit record once written: the notifier (service/notifier.py).
        self.heard: list[Callable[[dict[str, Any]], None]] = []

    def record(self, kind: str, lease: Lease | None = None, **fields: Unpack[AuditFields]) -> None:
        """One audit line for a decision already applied (never under the ledger lock)."""
        if lease is not None:
            fields = {
                "gpus": lease.gpus,
                "container": lease.container,
                "name": lease.name,
                "owner": lease.owner,
                "pool": lease.pool,
                **({"share": f"{lease.share_slots}/{lease.share_of}"} if lease.share_of else {}),
                **fields,
            }
        gpus = fields.get("gpus") or ()
        indices = {}
        if gpus:
            try:
                indices = {g.uuid: g.index for g in self.gather.inventory().gpus}
            except InventoryError:  # the record matters more than the index
                indices = {}
        lease_id = lease.id if lease is not None else None
        record = events.record(kind, ledger.now(), indices=indices, lease=lease_id, **fields)
        self.audit.write(record)
        for hear in self.heard:
            hear(record)

    def refused(
        self,
        result: Shortage | Refusal | Invalid,
        name: str,
        owner: Owner,
        waited_s: float | None = None,
    ) -> None:
        """Metrics and the audit trail for a create that gets no lease; ``waited_s``: how
        long it waited in line first (``gpu-alloc report``'s waits)."""
        metrics.request("short" if isinstance(result, Shortage) else "policy")
        self.record("refusal", name=name, owner=owner.user, reason=result.msg, waited_s=waited_s)

    def health_turned(self, uuid: str, healthy: bool, what: str) -> None:
        """A GPU's health changed (the health file's listener)."""
        self.record("health", gpus=(uuid,), reason=f"GPU {what}")

    def ended(self, lease: Lease | None, reason: str) -> None:
        """A lease ended here (None: nothing ended): its metrics, its audit line, and the
        listeners told."""
        if lease is not None:
            # held for as long as the boot's clock says, whatever the wall clock did meanwhile
            held = clock.elapsed(clock.at(lease.created, lease.granted_boot), hostclock.read())
            metrics.lease_ended(held)
            self.held.ended(lease, lease.created + held)  # fair share's own memory of it
            self.record("release", lease, reason=reason)
            for listener in self.listeners:
                listener()
