"""The device rows of the effective-access catalogue: raw devices, CDI names, cgroup rules.

A device reaches a GPU by the node it is, not by how it is named: a path is judged
by the major and minor of the node it resolves to on the host's devtmpfs, a cgroup
rule by the numbers dockerd parses from it, a CDI name by the vendor and device it
names.  The mount rows (`access_mounts`) judge a bound device node here too.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable

from allocator.core.access import mounts
from allocator.core.access.access_ctx import Ctx, resolve_ids
from allocator.core.access.facts import Node
from allocator.core.access.grants import Refusal
from allocator.core.api import gonum

NVIDIA_MAJOR = 195  # /dev/nvidia0..N (minor = GPU minor), 255 nvidiactl, 254 modeset
DRM_MAJOR = 226  # /dev/dri/card*, renderD*
NVIDIA_CONTROL_MINORS = frozenset({254, 255})
# The only filesystem whose device nodes no container can add or swap (not /dev/shm).
DEVICE_FS = "devtmpfs"


def devices(ctx: Ctx) -> None:
    for i, dev in enumerate(ctx.view.host_config.get("Devices") or ()):
        fld = f"HostConfig.Devices[{i}]"
        path = str((dev or {}).get("PathOnHost") or "")
        if _is_cdi_name(path):
            cdi_names(ctx, fld, (path,))
            continue
        if not path.startswith("/"):
            ctx.refuse(fld, f"PathOnHost '{path}' is not an absolute path")
            continue
        real = ctx.resolved(fld, "PathOnHost", path)
        if real is None:
            continue
        if ctx.strict and real != posixpath.normpath(path):
            raise Refusal(
                f"{fld}: PathOnHost {path} is a link to {real}; name the device node itself"
            )
        node = ctx.host.node(real)
        if node is None:
            ctx.refuse(fld, f"PathOnHost {path} does not exist on this host")
            continue
        on = mounts.mount_of(list(ctx.host.mounts()), real)
        if on is None or on.fstype != DEVICE_FS:
            # dockerd reads the path again at every start, and at every restart its restart
            # policy makes without asking anyone: only the kernel's /dev stays as checked.
            ctx.refuse(
                fld,
                f"PathOnHost {path} is not on the host's {DEVICE_FS} (/dev), and a device path "
                "elsewhere can change after gpu-alloc checks it; name a device node under /dev",
            )
            continue
        if node.kind == "dir":
            for sub in sorted(ctx.host.walk(real)):
                device_node(ctx, fld, sub, ctx.host.node(sub))
        else:
            device_node(ctx, fld, path, node)


def device_node(ctx: Ctx, fld: str, path: str, node: Node | None) -> None:
    if node is None or node.kind != "chr":
        return
    major, minor = node.major, node.minor
    if major == NVIDIA_MAJOR and minor not in NVIDIA_CONTROL_MINORS:
        gpu = ctx.inventory.by_minor(minor)
        ctx.add(fld, f"device {path} (nvidia {major}:{minor})", None if gpu is None else [gpu.uuid])
    elif major == NVIDIA_MAJOR or major in ctx.dynamic_majors():
        ctx.add(fld, f"NVIDIA control device {path} ({major}:{minor})", None)
    elif major == DRM_MAJOR:
        bus = ctx.host.drm_bus_id(minor)
        gpu = next((g for g in ctx.inventory.gpus if bus and _same_bus(g.pci_bus_id, bus)), None)
        ctx.add(fld, f"DRM device {path} ({major}:{minor})", None if gpu is None else [gpu.uuid])


def _same_bus(nvml_id: str, sysfs_id: str) -> bool:
    a, b = nvml_id.lower(), sysfs_id.lower()
    return bool(a) and (a == b or a.endswith(b) or b.endswith(a[-12:]))


def _is_cdi_name(name: str) -> bool:
    kind, eq, _ = name.partition("=")
    return bool(eq) and "/" in kind and not name.startswith("/")


def cdi_names(ctx: Ctx, fld: str, names: Iterable[str]) -> None:
    for name in names:
        kind, _, dev = name.partition("=")
        if "nvidia" not in kind and "gpu" not in kind:
            ctx.refuse(fld, f"CDI device '{name}' is not one gpu-alloc can vet")
            continue
        ctx.add(fld, f"CDI device {name}", resolve_ids(ctx, fld, [dev]) if dev != "all" else None)


_CGROUP_TYPES = ("a", "c")  # "b" rules are for block devices: no GPU is one


def cgroup_rules(ctx: Ctx) -> None:
    """Each rule by the numbers dockerd parses from it (``0195`` is 195), not its spelling."""
    rules = ctx.view.host_config.get("DeviceCgroupRules") or ()
    if not rules:
        return
    majors = {NVIDIA_MAJOR, DRM_MAJOR, gonum.ANY} | set(ctx.dynamic_majors())
    for i, rule in enumerate(rules):
        fld = f"HostConfig.DeviceCgroupRules[{i}]"
        try:
            kind, major, minor, _ = gonum.cgroup_rule(str(rule))
        except gonum.NumError:
            ctx.refuse(fld, f"rule '{rule}' is not of the form 'c MAJOR:MINOR rwm'")
            continue
        if kind == "a" or (kind in _CGROUP_TYPES and major in majors):
            gpu = None
            if major == NVIDIA_MAJOR and minor not in (gonum.ANY, *NVIDIA_CONTROL_MINORS):
                gpu = ctx.inventory.by_minor(minor)
            ctx.add(
                fld,
                f"device cgroup rule '{rule}' opens GPU devices",
                None if gpu is None else [gpu.uuid],
            )
