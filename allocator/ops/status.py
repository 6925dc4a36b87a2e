"""``gpu-alloc status``: the ledger as people and scripts read it."""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from allocator.core.cpus import format_list
from allocator.core.gpu_states import GpuState
from allocator.core.health import GpuHealth
from allocator.core.inventory import GPU
from allocator.core.leases import StateError, ago
from allocator.host import unixhttp
from allocator.ops.gpus import LiveView
from allocator.service import Allocator

WIDTH = 100
HOST = "host compute processes"
MIG_MODE = "MIG mode: leased as its slices"


def _state(c: dict[str, Any] | None) -> str:
    if c is None:
        return "unknown"
    state = str(c.get("State") or "unknown")
    if state == "exited":
        status = str(c.get("Status") or "")  # "Exited (0) 5 minutes ago"
        return status.lower().replace(" ago", "") + " ago" if status else "exited"
    return state


def snapshot(alloc: Allocator, live: LiveView | None = None) -> dict[str, Any]:
    got = (live or LiveView(alloc)).read()
    inventory, state, engine = got.inventory, got.ledger, got.containers
    now = time.time()
    read = {s.uuid: s for s in got.gpus}
    held = {s.uuid: s.holder for s in got.gpus if s.holder is not None}
    holder_of = {u: h.to_dict() | {"since": _rfc3339(h.since)} for u, h in held.items()}
    holders: dict[tuple[Any, ...], dict[str, Any]] = {}
    index = {g.uuid: g.index for g in inventory.gpus}
    slice_of = {m.uuid: f"{m.index}:{m.mig_index}" for m in inventory.migs}
    for uuid, h in held.items():
        c = engine.get(h.container or "")
        entry = holders.setdefault(
            (h.lease, h.container),
            {
                "gpus": [],
                "slices": [],
                "uuids": [],
                "container": h.container,
                "name": (c["Names"][0].lstrip("/") if c and c.get("Names") else h.name),
                "state": _state(c) if h.container else "creating",
                "owner": {"uid": h.owner_uid, "user": h.owner},
                "since": _rfc3339(h.since),
                "age_s": None if h.since is None else round(now - h.since),
                "pool": h.pool,
                "lease": h.lease,
                "why": h.why,
                "idle": False,
            },
        )
        entry["uuids"].append(uuid)
        entry["idle"] = entry["idle"] or read[uuid].idle_since is not None
        if uuid in index:
            entry["gpus"].append(index[uuid])
        elif uuid in slice_of:
            entry["slices"].append(slice_of[uuid])
    for shown in holder_of.values():
        c = engine.get(shown.get("container") or "")
        if c and c.get("Names"):
            shown["name"] = c["Names"][0].lstrip("/")

    def row(s: GpuState, g: GPU) -> dict[str, Any]:
        holder = holder_of.get(g.uuid)
        if holder is None and g.busy:
            holder = {"container": None, "name": None, "why": HOST}
        if holder is None and g.mig_mode:
            holder = {"container": None, "name": None, "why": MIG_MODE}
        return {
            **g.to_dict(),
            "free": s.free,  # grantable now
            "state": s.state,
            "container_state": s.container_state,
            "holder": holder,
            "idle_since": s.idle_since,
            **_health(s.health),
        }

    gpus = [row(s, s.gpu) for s in got.gpus if s.gpu is not None and not s.gpu.is_slice]
    migs = [row(s, s.gpu) for s in got.gpus if s.gpu is not None and s.gpu.is_slice]
    departed = [s.uuid for s in got.gpus if s.gpu is None]
    return {
        "gpus": gpus,
        "migs": migs,
        "mig_policy": alloc.config.policy.mig,
        "holders": sorted(holders.values(), key=lambda r: (r["gpus"] or [1 << 30], r["uuids"])),
        "leases": [
            vars(le) | {"gpus": list(le.gpus), "cpus": list(le.cpus), "mems": list(le.mems)}
            for le in state.leases.values()
        ],
        "claims": [
            vars(c)
            | {"gpus": None if c.gpus is None else list(c.gpus)}
            | {"cpus": list(c.cpus), "mems": list(c.mems)}
            for c in state.claims.values()
        ],
        "departed": [
            {"uuid": uuid, "state": "departed", "holder": holder_of[uuid]} for uuid in departed
        ],
        "free": sum(1 for g in gpus if g["free"]),
        "total": len(gpus),
    }


def _health(h: GpuHealth) -> dict[str, Any]:
    event = None if h.event is None else asdict(h.event) | {"what": h.event.describe()}
    return {"healthy": h.healthy, "health_event": event, "single_bit_ecc": h.single_bit}


def render_json(snap: dict[str, Any]) -> str:
    return json.dumps(snap, indent=2, sort_keys=True)


def render_table(snap: dict[str, Any]) -> str:
    """One line per holder, then the free GPUs; fits in `WIDTH` columns."""
    rows = [("GPUS", "OWNER", "CONTAINER", "STATE", "AGE", "POOL")]
    for h in snap.get("holders") or ():
        gpus = ",".join([*map(str, sorted(h["gpus"])), *h.get("slices", ())]) or "-"
        name = h["name"] or (h["container"] or "")[:12] or "-"
        if h.get("lease") is None:
            name += " (adopted)"
        age = "-" if h.get("age_s") is None else ago(h["age_s"])
        state = h["state"] + (" (idle)" if h.get("idle") else "")
        rows.append((gpus, h["owner"]["user"], name, state, age, h.get("pool") or "-"))
    widths = [min(max(len(r[i]) for r in rows), cap) for i, cap in enumerate((15, 12, 36, 30))]
    lines = [
        "  ".join(_fit(c, w).ljust(w) for c, w in zip(r[:4], widths, strict=True))
        + f"  {r[4]:<4}  {r[5]}"
        for r in rows
    ]
    free = [str(g["index"]) for g in snap["gpus"] if g["free"]]
    busy = [str(g["index"]) for g in snap["gpus"] if (g["holder"] or {}).get("why") == HOST]
    lines.append(
        f"free: {snap['free']} of {snap['total']} GPUs"
        + (f" (GPU{'s' * (len(free) > 1)} {','.join(free)})" if free else "")
    )
    if busy:
        lines.append(f"busy with host processes: GPU {','.join(busy)}")
    for g in snap["gpus"]:
        if g.get("mig_mode"):
            free_slices = [
                f"{m['index']}:{m['mig_index']} {m['profile']}"
                for m in snap.get("migs") or ()
                if m["parent"] == g["uuid"] and m["free"]
            ]
            lines.append(
                f"GPU {g['index']} is in MIG mode, leased as its slices; free slices: "
                + (", ".join(free_slices) or "none")
            )
    for g in [*snap["gpus"], *(snap.get("migs") or ())]:
        if not g.get("healthy", True):
            name = f"MIG {g['index']}:{g['mig_index']}" if g.get("parent") else f"GPU {g['index']}"
            held = "" if g["holder"] is None else f", held by {_who(g['holder'])} (not stopped)"
            lines.append(
                f"{name} unhealthy ({g['health_event']['what']}){held}: never granted; "
                "'gpu-alloc health clear' brings it back once fixed"
            )
    for le in snap.get("leases") or ():
        if le.get("cpus") or le.get("memory"):
            lines.append(_cpu_line(le, f"lease {le['id']}"))
    for c in snap.get("claims") or ():
        if c.get("cpus") or c.get("memory"):
            lines.append(_cpu_line(c, f"adopted container {c['container'][:12]}"))
    for h in snap.get("holders") or ():
        if h.get("lease") is None:
            gpus = ",".join(map(str, sorted(h["gpus"])))
            lines.append(f"adopted, not leased by gpu-alloc: GPU {gpus} '{h['name']}': {h['why']}")
    for gone in snap.get("departed") or ():
        lines.append(
            f"warning: {gone['uuid']} is held by {_who(gone['holder'])} but is no longer on "
            "this host (removed, or its UUID changed); it is never granted. Remove that "
            "container, then run 'gpu-alloc repair'"
        )
    if "queue" in snap:
        lines += _queue_lines(snap["queue"])
    if snap.get("warning"):
        lines.append(f"warning: {snap['warning']}")
    return "\n".join(lines)


def _queue_lines(rows: list[dict[str, Any]] | None) -> list[str]:
    """The creates waiting for GPUs, in the order they will be served."""
    if rows is None:
        return ["queue: unknown (the shim did not answer)"]
    if not rows:
        return []
    lines = [f"waiting for GPUs: {len(rows)}"]
    for r in rows:
        asked = "all GPUs" if r.get("all") else f"{r['gpus']} GPU{'s' * (r['gpus'] != 1)}"
        where = f" in pool '{r['pool']}'" if r.get("pool") else ""
        since = f", waiting {ago(r['waited_s'])} (since {_rfc3339(r['since'])})"
        name = f" '{r['name']}'" if r.get("name") else ""
        why = (
            f"; held back by their limit ({r['held_back_by']})"
            if r.get("held_back_by")
            else "; waiting for free GPUs"
        )
        lines.append(
            f"  {r['position']}. {r['owner']}{name}: {asked}{where}, "
            f"priority {r['priority']}{since}{why}"
        )
    return lines


def queue_from_shim(socket_path: str) -> list[dict[str, Any]] | None:
    """The shim's queue (it lives in the shim's memory); None when the shim does not answer."""
    try:
        code, body = unixhttp.request(socket_path, "GET", QUEUE_PATH, timeout=5)
        return list(json.loads(body)["queue"]) if code == 200 else None
    except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError):
        return None


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "~"


def _rfc3339(stamp: float | None) -> str | None:
    if not stamp:
        return None
    return datetime.fromtimestamp(stamp, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _cpu_line(le: dict[str, Any], who: str) -> str:
    """``lease 1a2b 'job': CPUs 8-11,24-27, memory 4 GiB on node 0``."""
    parts = []
    if le.get("cpus"):
        parts.append(f"CPUs {format_list(le['cpus'])}")
    if le.get("memory"):
        parts.append(f"memory {le['memory'] / (1 << 30):g} GiB on node {format_list(le['mems'])}")
    name = f" '{le['name']}'" if le.get("name") else ""
    return f"{who}{name}: " + ", ".join(parts)


def _who(h: dict[str, Any]) -> str:
    parts = []
    if h.get("container"):
        parts.append(f"container {h['container'][:12]}")
    if h.get("name"):
        parts.append(f"'{h['name']}'")
    if h.get("lease"):
        parts.append(f"lease {h['lease']} ({h['state']})")
    else:
        parts.append(f"({h['why']})")
    return " ".join(parts)


QUEUE_PATH = "/gpu-alloc/v1/queue"  # served by the shim (shim/create.py)


def from_shim(socket_path: str, why: str) -> dict[str, Any]:
    """The shim's view, for users in the docker group who cannot read the state dir."""
    try:
        code, body = unixhttp.request(socket_path, "GET", "/gpu-alloc/v1/status", timeout=30)
    except (OSError, http.client.HTTPException) as e:
        raise StateError(f"{why}; and the shim at {socket_path} did not answer: {e}") from None
    if code != 200:
        raise StateError(f"{why}; the shim answered {code}: {body[:200]!r}")
    return json.loads(body)
