"""The health file: `allocator.core.machine.health.Health` in ``state_dir/health.json``.

It sits beside the ledger and under the ledger's lock, replaced atomically and
fsync'd (`store.replace`), so the shim's watcher, the plugin workers and the CLI all
see one answer.  A missing file means every GPU is healthy; an unreadable one means
no GPU can be proven healthy, so placement stops (fail closed) with a message
naming the file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from allocator.core.leases.leases import StateError
from allocator.core.machine.health import Health, turns
from allocator.host import store
from allocator.host.ledger import Ledger

HEALTH_FILE = "health.json"
log = logging.getLogger("gpu-alloc.health")


class HealthFile:
    def __init__(self, ledger: Ledger):
        self.ledger = ledger
        self.path = Path(ledger.dir) / HEALTH_FILE
        self._cache: tuple[object, Health] | None = None
        # Called with (UUID, healthy now, what happened) once a turn is written, outside
        # the lock: the service puts it in the audit trail.
        self.listeners: list[Callable[[str, bool, str], None]] = []

    def read(self) -> Health:
        """Parsed again only when the file changed (it is replaced, never edited in place)."""
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            if self._cache is not None and self._cache[0] == stamp:
                return self._cache[1]
            raw = store.read(self.path)
        except FileNotFoundError:
            return Health()
        except OSError as e:
            raise StateError(f"{self.path}: cannot read GPU health: {e.strerror}") from None
        try:
            health = Health.from_json(json.loads(raw.decode("utf-8")))
        except (ValueError, TypeError, AttributeError) as e:
            raise StateError(
                f"{self.path}: corrupt GPU health ({e}); remove it and run "
                "'gpu-alloc health' to start with every GPU healthy"
            ) from None
        self._cache = (stamp, health)
        return health

    @contextlib.contextmanager
    def transaction(self) -> Iterator[list[Health]]:
        """Under the ledger lock: the caller replaces ``box[0]``; a change is written."""
        with self.ledger.locked():
            box = [self.read()]
            before = box[0].to_json()
            yield box
            if box[0].to_json() == before:
                return
            self._write(box[0])
        was = Health.from_json(before)
        log_changes(was, box[0])
        for uuid, healthy, what in turns(was, box[0]):
            for listener in self.listeners:
                try:
                    listener(uuid, healthy, what)
                except Exception:  # the file is written: every turn is still told
                    log.exception("GPU %s: a health listener failed", uuid)

    def _write(self, health: Health) -> None:
        data = json.dumps(health.to_json(), indent=1, sort_keys=True).encode()
        try:  # health is no secret: status for docker-group users
            store.replace(self.path, data, mode=0o644)
        except OSError as e:
            raise StateError(f"{self.path}: cannot write GPU health: {e.strerror}") from None


def log_changes(before: Health, after: Health) -> None:
    """One line per GPU whose health changed."""
    for uuid, healthy, what in turns(before, after):
        log.log(logging.INFO if healthy else logging.WARNING, "GPU %s is %s", uuid, what)
    for uuid, h in after.gpus.items():
        if h.single_bit != before.of(uuid).single_bit:
            log.info("GPU %s: %d single-bit ECC errors so far", uuid, h.single_bit)
