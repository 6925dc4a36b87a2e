"""The reservations file: `allocator.core.timing.reservations.Reservation`s in
``state_dir/reservations.json``.

It sits beside the ledger and under the ledger's lock, written by `store.replace`,
so the CLI that writes it and the shim and plugin workers that place by it see one
answer.  A missing file means no reservation; an unreadable one stops GPU placement
(fail closed: a reservation could be broken unseen) with a message naming the file.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

from allocator.core.leases.leases import StateError
from allocator.core.timing.reservations import Reservation
from allocator.host import store
from allocator.host.ledger import Ledger

RESERVATIONS_FILE = "reservations.json"
VERSION = 1


class ReservationFile:
    def __init__(self, ledger: Ledger):
        self.ledger = ledger
        self.path = Path(ledger.dir) / RESERVATIONS_FILE
        self._cache: tuple[object, tuple[Reservation, ...]] | None = None

    def read(self) -> tuple[Reservation, ...]:
        """Parsed again only when the file changed (it is replaced, never edited in place)."""
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            if self._cache is not None and self._cache[0] == stamp:
                return self._cache[1]
            raw = store.read(self.path)
        except FileNotFoundError:
            return ()
        except OSError as e:
            raise StateError(f"{self.path}: cannot read the reservations: {e.strerror}") from None
        try:
            data = json.loads(raw.decode("utf-8"))
            if data.get("version") != VERSION:
                raise ValueError(f"version {data.get('version')!r}, expected {VERSION}")
            found = tuple(Reservation.from_json(r) for r in data["reservations"])
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise StateError(
                f"{self.path}: corrupt reservations ({e}); move it aside and make them again "
                "with 'gpu-alloc reserve'"
            ) from None
        self._cache = (stamp, found)
        return found

    @contextlib.contextmanager
    def transaction(self) -> Iterator[list[Reservation]]:
        """Under the ledger lock: the caller edits the list; a change is written."""
        with self.ledger.locked():
            before = list(self.read())
            box = list(before)
            yield box
            if box != before:
                self._write(box)

    def _write(self, reservations: list[Reservation]) -> None:
        body = {"version": VERSION, "reservations": [r.to_json() for r in reservations]}
        data = json.dumps(body, indent=1, sort_keys=True).encode()
        try:
            store.replace(self.path, data, mode=0o644)  # no secret in it
        except OSError as e:
            raise StateError(f"{self.path}: cannot write the reservations: {e.strerror}") from None
