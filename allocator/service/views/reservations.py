"""``gpu-alloc reservations``: every reservation not over yet, as rows for the CLI and
for the shim's socket (a refusal for a reserved GPU points every user at them)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from allocator.core.leases.events import rfc3339
from allocator.core.timing.reservations import Reservation
from allocator.service.wiring import Allocator


def listing(alloc: Allocator, now: float) -> list[dict[str, Any]]:
    """The rows of the reservations not over at ``now``, their GPUs by this host's index."""
    index = {g.uuid: g.index for g in alloc.gather.inventory().gpus}
    return rows(alloc.reservations.current(now), index, now)


def rows(
    found: Iterable[Reservation], index: Mapping[str, int], now: float
) -> list[dict[str, Any]]:
    """One dict per reservation, by start: ``state`` is ``active`` or ``upcoming``."""
    return [
        {
            "id": r.id,
            "for": r.holder,
            "gpus": [index.get(u) for u in r.gpus],
            "uuids": list(r.gpus),
            "from": rfc3339(r.start),
            "to": rfc3339(r.end),
            "state": "active" if r.active(now) else "upcoming",
            "count": r.count or None,
            "pool": r.pool,
            "note": r.note,
            "by": r.by,
            "created": rfc3339(r.created) if r.created else None,
        }
        for r in sorted(found, key=lambda r: (r.start, r.id))
    ]
