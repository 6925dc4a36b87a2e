"""Reconcile as a plan: make the ledger agree with what the Engine proved exists.

The service takes a snapshot of the ledger *before* it lists the Engine's
containers, then calls `apply` under the lock with the fresh state.  Only what
was already recorded when the Engine was asked can be proven gone by its answer:
a lease or claim newer than the listing is kept, whatever the listing says.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from allocator.core.leases.leases import Claim, Lease, Phase, State
from allocator.core.timing import clock
from allocator.core.timing.clock import Now

# The listing's states of a container that runs nothing but still holds what it was given.
STOPPED = frozenset({"exited", "created", "dead"})


@dataclass
class Report:
    """What a reconcile changed, for logs and ``gpu-alloc repair``; and which of the
    listed containers were stopped, so the shortage that ran it can say so of their GPUs
    without asking the Engine again."""

    freed: list[str] = field(default_factory=list)
    bound: list[str] = field(default_factory=list)
    adopted: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    stopped: dict[str, str] = field(default_factory=dict)  # container -> its status

    def __bool__(self) -> bool:
        """Did it change the ledger?  (What it saw stopped changes nothing.)"""
        return bool(self.freed or self.bound or self.adopted or self.dropped)


def apply(
    state: State,
    snapshot: State,
    exists: Mapping[str, Mapping[str, Any]],
    by_label: dict[str, str],
    found: Mapping[str, Claim | Lease],
    now: Now,
) -> Report:
    """Apply what the Engine proved; leases and claims newer than the listing are kept.

    ``exists``: container id -> its entry in the Engine's listing ("State", "Status");
    ``found``: what each GPU holder the ledger does not know is adopted as: a claim, or
    a share's lease (`share_lease`).  A pending lease's wait (its deadline less its
    grant) is measured on the boot's clock from its grant (`clock.elapsed`).
    """
    report = Report(stopped=_stopped(exists))
    for lease in list(state.leases.values()):
        before = snapshot.leases.get(lease.id)
        if lease.container is not None:
            if lease.container not in exists and before and before.container == lease.container:
                state.release(lease.id)
                report.freed.append(lease.id)
        elif lease.id in by_label:
            state.bind(lease.id, by_label[lease.id])
            report.bound.append(lease.id)
        elif clock.elapsed(clock.at(lease.created, lease.granted_boot), now) > (
            lease.deadline - lease.created
        ):
            state.release(lease.id)
            report.freed.append(lease.id)
    for cid in list(state.claims):
        if cid not in exists and cid in snapshot.claims:
            del state.claims[cid]
            report.dropped.append(cid)
    for cid, held in found.items():
        if state.lease_of(cid) is not None:
            continue
        if isinstance(held, Lease):
            if held.id in state.leases:
                continue  # its id was given again meanwhile: adopted at the next run
            state.leases[held.id] = held
        else:
            state.claims[cid] = held
        report.adopted.append(cid)
    state.adopted_at = now.wall
    return report


def stopped_since(
    kept: Mapping[str, tuple[float, str, float]], finished: Mapping[str, float], now: Now
) -> dict[str, tuple[float, str, float]]:
    """When each stopped container stopped, for ``release_stopped_after``: ``finished``
    (container -> the Engine's FinishedAt) placed on the boot's clock when first seen
    and kept (``kept``, `State.stopped`) while its FinishedAt stays the same
    (`clock.placed`); a container that ran again, or went, is dropped."""
    since = clock.placed({cid: Now(*stamp) for cid, stamp in kept.items()}, finished, now)
    return {cid: (n.wall, n.boot_id, n.boot or 0.0) for cid, n in since.items()}


def share_lease(claim: Claim, lease_id: str, slots: int, of: int, user: str) -> Lease:
    """The lease of a share whose lease the ledger lost (``repair --reset``), rebuilt from
    its container (`sharing.held_share`, the claim it would otherwise be): bound to it
    under the id its lease label names, as a share of its one GPU, so the GPU's MPS daemon
    is kept and the share counts as its fraction again.  It has no token: it admits no
    create, and its container exists already."""
    assert claim.gpus is not None and len(claim.gpus) == 1
    return Lease(
        id=lease_id,
        gpus=claim.gpus,
        token_sha256="",
        state=Phase.BOUND.value,
        container=claim.container,
        name=claim.name,
        created=claim.since or 0.0,
        owner_uid=claim.owner_uid,
        owner="" if claim.owner == "unknown" else claim.owner,
        pool=claim.pool,
        cpus=claim.cpus,
        mems=claim.mems,
        memory=claim.memory,
        share_slots=slots,
        share_of=of,
        share_user=user,
    )


def _stopped(listed: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Container id -> the Engine's status ("Exited (0) 2 hours ago") for each listed
    container that is not running."""
    return {
        cid: str(c.get("Status") or c["State"])
        for cid, c in listed.items()
        if c.get("State") in STOPPED
    }
