"""``gpu-alloc history``: who used which GPU when, from the audit trail.

A *use* is a grant joined to its release by lease id (still open when no release
was recorded); refusals, denials, hand-overs and adoptions are listed as they
are.  ``--gpu`` takes an index (as it was when the event was recorded) or a UUID
prefix, ``--user`` an owner, ``--since`` a duration (``7d``, ``12h``, ``30m``)
or an RFC 3339 time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from allocator.core.events import parse_time

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")


def since_epoch(text: str, now: float) -> float:
    m = _DURATION.match(text.strip())
    if m:
        return now - float(m[1]) * _UNITS[m[2]]
    try:
        return parse_time(text)
    except ValueError:
        raise ValueError(
            f"--since {text!r}: expected a duration such as 7d, 12h or 30m, "
            "or a time such as 2026-01-31T09:00:00+00:00"
        ) from None


def uses(entries: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Grants joined to their releases, and every other event as one row, oldest first."""
    rows: list[dict[str, Any]] = []
    open_: dict[str, dict[str, Any]] = {}
    for e in entries:
        kind = e.get("event")
        if kind == "grant" and e.get("lease"):
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


def select(
    rows: list[dict[str, Any]], gpu: str | None, user: str | None, since: float | None
) -> list[dict[str, Any]]:
    def on_gpu(r: dict[str, Any]) -> bool:
        if gpu is None:
            return True
        if gpu.isdigit():
            return int(gpu) in (r.get("indices") or ())
        return any(str(u).startswith(gpu) for u in r.get("gpus") or ())

    def after(r: dict[str, Any]) -> bool:
        if since is None:
            return True
        end = r.get("to")
        return end is None or parse_time(end) >= since  # still held, or ended after

    return [r for r in rows if on_gpu(r) and (user is None or r.get("owner") == user) and after(r)]
