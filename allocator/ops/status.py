"""``gpu-alloc status``: the ledger as people and scripts read it."""

from __future__ import annotations

import http.client
import json
from dataclasses import asdict
from typing import Any

from allocator.core.health import Health
from allocator.core.inventory import GPU
from allocator.core.leases import StateError
from allocator.host import unixhttp
from allocator.service import Allocator


def snapshot(alloc: Allocator) -> dict[str, Any]:
    inventory = alloc.inventory()
    state = alloc.ledger.read()
    present = [g.uuid for g in (*inventory.gpus, *inventory.migs)]
    departed = sorted(state.named_gpus() - set(present))
    holder_of = {u: h.to_dict() for u, h in state.holders({*present, *departed}).items()}
    health = alloc.health.read()

    def row(g: GPU) -> dict[str, Any]:
        holder = holder_of.get(g.uuid)
        if holder is None and g.busy:
            holder = {"container": None, "name": None, "why": "host compute processes"}
        if holder is None and g.mig_mode:
            holder = {"container": None, "name": None, "why": "MIG mode: leased as its slices"}
        return {**g.to_dict(), "free": holder is None, "holder": holder}

    gpus = [row(g) | _health(health, g.uuid) for g in inventory.gpus]
    migs = [row(m) | _health(health, m.parent) for m in inventory.migs]
    return {
        "gpus": gpus,
        "migs": migs,
        "mig_policy": alloc.config.policy.mig,
        "leases": [vars(le) | {"gpus": list(le.gpus)} for le in state.leases.values()],
        "claims": [
            vars(c) | {"gpus": None if c.gpus is None else list(c.gpus)}
            for c in state.claims.values()
        ],
        "departed": [{"uuid": uuid, "holder": holder_of[uuid]} for uuid in departed],
        "free": sum(1 for g in gpus if g["free"]),
        "total": len(gpus),
    }


def _health(health: Health, uuid: str) -> dict[str, Any]:
    h = health.of(uuid)
    event = None if h.event is None else asdict(h.event) | {"what": h.event.describe()}
    return {"healthy": h.healthy, "health_event": event, "single_bit_ecc": h.single_bit}


def render_json(snap: dict[str, Any]) -> str:
    return json.dumps(snap, indent=2, sort_keys=True)


def render_table(snap: dict[str, Any]) -> str:
    rows = [("GPU", "UUID", "NAME", "STATE", "HOLDER")]
    for g in [*snap["gpus"], *snap.get("migs", ())]:
        h = g["holder"]
        who = "-" if h is None else _who(h)
        state = "free" if g["free"] else "held"
        if g.get("mig_mode"):
            state, who = "MIG mode", "(leased as its slices)"
        if not g.get("healthy", True):
            state = f"unhealthy ({g['health_event']['what']}), " + state
        gpu = str(g["index"]) if not g.get("parent") else f"{g['index']}:{g['mig_index']}"
        name = g["name"] if not g.get("parent") else f"MIG {g['profile']}"
        rows.append((gpu, g["uuid"], name, state, who))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4]
        for r in rows
    ]
    lines.append(f"{snap['free']} of {snap['total']} GPUs free")
    for gone in snap.get("departed") or ():
        lines.append(
            f"warning: {gone['uuid']} is held by {_who(gone['holder'])} but is no longer on "
            "this host (removed, or its UUID changed); it is never granted. Remove that "
            "container, then run 'gpu-alloc repair'"
        )
    if snap.get("warning"):
        lines.append(f"warning: {snap['warning']}")
    return "\n".join(lines)


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


def from_shim(socket_path: str, why: str) -> dict[str, Any]:
    """The shim's view, for users in the docker group who cannot read the state dir."""
    try:
        code, body = unixhttp.request(socket_path, "GET", "/gpu-alloc/v1/status", timeout=30)
    except (OSError, http.client.HTTPException) as e:
        raise StateError(f"{why}; and the shim at {socket_path} did not answer: {e}") from None
    if code != 200:
        raise StateError(f"{why}; the shim answered {code}: {body[:200]!r}")
    return json.loads(body)
