"""Live GPU use around what the GPU source reads (allocator/host/devices/): whose
container a GPU process is in, and when each GPU was last seen in use.

Activity (the last time each GPU was seen in use) is kept in
``state_dir/activity.json`` so that every process agrees on how long a GPU idled.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from allocator.core.machine.usage import container_of_cgroup
from allocator.host import store


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
