"""Who created each container the shim forwarded a create for: ``creators.json``.

A client inside a container is its creator's (allocator/core/judging/owners.py).  For a GPU
container the ledger's lease says who that is; this store says it for every other one
the shim created, so a client in a plain container with the shim's socket bound in is
its creator, not ``unknown`` (which a user at their limit could otherwise become, for a
default limit's worth more).  Written once per create the Engine answered 201, after
the answer and before the client hears it; read when a connection comes from inside a
container no lease names; a record goes when the Engine destroys its container (`forget`,
from the shim's follower of ``destroy`` events).  Bounded besides: past `KEEP` live
records the oldest go, and that container's clients count as ``unknown`` again (which
grants nothing a named person lacks).  The file holds container ids, uids and user
names: 0600 in the state directory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from allocator.core.leases.leases import StateError
from allocator.host import store

FILE, LOCK = "creators.json", "creators.lock"
KEEP = 100_000  # records kept: far more containers than one dockerd holds at once


class Creators:
    def __init__(self, state_dir: str | os.PathLike[str], lock_timeout: float = 5.0):
        self.path = Path(state_dir) / FILE
        self.lock = store.Lock(Path(state_dir) / LOCK, lock_timeout)
        self._known: tuple[bytes, dict[str, list]] = (b"", {})  # the file as last read

    def record(self, container: str, uid: int | None, user: str) -> None:
        """``container`` was created by ``user`` (uid ``uid``).  Raises `StateError`.

        One write per create that holds no GPU: a file this process wrote last (the same
        bytes read back) is not decoded again, and a new record is appended to its bytes
        as `json.dumps` would write it, so a create pays for its own record, not for every
        live container's (1.8 ms a create with 1,000 of them, decoded and encoded whole)."""
        with self.lock.held():
            raw, known = self._load()
            kept = dict(known)
            kept.pop(container, None)  # the newest last: the oldest go first
            kept[container] = [uid, user]
            while len(kept) > KEEP:
                kept.pop(next(iter(kept)))
            if known and raw.endswith(b"}") and len(kept) == len(known) + 1:
                data = raw[:-1] + b", " + json.dumps({container: [uid, user]})[1:].encode()
            else:
                data = json.dumps(kept).encode()
            self._write(data, kept, "record a container's creator")

    def forget(self, container: str) -> None:
        """``container`` is gone: its record too (no write when there is none)."""
        if container not in self._load()[1]:
            return
        with self.lock.held():
            kept = dict(self._load()[1])
            if kept.pop(container, None) is None:
                return
            self._write(json.dumps(kept).encode(), kept, "drop a container's creator")

    def of(self, container: str) -> tuple[int | None, str] | None:
        """(uid, user) who created ``container``; None when not recorded."""
        found = self._read().get(container)
        if not isinstance(found, list) or len(found) != 2 or not isinstance(found[1], str):
            return None
        uid = found[0] if isinstance(found[0], int) and not isinstance(found[0], bool) else None
        return uid, found[1]

    def _read(self) -> dict[str, list]:
        return self._load()[1]

    def _load(self) -> tuple[bytes, dict[str, list]]:
        """The file's bytes and records; the records this process holds for the same
        bytes are not decoded again (never changed in place: callers copy)."""
        try:
            raw = store.read(self.path)
        except OSError:
            return b"", {}  # none yet: nobody is recorded
        known = self._known
        if raw == known[0]:
            return known
        try:
            data = json.loads(raw)
        except ValueError:
            return b"", {}  # unreadable: nobody is recorded (unknown, fail closed)
        loaded = (raw, data if isinstance(data, dict) else {})
        self._known = loaded
        return loaded

    def _write(self, data: bytes, kept: dict[str, list], what: str) -> None:
        try:
            store.replace(self.path, data, sync=False)
        except OSError as e:
            raise StateError(f"{self.path}: cannot {what}: {e}") from e
        self._known = (data, kept)
