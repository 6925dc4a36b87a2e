"""The mount rows of the effective-access catalogue: binds, mounts, volumes, volumes-from.

A mount reaches a GPU by what its source is on the host once resolved (a GPU node,
a directory of them, the Engine's control files: `mounts.exposure`), wherever the
create spells it: a bind, a Mounts entry, a local volume's options, a named volume's
stored options, another container's mounts.  A target in the toolkit's volume-mount
device list selects GPUs whatever its source.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping

from allocator.core.access import mounts, socket_binds
from allocator.core.access.access_ctx import Ctx, names_none
from allocator.core.access.access_devices import device_node
from allocator.core.access.grants import Demand, Refusal
from allocator.core.access.mounts import exposure, within
from allocator.core.rules import sharing

# The toolkit's volume-mount device list (accept-nvidia-visible-devices-as-volume-mounts).
SENTINEL_MOUNT_DIR = "/var/run/nvidia-container-devices"


def binds(ctx: Ctx) -> None:
    hc = ctx.view.host_config
    for i, bind in enumerate(hc.get("Binds") or ()):
        fld = f"HostConfig.Binds[{i}]"
        src, _, rest = str(bind).partition(":")
        dst, _, mode = rest.partition(":")
        read_only = "ro" in mode.split(",")
        if src.startswith("/"):
            _mount(ctx, fld, cleaned(src), dst, read_only)
            continue
        _mount(ctx, fld, "", dst)
        if src:
            _named_volume(ctx, fld, src, read_only)
    for i, m in enumerate(hc.get("Mounts") or ()):
        m = m or {}
        fld = f"HostConfig.Mounts[{i}]"
        kind, dst = str(m.get("Type") or ""), str(m.get("Target") or "")
        read_only = m.get("ReadOnly") is True
        if kind != "volume":
            src = str(m.get("Source") or "") if kind == "bind" else ""
            _mount(ctx, fld, cleaned(src) if src else "", dst, read_only)
            continue
        driver = (m.get("VolumeOptions") or {}).get("DriverConfig") or {}
        if str(driver.get("Name") or "") in mounts.LOCAL_DRIVERS:
            opts = driver.get("Options") or {}
            _volume(ctx, f"{fld}.VolumeOptions.DriverConfig.Options", opts, read_only)
        if m.get("Source"):  # an existing volume keeps its own options; the given are unused
            _named_volume(ctx, fld, str(m["Source"]), read_only)
        _mount(ctx, fld, "", dst)
    for vol in ctx.view.volumes:
        _mount(ctx, "Config.Volumes", "", vol)
    for src, dst, read_only in ctx.view.mount_points:
        _mount(ctx, "Mounts", src, dst, read_only)
    if ctx.strict:
        _volumes_from(ctx)


def cleaned(source: str) -> str:
    """A bind's source as dockerd stores and mounts it: cleaned by its text first, as Go's
    ``path.Clean`` does (``/a/link/../x`` is ``/a/x``, whatever ``link`` points to), and
    only then walked, links and all, by the kernel."""
    return "/" + posixpath.normpath(source).lstrip("/") if source.startswith("/") else source


def _named_volume(ctx: Ctx, fld: str, name: str, read_only: bool) -> None:
    """A volume used by name is mounted with the options it was created with."""
    if ctx.volume_of is None:
        if ctx.strict:
            raise Refusal(f"{fld}: the options of volume '{name}' cannot be checked here")
        return
    found = ctx.volume_of(name)  # None: dockerd makes it now, with no options
    if found is not None and found[0] in mounts.LOCAL_DRIVERS:
        _volume(ctx, f"{fld} (volume {name})", found[1], read_only)


def _volume(ctx: Ctx, fld: str, options: Mapping[str, str], read_only: bool) -> None:
    """A local volume, judged by the mount its options make."""
    made = mounts.local_volume(options)
    if made.refusal:
        ctx.refuse(fld, made.refusal)
    elif made.source:
        _mount(ctx, fld, made.source, "", read_only or made.read_only)


def _volumes_from(ctx: Ctx) -> None:
    """--volumes-from copies another container's mounts, binds of /dev included."""
    for i, ref in enumerate(ctx.view.host_config.get("VolumesFrom") or ()):
        fld = f"HostConfig.VolumesFrom[{i}]"
        name = str(ref).split(":")[0]
        if ctx.container_of is None:
            raise Refusal(f"{fld}: the mounts of '{name}' cannot be checked here")
        could = ctx.container_of(name)
        if not could:
            raise Refusal(names_none(fld, "copies the mounts of", name))
        for other in could:
            for m in other.get("Mounts") or ():
                if m.get("Type") == "bind":
                    _mount(ctx, fld, str(m.get("Source") or ""), str(m.get("Destination") or ""))


def _mount(ctx: Ctx, fld: str, src: str, dst: str, read_only: bool = False) -> None:
    if dst and within(dst, SENTINEL_MOUNT_DIR):
        ctx.add(fld, f"mount at {dst} selects GPUs through the toolkit's volume list", None)
    if not src:
        return
    real = ctx.resolved(fld, "bind source", src)
    if real is None:
        return
    exposed = exposure(ctx.host, real, read_only)
    # A host that shares no GPU (a test's table) has no MPS directory.
    shared = sharing.share_dir_gpu(real, getattr(ctx.host, "mps_dir", ""), ctx.inventory.uuids)
    if exposed and shared is not None:
        # A shared GPU's MPS pipe or shm directory reaches that GPU through its server.
        ctx.add(fld, f"{sharing.BIND_DETAIL} {shared}: {src}", {shared}, Demand(ids=(shared,)))
        return
    if exposed and socket_binds.socket_alone(ctx.host, real, read_only):
        if not socket_binds.may_bind(ctx.host, ctx.socket_owner):
            ctx.add(fld, socket_binds.bind_refusal(src, real), None)
        return  # an owner the policy trusts with the Engine's socket
    if exposed:
        ctx.add(fld, f"bind mount of {src} exposes {exposed}", None)
        return
    node = ctx.host.node(real)
    if node is not None and node.kind == "chr":
        device_node(ctx, fld, src, node)  # a GPU node is judged by its numbers, wherever it is
