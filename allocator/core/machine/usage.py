"""What each GPU is doing right now, and whether a lease on it has gone idle, as data.

`Usage` comes from NVML on a host, from the simulated-GPU file in tests.  A
process is tied to its container through the container id its cgroup path
carries (``/docker/<id>``, ``docker-<id>.scope``, ...); `container_of_cgroup`
reads that from the text of ``/proc/PID/cgroup``.  A leased GPU is idle when it
ran no process at zero utilisation for ``idle_after`` seconds since the later
of the grant and the last time it was seen busy.

A GPU's `use` is one of `USES`: ``active`` (a process, or utilisation above 0),
``unused`` (both read: no process, 0 %), or ``unknown`` (not read: no utilisation
figure, a process list that could not be read, or no reading at all).  Only an
``unused`` GPU is ever idle: unknown use is never shown as idle nor reclaimed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

ACTIVE, UNUSED, UNKNOWN = "active", "unused", "unknown"
USES = (ACTIVE, UNUSED, UNKNOWN)

_CONTAINER_ID = re.compile(r"(?:^|[/-])([0-9a-f]{64})(?:\.scope)?(?:/|$)")


@dataclass(frozen=True)
class Process:
    pid: int
    used_memory_bytes: int | None = None
    name: str = ""


@dataclass(frozen=True)
class Usage:
    utilization: float | None = None  # 0..1 of the last sample period
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    processes: tuple[Process, ...] = field(default_factory=tuple)
    processes_read: bool = True  # False: the process list could not be read

    @property
    def active(self) -> bool:
        return bool(self.processes) or bool(self.utilization)

    @property
    def use(self) -> str:
        """`ACTIVE`, `UNUSED` (known to run nothing at 0 %) or `UNKNOWN`."""
        if self.active:
            return ACTIVE
        if self.utilization is None or not self.processes_read:
            return UNKNOWN
        return UNUSED

    def to_dict(self) -> dict[str, Any]:
        skip = ("processes", "processes_read")
        return {k: v for k, v in asdict(self).items() if k not in skip}


def known(use: Mapping[str, Usage]) -> frozenset[str]:
    """The GPUs whose use was read now: in use, or known to be unused."""
    return frozenset(u for u, x in use.items() if x.use != UNKNOWN)


def container_of_cgroup(text: str) -> str | None:
    """The container id in a ``/proc/PID/cgroup`` file (v1 or v2, cgroupfs or systemd)."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        for part in path.split("/"):
            m = _CONTAINER_ID.search("/" + part)
            if m:
                return m[1]
    return None


def idle_since(
    granted: float, last_active: float | None, active: bool, now: float, idle_after: float
) -> float | None:
    """When an idle lease's GPU stopped being used; None while it is in use (or recently)."""
    if active:
        return None
    since = max(granted, last_active or 0.0)
    return since if now - since >= idle_after else None
