"""The notices' outbox: every notice made and not yet sent, on disk, so none is lost to a
sink that is down or to a restart, and none is sent twice.

``state_dir/notices/``: ``outbox/ID.json`` per notice to send, with each of its sinks'
state (sent, or its failures so far, the last error and when to try again), and
``sent/ID``, an empty mark per notice sent whole (its mtime: when), kept `KEEP_SENT`
seconds so that the same notice made again (the same audit record) is not sent again.
Every change is made under ``notices/outbox.lock`` with allocator/host/store.py's
atomic replace; a reader takes the files as they are.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from allocator.core.timing import notices
from allocator.core.timing.notices import Notice
from allocator.host import store

KEEP_SENT = 30 * 86400.0


@dataclass
class Sink:
    """One sink's part of a notice: ``sent``, or ``failures`` so far, the last ``error``
    and ``next_at``, when to try again (epoch seconds)."""

    sent: bool = False
    failures: int = 0
    error: str = ""
    next_at: float = 0.0


@dataclass
class Entry:
    notice: Notice
    sinks: dict[str, Sink] = field(default_factory=dict)

    def due(self, now: float) -> list[str]:
        return [n for n, s in self.sinks.items() if not s.sent and s.next_at <= now]

    def to_json(self) -> dict[str, Any]:
        return {
            "notice": self.notice.to_json(),
            "sinks": {n: vars(s) for n, s in self.sinks.items()},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Entry:
        sinks = {str(n): Sink(**s) for n, s in data["sinks"].items()}
        return cls(Notice.from_json(data["notice"]), sinks)


class Outbox:
    def __init__(self, state_dir: str, lock_timeout: float = 5.0) -> None:
        self.dir = Path(state_dir, "notices")
        self.pending = self.dir / "outbox"
        self.sent = self.dir / "sent"
        self.lock = store.Lock(self.dir / "outbox.lock", lock_timeout)

    def put(self, notice: Notice, sinks: list[str]) -> bool:
        """Keep ``notice`` to send to ``sinks``; False when it is kept or was sent already
        (its id: the same record told again), or goes to no sink."""
        if not sinks:
            return False
        with self.lock.held():
            path = self.pending / f"{notice.id}.json"
            if path.exists() or (self.sent / notice.id).exists():
                return False
            self._write(Entry(notice, {s: Sink() for s in sinks}))
        return True

    def entries(self) -> list[Entry]:
        """Every notice still to send, oldest first; an unreadable file is skipped (and
        counted by `unreadable`)."""
        found = []
        for path in self._files():
            try:
                found.append(Entry.from_json(json.loads(store.read(path))))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return sorted(found, key=lambda e: e.notice.at)

    def unreadable(self) -> int:
        return len(self._files()) - len(self.entries())

    def settle(self, notice_id: str, sink: str, error: str | None, now: float) -> None:
        """Record one sink's try: sent (``error`` None), or failed and when to try again;
        a notice sent to every sink leaves the outbox for its ``sent`` mark."""
        with self.lock.held():
            path = self.pending / f"{notice_id}.json"
            try:
                entry = Entry.from_json(json.loads(store.read(path)))
            except FileNotFoundError:
                return
            state = entry.sinks[sink]
            if error is None:
                state.sent, state.error = True, ""
            else:
                state.failures += 1
                state.error = error[:300]
                state.next_at = now + notices.retry_after(state.failures)
            if all(s.sent for s in entry.sinks.values()):
                self.sent.mkdir(mode=0o700, parents=True, exist_ok=True)
                mark = self.sent / notice_id
                mark.touch()
                os.utime(mark, (now, now))  # `prune` reads the same clock
                path.unlink()
            else:
                self._write(entry)

    def prune(self, now: float) -> None:
        """Forget the sent marks older than `KEEP_SENT`."""
        try:
            marks = list(os.scandir(self.sent))
        except FileNotFoundError:
            return
        for mark in marks:
            try:
                if now - mark.stat().st_mtime > KEEP_SENT:
                    os.unlink(mark.path)
            except FileNotFoundError:
                continue

    def _files(self) -> list[Path]:
        try:
            return sorted(self.pending.glob("*.json"))
        except FileNotFoundError:
            return []

    def _write(self, entry: Entry) -> None:
        self.pending.mkdir(mode=0o700, parents=True, exist_ok=True)
        data = json.dumps(entry.to_json(), sort_keys=True).encode()
        store.replace(self.pending / f"{entry.notice.id}.json", data)
