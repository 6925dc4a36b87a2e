"""Fair share by history: each owner's decayed GPU usage, for the waiting line.

One part of the composed service (allocator/service/wiring.py), given the audit trail; the
line (`Lineup.usage`) asks it, and ``status`` and ``explain`` show its `table`.

With ``policy.fair_share.half_life`` set, the line orders equal priorities by each
owner's GPU-seconds held, each second weighted by ``2 ** (-age / half_life)``
(`core.timing.report.decayed`), before what they hold now.  The intervals are fair share's
own record of ended leases (allocator/host/held.py, which no flood of audit lines
rotates away), and the audit trail's uses for the rest (those still held, and
those from before the record).  Reading them costs files, so the answer is kept
`TTL` seconds and the files re-read in the background (`FairShare`);
only the line asks (a create with waiters, the queue's serving, status and
explain), never the path of a create without GPUs.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from allocator.core.timing import report
from allocator.core.timing.report import Held
from allocator.core.timing.uses import uses
from allocator.host.audit import AuditLog
from allocator.host.held import HeldRecord
from allocator.service.background import Background

TTL = 5.0  # seconds an answer is kept

Stamp = tuple[tuple[int, int, int] | None, ...]  # each file's inode, size, mtime (None: absent)


class FairShare:
    """Decayed usage from the audit trail's held intervals.

    The intervals are read once, synchronously (the line's first serving, before the
    ledger lock), then again in a background thread whenever the audit file changed
    and the answer is older than `TTL`: meanwhile the previous intervals answer, with
    uses still held counted up to now, so no create waits on the file under the lock.
    """

    def __init__(
        self, audit: AuditLog, record: HeldRecord, background: Background | None = None
    ) -> None:
        self.audit = audit
        self.background = background or Background()  # the service's, or one of its own
        self.record = record
        self._lock = threading.Lock()
        self._held: list[Held] | None = None
        self._stamp: Stamp = ()
        self._refreshing = False
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
            if self._held is None:
                self._stamp, self._held = self._stamp_now(), self._read()
            elif not self._refreshing and self._stamp_now() != self._stamp:
                self._refreshing = True
                self.background.once("fair-share", self._refresh)
            found = report.decayed(self._held, now, half_life)
            self._kept = (now, half_life, found)
            return found

    def _read(self) -> list[Held]:
        ended = self.record.read()
        recorded = {e["l"] for e in ended}
        rows = [r for r in uses(self.audit.read()) if r.get("lease") not in recorded]
        own = [Held(e["o"], str(u), None, e["s"], e["e"]) for e in ended for u in e["g"]]
        return own + report.held(rows)

    def _refresh(self) -> None:
        try:
            stamp = self._stamp_now()
            held = self._read()
            with self._lock:
                self._stamp, self._held, self._kept = stamp, held, None
        finally:
            self._refreshing = False

    def _stamp_now(self) -> Stamp:
        return tuple(_stamp(p) for p in (self.audit.path, self.record.path))


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


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
