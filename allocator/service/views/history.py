"""``gpu-alloc history``: who used which GPU when, from the audit trail.

A *use* is a grant joined to its release by lease id (`core.timing.uses`, still open
when no release was recorded); refusals, denials, hand-overs and adoptions are
listed as they are.  ``--gpu`` takes an index (as it was when the event was recorded) or a UUID
prefix, ``--user`` an owner, ``--since`` a duration (``7d``, ``12h``, ``30m``)
or an RFC 3339 time.
"""

from __future__ import annotations

import contextlib
from typing import Any

from allocator.core.api import numbers
from allocator.core.leases.events import parse_time
from allocator.core.timing.report import share_part
from allocator.core.timing.uses import uses

__all__ = ["select", "since_epoch", "uses", "with_gpu_hours"]


def since_epoch(text: str, now: float, flag: str = "--since") -> float:
    """A duration back from ``now``, or an RFC 3339 time, as epoch seconds."""
    with contextlib.suppress(numbers.BadNumber):
        return max(0.0, now - numbers.read(text, numbers.SPAN))  # before 1970: all of it
    try:
        return numbers.instant(parse_time(text), text)
    except ValueError:
        raise ValueError(
            f"{flag} {text!r}: expected a duration such as 7d, 12h or 30m, "
            "or a time such as 2026-01-31T09:00:00+00:00"
        ) from None


def select(
    rows: list[dict[str, Any]], gpu: str | None, user: str | None, since: float | None
) -> list[dict[str, Any]]:
    def on_gpu(r: dict[str, Any]) -> bool:
        if gpu is None:
            return True
        if gpu.isascii() and gpu.isdigit():
            return int(gpu) in (r.get("indices") or ())
        return any(str(u).startswith(gpu) for u in r.get("gpus") or ())

    def after(r: dict[str, Any]) -> bool:
        if since is None:
            return True
        end = r.get("to")
        return end is None or parse_time(end) >= since  # still held, or ended after

    return [r for r in rows if on_gpu(r) and (user is None or r.get("owner") == user) and after(r)]


def with_gpu_hours(rows: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
    """Each use with ``gpu_hours``: its GPUs (a share as its part of one, as `report`
    and fair share count it) times the hours it was held, up to ``now`` while held."""
    for r in rows:
        if r.get("event") == "use" and r.get("from"):
            end = parse_time(r["to"]) if r.get("to") else now
            held = max(0.0, end - parse_time(r["from"])) / 3600
            r["gpu_hours"] = round(held * len(r.get("gpus") or ()) * share_part(r.get("share")), 4)
    return rows
