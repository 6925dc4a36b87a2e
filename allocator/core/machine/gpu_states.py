"""One state per GPU, for every view: ``status``, ``gpus``, the metrics and the dashboard.

No view decides on its own what a GPU is: each hands its facts (the inventory's
GPUs, the ledger's holders, health, activity, the Engine's container states) to
`states` and shows what comes back, so ``status`` can never say "never granted"
while the metrics or the dashboard say "free".

A GPU has one `state`, the first of these that applies:

========== ============================================================
departed   a lease or claim names it and the inventory no longer has it
unhealthy  an Xid or ECC event took it out of placement
leased     a lease or an adopted claim holds it
busy       host compute processes run on it
mig        it is split into MIG slices, which are leased instead
free       grantable now
========== ============================================================

Beside the state, and shown with it whatever the state: the `holder` (an
unhealthy GPU keeps its holder, who is reported and never stopped), the
holder's container state (``running``, ``exited``, ... as the Engine lists it;
``creating`` while a lease waits for its container), the health event, and
``idle_since`` (a leased GPU unused for ``idle_after``) and ``use``
(allocator/core/machine/usage.py's ``active``, ``unused`` or ``unknown``): a GPU whose use
was not read is never idle.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from allocator.core.leases.holders import Holder
from allocator.core.machine.health import GpuHealth, Health
from allocator.core.machine.inventory import GPU
from allocator.core.machine.usage import ACTIVE, UNKNOWN, UNUSED, idle_since

DEPARTED, UNHEALTHY, LEASED, BUSY, MIG, FREE = (
    "departed",
    "unhealthy",
    "leased",
    "busy",
    "mig",
    "free",
)
STATES = (FREE, LEASED, BUSY, MIG, UNHEALTHY, DEPARTED)
CREATING = "creating"  # a lease whose container the Engine has not made yet


@dataclass(frozen=True)
class Activity:
    """What the GPUs were doing: which ran work now, and when each last did."""

    now: float
    idle_after: float
    active: frozenset[str] = frozenset()
    last_active: Mapping[str, float] | None = None
    read: frozenset[str] = frozenset()  # whose use was read now (the rest: unknown)

    def use(self, uuid: str) -> str:
        if uuid in self.active:
            return ACTIVE
        return UNUSED if uuid in self.read else UNKNOWN


@dataclass(frozen=True)
class GpuState:
    uuid: str
    gpu: GPU | None  # None once departed
    state: str
    holder: Holder | None
    container_state: str | None  # the holder's container as the Engine lists it
    health: GpuHealth
    idle_since: float | None
    use: str = UNKNOWN

    @property
    def free(self) -> bool:
        """Grantable now: neither held, unhealthy, busy nor split."""
        return self.state == FREE

    @property
    def held(self) -> bool:
        return self.holder is not None


def states(
    gpus: Iterable[GPU],
    holders: Mapping[str, Holder],
    health: Health,
    activity: Activity,
    containers: Mapping[str, str] | None = None,
) -> list[GpuState]:
    """Each GPU (and MIG slice) of ``gpus`` in order, then each departed one by UUID.

    ``holders``: UUID -> holder, the ledger's, for every GPU a lease or claim names
    (present or not).  ``health``: the health that placement uses (empty when the
    operator turned it off); a slice's health is its parent's.  ``containers``:
    container id -> its state, for the holders the Engine listed."""
    listed = containers or {}
    out: list[GpuState] = []
    present: set[str] = set()
    for g in gpus:
        present.add(g.uuid)
        out.append(
            _one(g.uuid, g, holders.get(g.uuid), health.of(g.parent or g.uuid), activity, listed)
        )
    for uuid in sorted(set(holders) - present):
        out.append(_one(uuid, None, holders[uuid], health.of(uuid), activity, listed))
    return out


def _one(
    uuid: str,
    g: GPU | None,
    holder: Holder | None,
    health: GpuHealth,
    activity: Activity,
    containers: Mapping[str, str],
) -> GpuState:
    if g is None:
        state = DEPARTED
    elif not health.healthy:
        state = UNHEALTHY
    elif holder is not None:
        state = LEASED
    elif g.busy:
        state = BUSY
    elif g.mig_mode:
        state = MIG
    else:
        state = FREE
    return GpuState(
        uuid=uuid,
        gpu=g,
        state=state,
        holder=holder,
        container_state=_container_state(holder, containers),
        health=health,
        idle_since=_idle(uuid, holder, activity),
        use=activity.use(uuid),
    )


def _container_state(holder: Holder | None, containers: Mapping[str, str]) -> str | None:
    if holder is None:
        return None
    if not holder.container:
        return CREATING
    return containers.get(holder.container)


def _idle(uuid: str, holder: Holder | None, activity: Activity) -> float | None:
    """When a leased GPU stopped being used, once unused for ``idle_after``; else None."""
    if holder is None or holder.lease is None or holder.since is None:
        return None
    if activity.use(uuid) == UNKNOWN:
        return None  # never idle on what was not read
    last = (activity.last_active or {}).get(uuid)
    return idle_since(
        holder.since, last, uuid in activity.active, activity.now, activity.idle_after
    )
