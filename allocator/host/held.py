"""Fair share's own history: ``state_dir/held.jsonl``, one short line per ended lease.

The audit trail rotates by size, so a flood of denials (one line each) would shorten
fair share's memory of who held GPUs.  This record keeps only what fair share needs,
one line per lease when it ends, written by `allocator.service.recorder.Recorder.ended`::

    {"l": "<lease id>", "o": "alice", "g": ["GPU-..."], "s": 1767225600.0, "e": 1767229200.0}

(lease, owner, GPUs, held from, held to).  Each change holds its lock (``held.lock``,
the store idiom); a line goes out in one ``O_APPEND`` write.  Past `MAX_BYTES` the
file is rewritten keeping the lines that ended within `KEEP_S` (a use that old
weighs nothing at any half-life worth setting).  Writing is best effort, as the audit
trail's: a full disk costs fair share a memory, never a GPU.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from allocator.core.leases.leases import Lease, StateError
from allocator.host import store

log = logging.getLogger("gpu-alloc.held")
MAX_BYTES = 2 * 1024 * 1024
KEEP_S = 180 * 86400.0
LOCK_TIMEOUT = 2.0


class HeldRecord:
    def __init__(self, state_dir: str, max_bytes: int = MAX_BYTES) -> None:
        self.path = Path(state_dir, "held.jsonl")
        self.lock = store.Lock(Path(state_dir, "held.lock"), LOCK_TIMEOUT)
        self.max_bytes = max_bytes

    def ended(self, lease: Lease, end: float) -> None:
        """Record ``lease``'s GPUs as held by its owner until ``end``."""
        line = {"l": lease.id, "o": lease.owner or "", "g": list(lease.gpus),
                "s": lease.created, "e": end}  # fmt: skip
        data = (json.dumps(line, separators=(",", ":")) + "\n").encode()
        try:
            with self.lock.held():
                self._compact_if_full(len(data), end)
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    os.write(fd, data)
                finally:
                    os.close(fd)
        except (OSError, StateError) as e:
            log.error("held: could not record lease %s: %s", lease.id, e)

    def read(self) -> list[dict[str, Any]]:
        """Every line, oldest first; a torn or foreign one is skipped."""
        try:
            raw = store.read(self.path)
        except OSError:
            return []
        found = []
        for text in raw.splitlines():
            try:
                entry = json.loads(text)
                found.append({"l": str(entry["l"]), "o": str(entry["o"]), "g": list(entry["g"]),
                              "s": float(entry["s"]), "e": float(entry["e"])})  # fmt: skip
            except (ValueError, TypeError, KeyError):
                continue
        return found

    def _compact_if_full(self, adding: int, now: float) -> None:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return
        if size + adding <= self.max_bytes:
            return
        kept = [e for e in self.read() if e["e"] > now - KEEP_S]
        kept = kept[len(kept) // 2 :] if len(kept) * 120 > self.max_bytes else kept
        text = "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in kept)
        store.replace(self.path, text.encode(), sync=False)
