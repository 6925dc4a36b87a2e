"""``gpu-alloc gpus`` rendered: one row per GPU, then one per process on it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from allocator.service.views.wire import encode as render_json

__all__ = ["describe", "render_json", "render_table"]


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.0f}%"


def _gib(v: int | None) -> str:
    return "-" if v is None else f"{v / 2**30:.1f}"


def _clock(stamp: float) -> str:
    """A time of day, UTC, as a signal's is shown: it is hours before the stop at most."""
    return datetime.fromtimestamp(stamp, UTC).strftime("%H:%M:%SZ")


def describe(g: dict[str, Any]) -> str:
    """The STATE column: the state, then whether it is still held, idle, stopped or sent
    its checkpoint signal."""
    extra = []
    if g["state"] in ("unhealthy", "departed") and g["holder"]:
        extra.append("held")
    if g["holder"] and g.get("container_state") not in (None, "running"):
        extra.append(g["container_state"])
    if g["idle"]:
        extra.append("idle")
    elif g["holder"] and g.get("use") == "unknown":
        extra.append("use unknown")  # never idle, never reclaimed
    if g.get("signalled_at"):
        extra.append(f"signalled at {_clock(g['signalled_at'])}")
    return g["state"] + (f" ({', '.join(extra)})" if extra else "")


def render_table(snap: dict[str, Any]) -> str:
    rows = [("GPU", "MODEL", "STATE", "UTIL", "MEM GiB", "TEMP", "POWER", "OWNER", "CONTAINER")]
    for g in snap["gpus"]:
        rows.append(
            (
                str(g["index"]),
                g["model"],
                describe(g),
                _pct(g["utilization"]),
                f"{_gib(g['memory_used_bytes'])}/{_gib(g['memory_total_bytes'])}",
                "-" if g["temperature_c"] is None else f"{g['temperature_c']:g}C",
                "-" if g["power_w"] is None else f"{g['power_w']:g}W",
                g["owner"] or "-",
                g["container_name"] or ((g["holder"] or {}).get("container") or "-")[:12],
            )
        )
        for sh in (s for s in snap.get("shares") or () if s["uuid"] == g["uuid"]):
            rows.append(("", f"  share {sh['share']}", "", "", "", "", "", sh["owner"],
                         sh["name"] or (sh["container"] or "-")[:12]))  # fmt: skip
        for p in g["processes"]:
            where = p["container_name"] or (p["container"] or "host")[:12]
            rows.append(("", f"  pid {p['pid']}", "", "", _gib(p["used_memory_bytes"]), "", "",
                         p["owner"] or "-", where))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    for g in snap["gpus"]:
        if not g["healthy"]:
            lines.append(f"GPU {g['index']} unhealthy ({g['health']}): never granted")
    for g in snap.get("departed") or ():
        who = g["container_name"] or ((g["holder"] or {}).get("container") or "")[:12]
        lines.append(f"{g['uuid']} departed: no longer on this host, still held by '{who}'")
    return "\n".join(lines)
