"""Uses of GPUs from the audit trail: each grant joined to its release by lease id.

One join for ``gpu-alloc history`` and ``gpu-alloc report`` (and fair share), so
the intervals they show are the same.  A use still open has ``to`` None.  A lease
granted from the waiting line is recorded twice (the line's grant, then the
create's); the second joins the first instead of opening a second use.  Every
other event is one row of its own, from and to its own time.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def uses(entries: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Grants joined to their releases, and every other event as one row, oldest first."""
    rows: list[dict[str, Any]] = []
    open_: dict[str, dict[str, Any]] = {}
    for e in entries:
        kind = e.get("event")
        if kind == "grant" and e.get("lease") in open_:
            row = open_[e["lease"]]
            row["waited_s"] = row.get("waited_s") or e.get("waited_s")
        elif kind == "grant" and e.get("lease"):
            row = {**e, "event": "use", "from": e.get("time"), "to": None, "end": ""}
            open_[e["lease"]] = row
            rows.append(row)
        elif kind == "release" and e.get("lease") in open_:
            row = open_.pop(e["lease"])
            row.update(to=e.get("time"), end=e.get("reason", ""))
            row["container"] = e.get("container") or row.get("container")
            row["name"] = e.get("name") or row.get("name")
            row["owner"] = e.get("owner") or row.get("owner")
        else:
            rows.append({**e, "from": e.get("time"), "to": e.get("time")})
    return rows
