"""The dashboard's timeline: who held which GPU over the last 24 hours or 7 days, the
reservations ahead, and GPU-hours per owner for the period.

The held intervals are `core.timing.report`'s (`core.timing.uses` joined, the ones ``gpu-alloc
history`` lists), clipped to the period; a use still open runs to ``now``.  The
GPU-hours per owner are `core.timing.report.rows` by user over the same period, so they match
``gpu-alloc report --since 24h``.  Reservations are those not over yet, drawn up to
``ahead`` past now.  Times are epoch seconds, for the page to place.

`Timeline` keeps each period's answer a few seconds: the page polls it, and reading
the audit trail and the samples again for each poll would cost the shim for nothing.
It takes no lock of its own while it reads; two polls at once may both read.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from allocator.core.timing import report
from allocator.core.timing.reservations import Reservation
from allocator.core.timing.uses import uses
from allocator.host.audit import AuditLog
from allocator.host.samples import Samples

if TYPE_CHECKING:
    from allocator.service.wiring import Allocator

DAY = 86400.0
PERIODS = {"24h": (DAY, DAY / 4), "7d": (7 * DAY, DAY)}  # name -> (back, ahead) seconds
CACHE_S = 5.0


def build(
    state_dir: str,
    reservations: Iterable[Reservation],
    index: Mapping[str, int],
    now: float,
    period: str,
) -> dict[str, Any]:
    """The timeline as ``/api/timeline`` serves it.  ``index``: UUID -> index of the
    host's GPUs now, each drawn as a row even when nobody held it."""
    if period not in PERIODS:
        raise ValueError(f"period {period!r}: expected one of {', '.join(PERIODS)}")
    back, ahead = PERIODS[period]
    since = now - back
    found = uses(AuditLog(state_dir).read())
    rows: dict[str, dict[str, Any]] = {
        uuid: {"uuid": uuid, "index": i, "held": []}
        for uuid, i in sorted(index.items(), key=lambda kv: kv[1])
    }
    for h in report.held(found):
        span = report.clipped(h, since, now)
        if span is None:
            continue
        row = rows.setdefault(h.uuid, {"uuid": h.uuid, "index": h.index, "held": []})
        row["held"].append(
            {
                "owner": h.owner,
                "name": h.name,
                "from": span[0],
                "to": span[1],
                "open": h.end is None,
            }
        )
    window = report.Window(since, now)
    samples = Samples(state_dir).read(since, now)
    owners = report.rows(found, samples, window, "user", lambda owner, _: (owner or report.NONE,))
    return {
        "period": period,
        "since": since,
        "now": now,
        "until": now + ahead,
        "gpus": list(rows.values()),
        "reservations": [
            {
                "id": r.id,
                "for": r.holder,
                "from": r.start,
                "to": r.end,
                "gpus": list(r.gpus),
                "note": r.note,
            }
            for r in reservations
            if r.start < now + ahead and r.end > since
        ],
        "owners": [
            {
                "owner": r["user"],
                "gpu_hours_held": r["gpu_hours_held"],
                "gpu_hours_used": r["gpu_hours_used"],
            }
            for r in owners
            if r["gpu_seconds_held"] > 0
        ],
    }


class Timeline:
    """`build` for the allocator's host, each period's answer kept ``CACHE_S`` seconds."""

    def __init__(self, alloc: Allocator, keep: float = CACHE_S) -> None:
        self.alloc = alloc
        self.keep = keep
        self._lock = threading.Lock()  # guards the dict only, never a read
        self._cache: dict[str, tuple[float, dict[str, Any]]] = {}

    def get(self, period: str) -> dict[str, Any]:
        now = time.time()
        with self._lock:
            hit = self._cache.get(period)
        if hit is not None and 0 <= now - hit[0] < self.keep:
            return hit[1]
        index = {g.uuid: g.index for g in self.alloc.gather.inventory().gpus}
        answer = build(
            self.alloc.config.state_dir,
            self.alloc.reservations.current(now),
            index,
            now,
            period,
        )
        with self._lock:
            self._cache[period] = (now, answer)
        return answer
