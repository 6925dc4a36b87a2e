"""``gpu-alloc history`` rendered: one row per use or event, oldest first; a use with its
GPU-hours (GPU-H, a share counted as its part of a GPU) and a share marked as one."""

from __future__ import annotations

from typing import Any

from allocator.service.views.wire import encode as render_json

__all__ = ["render_json", "render_table"]


def render_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no matching events"
    table = [("FROM", "TO", "EVENT", "GPUS", "GPU-H", "OWNER", "CONTAINER", "REASON")]
    for r in rows:
        uuids, indices = r.get("gpus") or [], r.get("indices") or []
        gpus = ",".join(
            str(i) if i is not None else u[:12]
            for u, i in zip(uuids, [*indices, *[None] * len(uuids)], strict=False)
        )
        if r.get("share"):
            gpus += f" (share {r['share']})"
        hours = r.get("gpu_hours")
        who = r.get("name") or (r.get("container") or "")[:12] or "-"
        to = r.get("to") or ("held" if r["event"] == "use" else "")
        reason = r.get("end") if r["event"] == "use" else r.get("reason") or ""
        table.append(
            (
                r.get("from") or "",
                to,
                r["event"],
                gpus or "-",
                "-" if hours is None else f"{hours:.2f}",
                r.get("owner") or "-",
                who,
                reason or "",  # the last column: never cut
            )
        )
    last = len(table[0]) - 1
    widths = [max(len(row[i]) for row in table) for i in range(last)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row[:last], widths, strict=True)) + "  " + row[last]
        for row in table
    )
