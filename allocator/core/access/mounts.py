"""What a bind or a local volume will mount, and which protected path it reaches.

Rules
-----
1. Judge the mount the kernel will make, not the spelling: a bind source by the path
   it resolves to and the filesystems it reaches (binds are recursive), a local volume
   by what moby's local driver passes to mount(2) (volume/local/local_unix.go and
   moby/sys/mount's flag table).
2. Allow-list: a local volume is safe only as a plain directory, a tmpfs, a network
   filesystem, or a bind of an absolute path that exposes nothing protected.  Every
   other mount type (proc, sysfs, devtmpfs, overlay, a block device's filesystem...) and
   every relative bind source (dockerd resolves it against its own working directory)
   is refused.
3. Inside /dev, /sys and /proc only a separate mount of a data-only filesystem
   (/dev/shm, /dev/mqueue) is harmless, and cgroup files when read-only.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Protocol


@dataclass(frozen=True)
class Mount:
    """One line of the host's mount table: where a filesystem is mounted, and its type."""

    point: str
    fstype: str


class MountFacts(Protocol):
    @property
    def protected(self) -> tuple[str, ...]: ...

    def mounts(self) -> Iterable[Mount]: ...


KERNEL_TREES = ("/dev", "/sys", "/proc")
DATA_FS = frozenset({"tmpfs", "mqueue", "hugetlbfs"})  # hold files, never device nodes
READ_ONLY_FS = frozenset({"cgroup", "cgroup2"})  # cgroup files act only when written
# Filesystems that are the kernel's interfaces: reached below a bind, they expose it.
KERNEL_FS = frozenset(
    {"devtmpfs", "devpts", "sysfs", "proc", "securityfs", "debugfs", "tracefs", "bpf",
     "configfs", "efivarfs", "fusectl", "binfmt_misc", "pstore", "cgroup", "cgroup2"}
)  # fmt: skip


def within(path: str, top: str) -> bool:
    return PurePosixPath(go_clean(path)).is_relative_to(go_clean(top))


def go_clean(path: str) -> str:
    """Go's ``path.Clean``: POSIX keeps a leading ``//`` apart, Go (and so dockerd and the
    toolkit) makes it ``/``."""
    clean = posixpath.normpath(path) if path else "."
    return "/" + clean.lstrip("/") if clean.startswith("//") else clean


def exposure(host: MountFacts, real: str, read_only: bool = False) -> str | None:
    """The protected path (or kernel filesystem) a bind of the resolved ``real`` reaches.

    A bind is recursive (dockerd's Binds are rbind), so it reaches every mount below its
    source as well.
    """
    for p in host.protected:
        if within(p, real):
            return p
    table = list(host.mounts())
    for p in host.protected:
        if within(real, p) and not (p in KERNEL_TREES and _harmless(table, real, p, read_only)):
            return p
    own = mount_of(table, real)
    if own is not None and _kernel(own, read_only):
        return f"{own.point} (a {own.fstype} filesystem)"
    for m in table:
        if m.point != real and within(m.point, real) and _kernel(m, read_only):
            return f"{m.point} (a {m.fstype} filesystem mounted below it)"
    return None


def mount_of(table: list[Mount], path: str) -> Mount | None:
    """The mount ``path`` lies on: the last of the longest mount points above it."""
    best: Mount | None = None
    for m in table:
        if within(path, m.point) and (best is None or len(m.point) >= len(best.point)):
            best = m
    return best


def _kernel(m: Mount, read_only: bool) -> bool:
    return m.fstype in KERNEL_FS and not (read_only and m.fstype in READ_ONLY_FS)


def _harmless(table: list[Mount], real: str, tree: str, read_only: bool) -> bool:
    own = mount_of(table, real)
    if own is None or own.point == tree or not within(own.point, tree):
        return False  # the tree's own filesystem (devtmpfs, sysfs, proc), or unknown
    reached = [own, *(m for m in table if m.point != real and within(m.point, real))]
    return all(m.fstype in DATA_FS or (read_only and m.fstype in READ_ONLY_FS) for m in reached)


# ------------------------------------------------------------------ local volumes

LOCAL_DRIVERS = ("", "local")
LOCAL_OPTIONS = frozenset({"type", "o", "device", "size"})  # validOpts in local_unix.go
# moby/sys/mount's flag table: these words of ``o`` are mount flags, the rest is data.
MOUNT_FLAGS = frozenset(
    {"defaults", "ro", "rw", "suid", "nosuid", "dev", "nodev", "exec", "noexec", "sync",
     "async", "dirsync", "remount", "mand", "nomand", "atime", "noatime", "diratime",
     "nodiratime", "bind", "rbind", "unbindable", "runbindable", "private", "rprivate",
     "shared", "rshared", "slave", "rslave", "relatime", "norelatime", "strictatime",
     "nostrictatime"}
)  # fmt: skip
# Mount types that cannot reach the host's devices or files: memory and network shares.
SAFE_TYPES = frozenset({"tmpfs", "nfs", "nfs4", "cifs", "smb3"})


@dataclass(frozen=True)
class VolumeMount:
    """What the local driver will mount: nothing special, a bind of ``source``, or a
    mount gpu-alloc refuses (``refusal`` says why)."""

    source: str = ""  # the bind source, when the volume is a bind
    read_only: bool = False
    refusal: str = ""


def local_volume(options: Mapping[str, str]) -> VolumeMount:
    """Judge a local volume's options as moby's local driver will mount them."""
    unknown = sorted(k for k in options if k not in LOCAL_OPTIONS)
    if unknown:
        return VolumeMount(refusal=f"option '{unknown[0]}' is not one gpu-alloc can vet")
    kind, device = str(options.get("type") or ""), str(options.get("device") or "")
    if not kind and not device:
        return VolumeMount()  # a plain directory under the Engine's data root (size: quota)
    words = str(options.get("o") or "").split(",")
    flags = [w for w in words if w in MOUNT_FLAGS]
    if "remount" in flags:
        return VolumeMount(refusal="o=remount changes an existing mount")
    read_only = next((w == "ro" for w in reversed(flags) if w in ("ro", "rw")), False)
    if "bind" in flags or "rbind" in flags:
        if not device.startswith("/"):
            return VolumeMount(
                refusal=f"device '{device}' is relative, and dockerd resolves it against its "
                "own working directory; name an absolute path"
            )
        return VolumeMount(source=device, read_only=read_only)
    if kind in SAFE_TYPES:
        return VolumeMount()
    return VolumeMount(
        refusal=f"mount type '{kind}' of device '{device}' is not one gpu-alloc knows to "
        "expose nothing of the host; use a plain volume, tmpfs, NFS, or o=bind of a "
        "narrow absolute path"
    )
