"""``gpu-alloc gpus``: each GPU's live use, its processes, their containers and owners.

One `LiveView` per process: it caches the labels of the containers it has seen
(a container's labels never change), so a scrape every few seconds costs one
Engine inspect per container lifetime, not one per scrape, and one listing of
the holders' containers for their states.  `LiveView.read` gathers the facts and
asks `gpu_states.states` what each GPU is; the same reading feeds the CLI,
``GET /gpu-alloc/v1/gpus``, ``gpu-alloc status``, the Prometheus collector and
the dashboard, so they never disagree.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from allocator.core.api import labels
from allocator.core.judging import compose
from allocator.core.leases.leases import Lease, State, StateError
from allocator.core.machine.gpu_states import Activity, GpuState, states
from allocator.core.machine.health import Health
from allocator.core.machine.inventory import Inventory, InventoryError
from allocator.core.machine.usage import Usage, known
from allocator.core.rules import policy
from allocator.core.timing import timelimits
from allocator.host import clock as hostclock
from allocator.host import ledger, usage
from allocator.host.engine import EngineError
from allocator.service.views import shares as shared_view
from allocator.service.wiring import Allocator


@dataclass(frozen=True)
class Reading:
    """One look at the host: the facts, and each GPU's state derived from them."""

    now: float
    inventory: Inventory
    ledger: State
    gpus: list[GpuState]  # every GPU and MIG slice, then the departed ones
    use: dict[str, Usage]
    containers: dict[str, dict[str, Any]]  # the holders' containers as the Engine lists them
    idle_after: float  # policy.idle_after the idle marks were judged by


class LiveView:
    def __init__(self, alloc: Allocator) -> None:
        self.alloc = alloc
        self.activity = usage.Activity(alloc.config.state_dir)
        self._labels: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()

    def read(self, now: float | None = None) -> Reading:
        now = ledger.now() if now is None else now
        inventory = self.alloc.gather.inventory()
        state = self.alloc.ledger.read()
        try:
            use = self.alloc.gather.devices.usage()
        except InventoryError:
            use = {}
        idle_after = self.alloc.gather.policy.idle_after  # as the file says now, in every view
        active = frozenset(u for u, x in use.items() if x.active)
        try:
            seen = self.activity.observe(set(active), now, min(60.0, idle_after / 4))
        except StateError:  # its lock not free in time: shown from the marks as they are
            seen = self.activity.read()
        holders = state.holders(inventory.uuids)
        listed = self._containers(sorted({h.container for h in holders.values() if h.container}))
        health = Health() if self.alloc.config.health.disabled else self.alloc.health.read()
        found = states(
            (*inventory.gpus, *inventory.migs),
            holders,
            health,
            Activity(now, idle_after, active, seen, known(use)),
            {cid: str(c.get("State") or "") for cid, c in listed.items()},
        )
        return Reading(now, inventory, state, found, use, listed, idle_after)

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        got = self.read(now)
        pools = {name: list(p.gpus) for name, p in sorted(self.alloc.gather.rules.pools.items())}
        rows = [self._row(s, got, pools) for s in got.gpus if s.gpu and not s.gpu.is_slice]
        departed = [self._row(s, got, pools) for s in got.gpus if s.gpu is None]
        return {
            "time": got.now,
            "idle_after": got.idle_after,
            "gpus": rows,
            "departed": departed,
            "pools": pools,
            "shares": shared_view.shares(got.inventory, got.ledger, self._names(got)),
        }

    def _names(self, got: Reading) -> dict[str, str]:
        listed = got.containers.items()
        return {cid: c["Names"][0].lstrip("/") for cid, c in listed if c.get("Names")}

    def _row(self, s: GpuState, got: Reading, pools: dict[str, list[int]]) -> dict[str, Any]:
        g, holder = s.gpu, s.holder
        u = got.use.get(s.uuid, Usage())
        lease = got.ledger.leases.get(holder.lease) if holder and holder.lease else None
        return {
            "uuid": s.uuid,
            "index": None if g is None else g.index,
            "model": "" if g is None else g.name,
            **u.to_dict(),
            "memory_total_bytes": u.memory_total_bytes or (g.memory_mib if g else 0) * 2**20,
            "state": s.state,
            "healthy": s.health.healthy,
            "health": s.health.reason() or None,
            "holder": holder.to_dict() if holder else None,
            "container_state": s.container_state,
            **self._who(holder.container if holder else None, lease, holder.name if holder else ""),
            "lease_age_s": None if lease is None else max(0.0, got.now - lease.created),
            # policy.time_limit: what is left of the lease's (None: no limit)
            "time_left_s": None if lease is None else timelimits.left(lease, hostclock.read()),
            # the checkpoint signal sent before a stop, and when (None: none yet)
            "signal": (lease.signal or None) if lease else None,
            "signalled_at": lease.signalled if lease else None,
            "idle": s.idle_since is not None,
            "idle_since": s.idle_since,
            "use": s.use,  # active, unused or unknown: never idle on unknown use
            "pools": [n for n, idx in pools.items() if g is not None and g.index in idx],
            "processes": [self._process(p, got.ledger) for p in u.processes],
        }

    def _containers(self, ids: list[str]) -> dict[str, dict[str, Any]]:
        """Each holder container as the Engine lists it now (name after a rename, state)."""
        if self.alloc.engine is None:
            return {}
        try:
            listed = self.alloc.engine.containers(label=labels.LEASE)
            if ids:
                listed += self.alloc.engine.containers(ids=ids)
        except EngineError:
            return {}  # the ledger's names and no state: still worth showing
        return {c["Id"]: c for c in listed}

    def _process(self, p: Any, state: State) -> dict[str, Any]:
        cid = usage.container_of(p.pid)
        lease = state.lease_of(cid) if cid else None
        claim = state.claims.get(cid) if cid else None
        return {
            "pid": p.pid,
            "used_memory_bytes": p.used_memory_bytes,
            "container": cid,
            **self._who(cid, lease, claim.name if claim else ""),
        }

    def _who(self, cid: str | None, lease: Lease | None, name: str = "") -> dict[str, Any]:
        """Owner, container name and Compose project: the lease first, then the labels."""
        labels = self._labels_of(cid) if cid else {}
        known = lease.owner if lease and lease.owner != policy.NOBODY.user else ""
        return {
            "owner": known or policy.user_of_label(labels.get(policy.OWNER)) or None,
            "container_name": (lease.name if lease else "") or name or labels.get("_name", ""),
            "compose_project": labels.get(compose.PROJECT, ""),
        }

    def _labels_of(self, cid: str) -> dict[str, str]:
        with self._lock:
            if cid in self._labels:
                return self._labels[cid]
        info = None
        if self.alloc.engine is not None:
            try:
                info = self.alloc.engine.inspect(cid)
            except EngineError:
                return {}  # asked again next time
        found = dict(((info or {}).get("Config") or {}).get("Labels") or {})
        if info:
            found["_name"] = str(info.get("Name") or "").lstrip("/")
        with self._lock:
            if len(self._labels) > 4096:
                self._labels.clear()
            self._labels[cid] = found
        return found
