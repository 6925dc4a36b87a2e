"""Idle reclaim: which running GPU containers have left their GPUs unused long enough
to be stopped (``policy.reclaim_idle_after``; unset: none).

A container is idle when every GPU of its lease ran no process at 0 % utilisation
since the latest of its grant, its container's last start and the last time any of
its GPUs was seen in use (`allocator/core/machine/usage.py`'s rule, over the whole lease),
measured on the boot's clock (`allocator/core/leases/clock.py`), so setting the wall clock
forward reclaims nothing early.
Only a GPU whose use was read counts as unused (``usage.known``: a utilisation
figure and its process list): a GPU whose use cannot be read now, or reads memory
and power but no utilisation, never gets its container stopped.  The exempt
(``policy.exempt``) are never reclaimed.  A reclaimed container keeps its lease as
any stopped one does.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from allocator.core.leases import clock
from allocator.core.leases.clock import Now
from allocator.core.leases.holders import ago
from allocator.core.leases.leases import Lease
from allocator.core.rules.policy import Rules
from allocator.core.timing.timelimits import GRACE_MAX, live

WARN_AT = 0.8  # of reclaim_idle_after: the owner of a container without a signal is told


def idle_for(
    lease: Lease,
    read: Collection[str],
    active: Collection[str],
    last_active: Mapping[str, Now],
    started: Now | None,
    now: Now,
) -> float | None:
    """Seconds all the lease's GPUs have gone unused at ``now``: since the latest of its
    grant, its container's last start and any of its GPUs' last use; None while any is
    in use or unread."""
    if not lease.gpus or any(u in active or u not in read for u in lease.gpus):
        return None
    since = [
        clock.at(lease.created, lease.granted_boot),
        *(last_active[u] for u in lease.gpus if u in last_active),
    ]
    if started is not None:
        since.append(started)
    return min(clock.elapsed(event, now) for event in since)


def idle(
    leases: Iterable[Lease],
    running: Mapping[str, Now | None],
    read: Collection[str],
    active: Collection[str],
    last_active: Mapping[str, Now],
    now: Now,
    rules: Rules,
) -> list[tuple[Lease, float]]:
    """(lease, seconds its GPUs have gone unused) for each running container idle long
    enough at ``now`` to be stopped, or to be sent its checkpoint signal first (its lead
    before that), or, without a signal, for its owner to be warned (at `WARN_AT` of it):
    allocator/core/timing/checkpoint.py decides which.

    ``running``: container -> when it last started (None: not known yet); ``read``: the
    GPUs whose use was read now, ``active`` those in use; ``last_active``: GPU -> the
    last time it was seen in use."""
    after = rules.reclaim_idle_after
    if after is None:
        return []
    found = []
    for le in live(leases):
        cid = le.container or ""
        if cid not in running or (le.owner or "unknown") in rules.exempt:
            continue
        idled = idle_for(le, read, active, last_active, running[cid], now)
        lead = le.signal_lead if le.signal else (1 - WARN_AT) * after
        if idled is not None and idled >= after - lead:
            found.append((le, idled))
    return found


def reason(after: float) -> str:
    """Why the timekeeper stopped an idle container, for the audit trail and log."""
    return (
        f"its GPUs ran no process at 0 % utilisation for {ago(after)} "
        "(policy.reclaim_idle_after); stopped with the Engine's stop (its grace period, at "
        f"most {GRACE_MAX}s); "
        "it keeps its GPUs until policy.release_stopped_after, or until removed"
    )
