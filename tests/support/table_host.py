"""Host facts from a table, for the pure access and mount tests: paths resolve to themselves."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from allocator.core.access.facts import Node
from allocator.core.access.mounts import Mount

V1_CGROUPS = (Mount("/", "ext4"), Mount("/dev", "devtmpfs"), Mount("/dev/shm", "tmpfs"),
              Mount("/sys", "sysfs"), Mount("/sys/fs/cgroup", "tmpfs"),
              Mount("/sys/fs/cgroup/devices", "cgroup"), Mount("/proc", "proc"))  # fmt: skip


@dataclass
class TableHost:
    """Host facts from a table: paths resolve to themselves, nothing is a device."""

    table: tuple[Mount, ...] = V1_CGROUPS
    protected: tuple[str, ...] = ("/dev", "/sys", "/proc", "/var/lib/docker", "/run/docker")
    nodes: dict[str, Node] = field(default_factory=dict)
    mps_dir: str = ""  # shared GPUs' MPS directories (allocator/core/rules/sharing.py)

    def resolve(self, path: str) -> str:
        return path

    def node(self, path: str) -> Node | None:
        return self.nodes.get(path)

    def walk(self, top: str) -> Iterable[str]:
        return ()

    def drm_bus_id(self, minor: int) -> str | None:
        return None

    def dynamic_majors(self) -> frozenset[int]:
        return frozenset()

    def mounts(self) -> Iterable[Mount]:
        return self.table
