"""``gpu-alloc gpus``: each GPU's live use, its processes, their containers and owners.

One `LiveView` per process: it caches the labels of the containers it has seen
(a container's labels never change), so a scrape every few seconds costs one
Engine inspect per container lifetime, not one per scrape.  The same rows feed
the CLI, ``GET /gpu-alloc/v1/gpus``, the Prometheus collector and the dashboard.
"""

from __future__ import annotations

import http.client
import json
import threading
from typing import Any

from allocator.core import compose, policy
from allocator.core.inventory import InventoryError
from allocator.core.leases import Lease, State, StateError
from allocator.core.usage import Usage, idle_since
from allocator.host import ledger, unixhttp, usage
from allocator.host.engine import EngineError
from allocator.service import Allocator

GPUS_PATH = "/gpu-alloc/v1/gpus"  # on the shim socket, next to /gpu-alloc/v1/status
STATES = ("free", "leased", "busy", "departed", "unhealthy")


class LiveView:
    def __init__(self, alloc: Allocator) -> None:
        self.alloc = alloc
        self.activity = usage.Activity(alloc.config.state_dir)
        self._labels: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        now = ledger.now() if now is None else now
        inventory = self.alloc.inventory()
        state = self.alloc.ledger.read()
        try:
            use = usage.read(self.alloc.config.gpus)
        except InventoryError:
            use = {}
        idle_after = self.alloc.config.policy.idle_after
        seen = self.activity.observe(
            {u for u, x in use.items() if x.active}, now, min(60.0, idle_after / 4)
        )
        holders = state.holders(inventory.uuids)
        rows = []
        for g in inventory.gpus:
            u = use.get(g.uuid, Usage())
            holder = holders.get(g.uuid)
            lease = state.leases.get(holder.lease) if holder and holder.lease else None
            since = (
                idle_since(lease.created, seen.get(g.uuid), u.active, now, idle_after)
                if lease
                else None
            )
            container = holder.container if holder else None
            rows.append(
                {
                    "uuid": g.uuid,
                    "index": g.index,
                    "model": g.name,
                    **u.to_dict(),
                    "memory_total_bytes": u.memory_total_bytes or g.memory_mib * 1024 * 1024,
                    "state": "leased" if holder else "busy" if g.busy else "free",
                    "holder": holder.to_dict() if holder else None,
                    **self._who(container, lease),
                    "lease_age_s": None if lease is None else max(0.0, now - lease.created),
                    "idle": since is not None,
                    "idle_since": since,
                    "processes": [self._process(p, state) for p in u.processes],
                }
            )
        departed = sorted(state.named_gpus() - inventory.uuids)
        return {"time": now, "idle_after": idle_after, "gpus": rows, "departed": departed}

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


def from_shim(socket_path: str) -> dict[str, Any]:
    """The shim's view, for users in the docker group who cannot read the state dir."""
    try:
        code, body = unixhttp.request(socket_path, "GET", GPUS_PATH, timeout=30)
    except (OSError, http.client.HTTPException) as e:
        raise StateError(f"the shim at {socket_path} did not answer: {e}") from None
    if code != 200:
        raise StateError(f"the shim answered {code}: {body[:200]!r}")
    return json.loads(body)


def render_json(snap: dict[str, Any]) -> str:
    return json.dumps(snap, indent=2, sort_keys=True)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.0f}%"


def _gib(v: int | None) -> str:
    return "-" if v is None else f"{v / 2**30:.1f}"


def render_table(snap: dict[str, Any]) -> str:
    rows = [("GPU", "MODEL", "STATE", "UTIL", "MEM GiB", "TEMP", "POWER", "OWNER", "CONTAINER")]
    for g in snap["gpus"]:
        state = g["state"] + (" (idle)" if g["idle"] else "")
        rows.append(
            (
                str(g["index"]),
                g["model"],
                state,
                _pct(g["utilization"]),
                f"{_gib(g['memory_used_bytes'])}/{_gib(g['memory_total_bytes'])}",
                "-" if g["temperature_c"] is None else f"{g['temperature_c']:g}C",
                "-" if g["power_w"] is None else f"{g['power_w']:g}W",
                g["owner"] or "-",
                g["container_name"] or ((g["holder"] or {}).get("container") or "-")[:12],
            )
        )
        for p in g["processes"]:
            where = p["container_name"] or (p["container"] or "host")[:12]
            rows.append(("", f"  pid {p['pid']}", "", "", _gib(p["used_memory_bytes"]), "", "",
                         p["owner"] or "-", where))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )
