"""``gpu-alloc reservations``: every reservation not over yet, as rows for the CLI."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from allocator.core.leases.events import rfc3339
from allocator.core.timing.reservations import Reservation


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
