"""This host's answers to the filesystem questions effective access asks.

The core (allocator.core.access) decides from `Node`s and resolved paths; this
is the one place that stats, resolves and walks for it.
"""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass

from allocator.core.access import DRM_MAJOR, Node

DEFAULT_PROTECTED = (
    "/dev",
    "/sys",
    "/proc",
    "/etc/docker",
    "/run/docker",
    "/run/containerd",
    "/var/lib/docker",
    "/var/lib/gpu-alloc",
)


@dataclass(frozen=True)
class Host:
    """Filesystem facts of this host; ``protected`` are the paths no bind may reach."""

    protected: tuple[str, ...] = DEFAULT_PROTECTED
    sysfs: str = "/sys"
    proc_devices: str = "/proc/devices"

    def resolve(self, path: str) -> str:
        return os.path.realpath(path)

    def node(self, path: str) -> Node | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        if stat.S_ISCHR(st.st_mode):
            return Node("chr", os.major(st.st_rdev), os.minor(st.st_rdev))
        return Node("dir" if stat.S_ISDIR(st.st_mode) else "other")

    def walk(self, top: str) -> Iterable[str]:
        for root, _dirs, files in os.walk(top):
            for f in files:
                yield os.path.join(root, f)

    def drm_bus_id(self, minor: int) -> str | None:
        link = os.path.join(self.sysfs, "dev/char", f"{DRM_MAJOR}:{minor}", "device")
        try:
            return os.path.basename(os.path.realpath(link, strict=True))
        except OSError:
            return None

    def dynamic_majors(self) -> frozenset[int]:
        return _dynamic_majors(self.proc_devices)

    def with_protected(self, *paths: str) -> Host:
        return Host(tuple(dict.fromkeys((*self.protected, *paths))), self.sysfs, self.proc_devices)


@functools.cache
def _dynamic_majors(proc_devices: str) -> frozenset[int]:
    """nvidia-uvm and nvidia-caps get dynamic majors; /proc/devices names them."""
    try:
        with open(proc_devices) as f:
            lines = f.read().split("Block devices:")[0].splitlines()
    except OSError:
        return frozenset()
    return frozenset(
        int(n)
        for n, _, name in (ln.strip().partition(" ") for ln in lines)
        if n.isdigit() and name.startswith("nvidia")
    )
