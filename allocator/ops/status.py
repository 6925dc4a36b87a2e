"""``gpu-alloc status`` rendered: one line per holder, then what needs saying."""

from __future__ import annotations

from typing import Any

from allocator.core.leases.holders import ago
from allocator.core.machine.cpus import format_list
from allocator.service.views import shares as shared_view
from allocator.service.views.status import HOST, rfc3339
from allocator.service.views.wire import encode as render_json

WIDTH = 100
__all__ = ["render_json", "render_table"]


def render_table(snap: dict[str, Any]) -> str:
    """One line per holder, then the free GPUs; fits in `WIDTH` columns.  STATE says the
    time left of a lease with a time limit (policy.time_limit); a line below says when a
    container was sent its checkpoint signal."""
    rows = [("GPUS", "OWNER", "CONTAINER", "STATE", "AGE", "POOL")]
    for h in snap.get("holders") or ():
        gpus = ",".join([*map(str, sorted(h["gpus"])), *h.get("slices", ())]) or "-"
        name = h["name"] or (h["container"] or "")[:12] or "-"
        if h.get("lease") is None:
            name += " (adopted)"
        age = "-" if h.get("age_s") is None else ago(h["age_s"])
        state = h["state"] + (" (idle)" if h.get("idle") else "")
        if h.get("time_left_s") is not None:
            state += f", {ago(h['time_left_s'])} left" if h["time_left_s"] else ", time is up"
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
    for h in snap.get("holders") or ():
        if h.get("signalled_at"):
            lines.append(
                f"signalled: {h['name'] or h['container'][:12]} was sent {h['signal']} at "
                f"{h['signalled_at']}, {ago(h['signal_lead_s'])} before its stop"
            )
    unread = [str(g["index"]) for g in snap["gpus"] if g["holder"] and g.get("use") == "unknown"]
    if unread:
        lines.append(
            f"use unknown (no utilisation reading), never marked idle nor reclaimed: "
            f"GPU {','.join(unread)}"
        )
    swarm = [str(g["index"]) for g in snap["gpus"] if g.get("swarm")]
    if swarm:
        lines.append(
            f"given to Docker Swarm (swarm.gpus), never leased here: GPU {','.join(swarm)}"
        )
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
    lines += shared_view.lines(snap)
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
    if snap.get("fair_share"):
        lines.append(fair_share_line(snap["fair_share"]))
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
        since = f", waiting {ago(r['waited_s'])} (since {rfc3339(r['since'])})"
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


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "~"


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


def fair_share_line(fair: dict[str, Any], owner: str | None = None) -> str:
    """Each owner's decayed use and share (only ``owner``'s when given), least first."""
    shown = [o for o in fair["owners"] if owner is None or o["owner"] == owner]
    parts = ", ".join(
        f"{o['owner'] or '-'} {o['usage_gpu_hours']:.2f} GPU-h ({o['share']:.0%})" for o in shown
    )
    return (
        f"fair share (half-life {ago(fair['half_life_s'])}; less recent use is served first "
        f"among equal priorities): {parts or 'no use yet'}"
    )
