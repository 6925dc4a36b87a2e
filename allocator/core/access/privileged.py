"""How a privileged container holds every GPU, under `LEASE_ALL`.

A privileged container reaches every device: under `LEASE_ALL` it holds every GPU.

``policy.privileged: lease-all`` (for the owners it names, ``policy.powers.privileged``)
lets a privileged create through the shim lease every GPU unit of the host (whole GPUs,
and under ``policy.mig`` every MIG slice), all or nothing, like ``--gpus all``.  The
plugin admits such a create by that lease alone, and at start the lease must still hold
the whole host: privileged is never pinned to GPUs, so anything less would leave GPUs
reachable that another lease could be granted.

Short of privileged mode, a container holds only the powers the allow-list lets
through (`powers`); the rest are refused on every socket and counted as holding every GPU
where they exist already.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from allocator.core.access.access_ctx import VISIBLE, env_values
from allocator.core.access.grants import Access
from allocator.core.machine.inventory import Inventory

FIELD = "HostConfig.Privileged"  # the grant `access` makes for privileged mode
REFUSE, LEASE_ALL = "refuse", "lease-all"
MODES = (REFUSE, LEASE_ALL)
POWER = "privileged"  # policy.powers.privileged: lease-all, for the owners it names


def asked(grants: Access) -> bool:
    """The create runs privileged, and reaches GPUs by no other field no lease can cover
    (those stay refused, privileged or not)."""
    refused = grants.refused()
    return bool(refused) and all(g.field == FIELD for g in refused)


def covers_host(inventory: Inventory, uuids: Iterable[str]) -> bool:
    """``uuids`` name every unit a lease could hold: each GPU not in MIG mode, and each MIG
    GPU's slices (all of them, or, where ``policy.mig: none`` leases no slice, none)."""
    held = set(uuids)
    if any(g.uuid not in held for g in inventory.gpus if not g.mig_mode):
        return False
    for gpu in (g for g in inventory.gpus if g.mig_mode):
        slices = {m.uuid for m in inventory.slices_of(gpu.uuid)}
        if slices & held and not slices <= held:
            return False
    return True


def leased(spec: Mapping[str, Any], grants: Access, inventory: Inventory) -> frozenset[str] | str:
    """The GPUs a leased privileged create names (its ``NVIDIA_VISIBLE_DEVICES``, which the
    shim sets to its lease), or why they are not the whole host."""
    values = env_values(spec.get("Env") or (), VISIBLE)
    named = frozenset(values[0].split(",")) if len(values) == 1 else frozenset()
    pinned = {u for g in grants.grants if g.gpus is not None for u in g.gpus}
    if not named or not covers_host(inventory, named) or not pinned <= named:
        return (
            "gpu-alloc refused the container create: a privileged container reaches every "
            f"GPU, and its lease must hold every one, named once in {VISIBLE}; "
            "create it through the gpu-alloc socket under policy.privileged: lease-all "
            "or a policy.powers.privileged grant"
        )
    return named


def admitted(grants: Access, inventory: Inventory, lease_gpus: Iterable[str]) -> bool:
    """At start: a privileged container whose lease still holds the whole host, and whose
    other grants lie in that lease."""
    held = frozenset(lease_gpus)
    return (
        any(g.field == FIELD for g in grants.grants)
        and all(g.field == FIELD or (g.gpus is not None and g.gpus <= held) for g in grants.grants)
        and covers_host(inventory, held)
    )
