"""``gpu-alloc status`` and ``repair``: the ledger as people and scripts read it."""

from __future__ import annotations

import http.client
import json
import shutil
import time
from typing import Any

from allocator.host import unixhttp
from allocator.host.ledger import State, StateError
from allocator.service import Allocator


def snapshot(alloc: Allocator) -> dict[str, Any]:
    inventory = alloc.inventory()
    state = alloc.ledger.read()
    present = [g.uuid for g in inventory.gpus]
    holder_of = _holders(state, present + _departed(state, present))
    gpus = []
    for g in inventory.gpus:
        holder = holder_of.get(g.uuid)
        if holder is None and g.busy:
            holder = {"container": None, "name": None, "why": "host compute processes"}
        gpus.append({**g.to_dict(), "free": holder is None, "holder": holder})
    return {
        "gpus": gpus,
        "leases": [vars(le) | {"gpus": list(le.gpus)} for le in state.leases.values()],
        "claims": [
            vars(c) | {"gpus": None if c.gpus is None else list(c.gpus)}
            for c in state.claims.values()
        ],
        "departed": [
            {"uuid": uuid, "holder": holder_of[uuid]} for uuid in _departed(state, present)
        ],
        "free": sum(1 for g in gpus if g["free"]),
        "total": len(gpus),
    }


def _departed(state: State, present: list[str]) -> list[str]:
    """GPUs a lease or claim names that the inventory no longer has (removed, new UUID)."""
    named = {u for le in state.leases.values() for u in le.gpus}
    named |= {u for c in state.claims.values() for u in c.gpus or ()}
    return sorted(named - set(present))


def _holders(state: State, uuids: list[str]) -> dict[str, dict[str, Any]]:
    """UUID -> holder; an unpinned claim holds every GPU nothing else names."""
    held: dict[str, dict[str, Any]] = {}
    for lease in state.leases.values():
        for uuid in lease.gpus:
            held[uuid] = {
                "container": lease.container,
                "name": lease.name,
                "lease": lease.id,
                "state": lease.state,
                "why": "leased by gpu-alloc",
            }
    claims = sorted(state.claims.values(), key=lambda c: c.gpus is None)
    for claim in claims:
        entry = {"container": claim.container, "name": claim.name, "why": claim.why}
        for uuid in uuids if claim.gpus is None else claim.gpus:
            held.setdefault(uuid, entry)
    return held


def render_json(snap: dict[str, Any]) -> str:
    return json.dumps(snap, indent=2, sort_keys=True)


def render_table(snap: dict[str, Any]) -> str:
    rows = [("GPU", "UUID", "NAME", "STATE", "HOLDER")]
    for g in snap["gpus"]:
        h = g["holder"]
        who = "-" if h is None else _who(h)
        rows.append((str(g["index"]), g["uuid"], g["name"], "free" if g["free"] else "held", who))
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


def repair(alloc: Allocator, reset: bool = False) -> str:
    """Rebuild what the Engine can prove; a corrupt file is moved aside, never deleted."""
    notes = []
    try:
        alloc.ledger.read()
    except StateError as e:
        if not reset:
            raise StateError(
                f"{e}; run 'gpu-alloc repair --reset' to move it aside and "
                "rebuild the ledger from the Engine's containers"
            ) from None
        reset = True
    if reset and alloc.ledger.path.exists():
        aside = alloc.ledger.path.with_suffix(f".corrupt-{int(time.time())}")
        with alloc.ledger.locked():
            shutil.move(alloc.ledger.path, aside)
        notes.append(f"moved {alloc.ledger.path} to {aside}")
    report = alloc.reconcile(adopt=True)
    notes.append(
        f"freed {len(report.freed)} lease(s), bound {len(report.bound)}, "
        f"adopted {len(report.adopted)} container(s), dropped {len(report.dropped)}"
    )
    return "\n".join(notes)


def from_shim(socket_path: str, why: str) -> dict[str, Any]:
    """The shim's view, for users in the docker group who cannot read the state dir."""
    try:
        code, body = unixhttp.request(socket_path, "GET", "/gpu-alloc/v1/status", timeout=30)
    except (OSError, http.client.HTTPException) as e:
        raise StateError(f"{why}; and the shim at {socket_path} did not answer: {e}") from None
    if code != 200:
        raise StateError(f"{why}; the shim answered {code}: {body[:200]!r}")
    return json.loads(body)
