"""The audit trail: ``state_dir/audit.jsonl``, one JSON line per decision, rotated by size.

Several processes write it (the shim, each plugin worker, the CLI's reconcile).
Each line goes out in one ``write()`` on an ``O_APPEND`` descriptor, which the
kernel appends atomically for a regular file, and under a small lock of its own
(``audit.lock``, a `store.Lock`; never the ledger's), so that rotation (rename
``audit.jsonl`` -> ``.1`` -> ...) cannot happen between another writer's size check
and its write.  Writing is best effort: a full disk or a lock not free in time is
logged, never turned into a refused GPU.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from allocator.core.leases.leases import StateError
from allocator.host import store

log = logging.getLogger("gpu-alloc.audit")
MAX_BYTES = 10 * 1024 * 1024
KEEP = 5
LOCK_TIMEOUT = 2.0


class AuditLog:
    def __init__(self, state_dir: str, max_bytes: int = MAX_BYTES, keep: int = KEEP) -> None:
        self.path = Path(state_dir, "audit.jsonl")
        self.lock = store.Lock(Path(state_dir, "audit.lock"), LOCK_TIMEOUT)
        self.max_bytes = max_bytes
        self.keep = keep

    def write(self, entry: dict[str, Any]) -> None:
        line = (json.dumps(entry, sort_keys=True, separators=(",", ":")) + "\n").encode()
        try:
            with self.lock.held():
                self._rotate_if_full(len(line))
                fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o640)
                try:
                    size = os.fstat(fd).st_size
                    if size and os.pread(fd, 1, size - 1) != b"\n":
                        line = b"\n" + line  # a writer died mid-line: keep ours whole
                    os.write(fd, line)
                finally:
                    os.close(fd)
        except (OSError, StateError) as e:  # a full disk, or the lock not free in time
            log.error("audit: could not record %s: %s", entry.get("event"), e)

    def _rotate_if_full(self, adding: int) -> None:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return
        if size + adding <= self.max_bytes:
            return
        # .keep-1 -> .keep replaces (drops) the oldest; at most `keep` old files remain.
        for n in range(self.keep - 1, 0, -1):
            older = self._old(n)
            if older.exists():
                os.replace(older, self._old(n + 1))
        if self.keep > 0:
            os.replace(self.path, self._old(1))
        else:
            self.path.unlink()

    def _old(self, n: int) -> Path:
        return self.path.with_name(f"{self.path.name}.{n}")

    def files(self) -> list[Path]:
        """Rotated files, newest first (``.1``, ``.2``, ...), that exist."""
        return [p for n in range(1, self.keep + 1) if (p := self._old(n)).exists()]

    def read(self) -> Iterator[dict[str, Any]]:
        """Every record, oldest first; a torn or foreign line is skipped."""
        for p in [*reversed(self.files()), self.path]:
            try:
                with open(p, "rb") as f:
                    for raw in f:
                        try:
                            entry = json.loads(raw)
                        except ValueError:
                            continue
                        if isinstance(entry, dict):
                            yield entry
            except FileNotFoundError:
                continue
