"""Fair share by history: each owner's decayed GPU usage, for the waiting line.

With ``policy.fair_share.half_life`` set, the line orders equal priorities by each
owner's GPU-seconds held, each second weighted by ``2 ** (-age / half_life)``
(`core.report.decayed`, over the intervals ``gpu-alloc history`` and ``report``
show), before what they hold now.  Reading the audit trail costs a file, so the
answer is kept `TTL` seconds; only the line asks (a create with waiters, the
queue's serving, status and explain), never the path of a create without GPUs.
"""

from __future__ import annotations

import threading
import time

from allocator.core import report
from allocator.core.uses import uses
from allocator.host.audit import AuditLog

TTL = 5.0  # seconds an answer is kept


class FairShare:
    def __init__(self, state_dir: str) -> None:
        self.audit = AuditLog(state_dir)
        self._lock = threading.Lock()
        self._kept: tuple[float, float, dict[str, float]] | None = None  # at, half-life, usage

    def usage(self, half_life: float | None, now: float | None = None) -> dict[str, float] | None:
        """Owner -> decayed GPU-seconds; None when fair share is off (today's rule)."""
        if half_life is None:
            return None
        now = time.time() if now is None else now
        with self._lock:
            kept = self._kept
            if kept is not None and kept[1] == half_life and 0 <= now - kept[0] < TTL:
                return kept[2]
            found = report.decayed(report.held(uses(self.audit.read())), now, half_life)
            self._kept = (now, half_life, found)
            return found


def table(fair: FairShare, half_life: float | None, now: float | None = None) -> dict | None:
    """Each owner's decayed usage and share, least first (the line's order among equal
    priorities), for ``status`` and ``explain``; None when fair share is off."""
    usage = fair.usage(half_life, now)
    if usage is None:
        return None
    part = report.shares(usage)
    return {
        "half_life_s": half_life,
        "owners": [
            {"owner": o, "usage_gpu_hours": round(u / 3600, 4), "share": round(part[o], 4)}
            for o, u in sorted(usage.items(), key=lambda ou: (ou[1], ou[0]))
        ],
    }
