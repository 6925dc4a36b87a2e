"""Whether a container may start: judged on its access as it resolves at that moment.

Rules
-----
1. dockerd resolves ``Devices`` paths, walks device directories and follows bind
   sources when a container *starts*, not when it is created: a directory empty at
   create can hold a GPU node by then, a bind source can have become a link to
   ``/dev``.  So every route that starts a container (``start``, ``restart``) is
   judged on a fresh ``docker inspect`` with host facts read now, through the same
   `access.of_container` that adoption and reconcile use.
2. A start is allowed when the container then reaches no GPU at all, or when
   everything it reaches is pinned to GPUs of its own live lease (bound to this
   container id), or it runs privileged with a lease of the whole host and the policy
   still lets its owner do that.  Everything else is refused: unpinned access, GPUs
   outside the lease, GPU access with no lease, a lease that lent its GPUs away.
3. A Compose hand-over adds the rule of `compose.replacement_refusal`.

The service gathers (ledger, inspects, host facts); this module only decides.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from allocator.core.access import access, privileged
from allocator.core.access.access_ctx import ContainerOf, VolumeOf
from allocator.core.access.facts import EngineView, HostFacts
from allocator.core.judging import compose
from allocator.core.leases.leases import Phase, State
from allocator.core.machine.inventory import Inventory
from allocator.core.rules import power_grants

Inspect = Mapping[str, Any]


def refusal(
    ref: str,
    info: Inspect | None,
    state: State | str,
    engine: EngineView,
    inventory: Inventory,
    host: HostFacts,
    predecessor: Inspect | None = None,
    volume_of: VolumeOf | None = None,
    owner: str = "",
    privileged_mode: str = privileged.REFUSE,
    container_of: ContainerOf | None = None,
) -> str | None:
    """Why starting ``ref`` must be refused, or None.

    ``info``: the container's inspect now (None: dockerd will answer "no such
    container").  ``state``: the ledger, or why it could not be read.
    ``predecessor``: the inspect now of the container whose GPUs this one's lease
    took over (None: it is gone), when the ledger records one.  ``volume_of``: a
    named volume's driver and options, looked up now.  ``owner``: whose gpu-alloc
    recorded the container to be (`access.of_container`).  ``privileged_mode``:
    ``policy.privileged`` now, which with the owner's ``policy.powers.privileged`` grant
    says whether a privileged container may still start.  ``container_of``: the
    containers a reference could name now, for the namespaces it joins (`joined`).
    """
    if info is None:
        return None
    grants = access.of_container(info, engine, inventory, host, volume_of, owner, container_of)
    if grants.none:
        return None  # no GPU at all: starts whatever the ledger says
    what = f"gpu-alloc refused to start {ref}"
    if isinstance(state, str):
        return f"{what}: it reaches GPUs and the lease ledger cannot be read ({state})"
    cid = str(info.get("Id") or "")
    lease = state.lease_of(cid)
    reached = "; ".join(g.describe() for g in grants.grants)
    if lease is None or lease.phase not in (Phase.BOUND, Phase.HANDED_OVER):
        return (
            f"{what}: at start it reaches GPUs without a gpu-alloc lease ({reached}). "
            "Device paths, device directories and bind sources are resolved when a "
            "container starts; remove it and create it again through gpu-alloc "
            "(docker --context gpu-alloc, --gpus)"
        )
    if lease.phase is Phase.HANDED_OVER:
        return (
            f"{what}: its GPUs were handed to the container replacing it (lease "
            f"{lease.handed_to}); a container that lent its GPUs never starts again. "
            "Remove it, or remove its replacement first to get the GPUs back"
        )
    outside = sorted(grants.gpus(inventory) - set(lease.gpus))
    # policy.privileged: lease-all: a privileged container whose lease holds every GPU.
    whole = privileged.admitted(grants, inventory, lease.gpus)
    if whole and not (
        privileged_mode == privileged.LEASE_ALL
        or power_grants.may_use(host, owner, privileged.POWER)
    ):
        return (
            f"{what}: it runs privileged, and the policy no longer lets {owner or 'its owner'} "
            "run privileged containers (policy.privileged is not lease-all, and "
            "policy.powers.privileged does not name them); remove it, or ask your operator"
        )
    if (not grants.pinned or outside) and not whole:
        extra = ", ".join(outside) if grants.pinned else "every GPU"
        return (
            f"{what}: at start it reaches {extra} beyond its lease {lease.id} "
            f"({','.join(lease.gpus)}): {reached}. Remove the device, bind or rule that "
            "reaches them, or create the container again through gpu-alloc"
        )
    old = state.predecessor_of(lease.id)
    if old is not None:
        return compose.replacement_refusal(what, info, old, predecessor)
    return None
