"""What makes a container root on the host, and how a privileged one holds every GPU.

A privileged container reaches every device: under `LEASE_ALL` it holds every GPU.

``policy.privileged: lease-all`` lets a privileged create through the shim lease every
GPU unit of the host (whole GPUs, and under ``policy.mig`` every MIG slice), all or
nothing, like ``--gpus all``.  The plugin admits such a create by that lease alone, and
at start the lease must still hold the whole host: privileged is never pinned to GPUs,
so anything less would leave GPUs reachable that another lease could be granted.

Short of privileged mode, some capabilities make a container root on the host too, by
what the kernel grants them (`root_powers`; the one list gpu-alloc keeps, service specs
included).  Such a container could open every GPU node and rewrite gpu-alloc's ledger, so
it is refused on every socket, through the shim as on dockerd's own, and counted as
holding every GPU where it exists already.
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

# Capabilities (as dockerd normalises them: upper case, without CAP_) that make a
# container root on the host, and the condition under which they do, from what the kernel
# and Docker's default seccomp profile grant them:
#
# - /proc/<pid>/root (and cwd, fd/N, mem) of another process passes the kernel's
#   ptrace_may_access(PTRACE_MODE_READ_FSCREDS): a caller whose capabilities are not a
#   superset of the target's (any root daemon's: dockerd's, gpu-alloc's) needs
#   CAP_SYS_PTRACE.  DAC_OVERRIDE, DAC_READ_SEARCH or FOWNER do not open that door, but
#   with the host's PID namespace (``--pid host``) SYS_PTRACE reaches every host
#   process's root, so every file on the host.
# - Whatever the PID namespace, the seccomp profile lets a capability's own system calls
#   through once it is granted: open_by_handle_at(2) for DAC_READ_SEARCH (any file of a
#   filesystem the container has one file of, its /etc/hosts on the host's disk: the
#   "shocker" escape), init_module(2) for SYS_MODULE, iopl(2)/ioperm(2) for SYS_RAWIO.
# - ALL holds them all.  SYS_ADMIN is not here: FUSE and other everyday uses need it, and
#   Docker's AppArmor profile keeps its mounts from the host (see docs/exclusivity.md).
HOST_PID_ROOT = frozenset({"ALL", "SYS_PTRACE"})  # with --pid host (or another's PID ns)
ANYWHERE_ROOT = {
    "ALL": "holds every capability below",
    "DAC_READ_SEARCH": "opens any file of the host's filesystems (open_by_handle_at)",
    "SYS_MODULE": "loads kernel modules",
    "SYS_RAWIO": "reaches the hardware's I/O ports (iopl, ioperm)",
}
# Capabilities that reach devices by other ways than the device cgroup guards: refused in
# a swarm service's spec, which has no lease to hold every GPU by.
DEVICE_CAPABILITIES = frozenset({"ALL", "SYS_ADMIN", "SYS_RAWIO", "SYS_MODULE"})


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
            "create it through the gpu-alloc socket under policy.privileged: lease-all"
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


def capabilities(cap_add: Any) -> frozenset[str]:
    """``CapAdd`` as dockerd normalises it: upper case, ``CAP_`` dropped (a lone string is
    one capability: StrSlice)."""
    listed = [cap_add] if isinstance(cap_add, str) else list(cap_add or ())
    return frozenset(str(c).upper().removeprefix("CAP_") for c in listed)


def root_powers(host_config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, why) for each way ``host_config`` makes its container root on the host
    short of privileged mode (which its own row judges).  ``--cap-drop`` is not read: a
    drop that undoes an add is a spelling to fix, not to trust."""
    if host_config.get("Privileged"):
        return []
    # ``Capabilities`` (API 1.40's whole set, which later Engines ignore) read as added:
    # an Engine that honours it grants them, and one that ignores it costs nothing.
    caps = capabilities(host_config.get("CapAdd")) | capabilities(host_config.get("Capabilities"))
    found = []
    anywhere = sorted(caps & ANYWHERE_ROOT.keys())
    if anywhere:
        found.append((
            "HostConfig.CapAdd",
            f"capability {anywhere[0]} {ANYWHERE_ROOT[anywhere[0]]}: root on the host",
        ))  # fmt: skip
    pid = str(host_config.get("PidMode") or "").lower()  # compared without case: fail closed
    traced = sorted(caps & HOST_PID_ROOT)
    if traced and (pid == "host" or pid.startswith("container:")):
        shared = (
            "the host's PID namespace"
            if pid == "host"
            else f"the PID namespace of {pid} (which may be the host's; gpu-alloc does not "
            "follow it)"
        )
        found.append((
            "HostConfig.PidMode",
            f"capability {traced[0]} in {shared} reaches every host process's files "
            "through /proc/<pid>/root: root on the host",
        ))  # fmt: skip
    return found
