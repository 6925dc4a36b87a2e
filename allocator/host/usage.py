"""Live GPU use: from NVML on a host, from the simulated-GPU file's ``usage:`` entries.

A simulated GPU may carry, e.g.::

    - uuid: GPU-...
      index: 0
      usage: {utilization: 0.85, memory_used_mib: 30000, temperature_c: 61,
              power_w: 240, processes: [{pid: 4242, used_memory_mib: 29000}]}

so that the live view, the idle mark and the metrics are all tested without a GPU.
Activity (the last time each GPU was seen in use) is kept in
``state_dir/activity.json`` so that every process agrees on how long a GPU idled.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import yaml

from allocator.core.inventory import InventoryError
from allocator.core.usage import Process, Usage, container_of_cgroup
from allocator.host import store

MIB = 1024 * 1024


def read(source: str) -> dict[str, Usage]:
    """UUID -> its use now; a GPU the source says nothing about is missing."""
    if source == "nvml":
        from allocator.host import nvml

        return nvml.usage()
    try:
        data = yaml.safe_load(Path(source).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise InventoryError(f"{source}: cannot read simulated GPU use: {e}") from None
    if isinstance(data, dict):
        data = data.get("gpus")
    found = {}
    for entry in data if isinstance(data, list) else ():
        if isinstance(entry, dict) and isinstance(entry.get("usage"), dict):
            found[str(entry["uuid"])] = _simulated(entry["usage"], entry.get("memory_mib"))
    return found


def _mib(value: Any) -> int | None:
    return None if value is None else int(float(value) * MIB)


def _simulated(u: dict[str, Any], memory_mib: Any) -> Usage:
    procs = tuple(
        Process(int(p["pid"]), _mib(p.get("used_memory_mib")), str(p.get("name") or ""))
        for p in u.get("processes") or ()
    )
    util = u.get("utilization")
    return Usage(
        utilization=None if util is None else float(util),
        memory_used_bytes=_mib(u.get("memory_used_mib")),
        memory_total_bytes=_mib(memory_mib) if memory_mib else None,
        temperature_c=u.get("temperature_c"),
        power_w=u.get("power_w"),
        processes=procs,
    )


def container_of(pid: int, proc: str = "/proc") -> str | None:
    try:
        return container_of_cgroup(Path(proc, str(pid), "cgroup").read_text())
    except OSError:
        return None  # exited, or in a PID namespace this process cannot see


class Activity:
    """``state_dir/activity.json``: UUID -> the last time (epoch) the GPU was seen in use.

    Written only when a value moves by more than ``resolution`` seconds, so a busy
    GPU sampled every few seconds does not rewrite the file every time; read, changed
    and replaced under its lock (``activity.lock``, the store idiom), since the
    timekeeper, the sampler and every view mark it from threads and processes of their
    own, and a mark lost to a concurrent write could let idle reclaim stop a container
    just used.  Replaced without an fsync: a value lost to a power cut only moves an
    idle mark (later, never earlier).  A lock not free in `LOCK_TIMEOUT` raises
    `LockTimeout`: the timekeeper then reclaims nothing on that look.
    """

    LOCK_TIMEOUT = 5.0

    def __init__(self, state_dir: str) -> None:
        self.path = Path(state_dir, "activity.json")
        self.lock = store.Lock(Path(state_dir, "activity.lock"), self.LOCK_TIMEOUT)

    def read(self) -> dict[str, float]:
        try:
            data = json.loads(store.read(self.path))
        except (OSError, ValueError):
            return {}
        return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def observe(self, active: set[str], now: float, resolution: float) -> dict[str, float]:
        """Mark ``active`` as in use at ``now``; every GPU's last use, this mark included."""
        seen = self.read()
        if not any(now - seen.get(u, 0.0) > resolution for u in active):
            return seen
        with self.lock.held():
            seen = self.read()  # again, under the lock: another writer's marks kept
            moved = {u for u in active if now - seen.get(u, 0.0) > resolution}
            seen.update(dict.fromkeys(moved, now))
            if moved:
                with contextlib.suppress(OSError):  # the mark is in hand for this look
                    store.replace(self.path, json.dumps(seen).encode(), sync=False)
        return seen
