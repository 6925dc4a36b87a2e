"""The ledger file: `allocator.core.leases.State` kept in one JSON file under ``state_dir``.

Rules
-----
1. Every change happens under an exclusive file lock (portalocker) taken with
   a deadline; a lock we cannot get in time is an error, never a guess.
2. The file is replaced atomically (write a temp file, fsync it, rename it over the
   old one), so a process killed at any instant leaves the old or the new state,
   never half of one.
3. A file we cannot read, or one written by a newer schema, stops allocation:
   `StateError` names the file and the repair command.
4. Tokens are stored only as SHA-256 hashes: reading the file (or a container's
   labels) never gives anyone a usable token.

`State` (the pure lease life) lives in allocator/core/leases.py; this is its file shell.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import portalocker

from allocator.core.leases import REPAIR_HINT, State, StateError

__all__ = ["Ledger", "State", "StateError", "now"]

STATE_FILE = "state.json"
LOCK_FILE = "lock"
LOCK_POLL = 0.003  # seconds between tries for a lock another process holds


class Ledger:
    """The state file and its lock.  One instance per process is enough."""

    def __init__(self, state_dir: str | os.PathLike[str], lock_timeout: float = 5.0):
        self.dir = Path(state_dir)
        self.path = self.dir / STATE_FILE
        self.lock_path = self.dir / LOCK_FILE
        self.lock_timeout = lock_timeout
        self._threads = threading.Lock()
        self._dir_ready = False

    def ensure_dir(self) -> None:
        if self._dir_ready:
            return
        try:
            self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as e:
            raise StateError(
                f"{self.dir}: cannot create the state directory: {e.strerror}"
            ) from None
        self._dir_ready = True

    def read(self) -> State:
        """A consistent snapshot without the lock (renames are atomic)."""
        return self._load()[0]

    def _load(self) -> tuple[State, bytes]:
        """The state and the bytes it was read from (an empty state's, with no file)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return State(), _EMPTY
        except OSError as e:
            raise StateError(f"{self.path}: cannot read: {e.strerror}") from None
        try:
            data = json.loads(raw.decode("utf-8"))
        except ValueError as e:  # UnicodeDecodeError is a ValueError too
            raise StateError(f"{self.path}: corrupt JSON ({e}); {REPAIR_HINT}") from None
        return State.from_json(data, str(self.path)), raw

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The exclusive lock: threads of this process queue, other processes poll briefly.

        portalocker's default poll is 0.25 s; under contention that, not the work, set
        the pace, so waiters poll every few milliseconds instead.
        """
        self.ensure_dir()
        deadline = time.monotonic() + self.lock_timeout
        if not self._threads.acquire(timeout=self.lock_timeout):
            raise self._timeout()
        try:
            lock = portalocker.Lock(
                str(self.lock_path),
                mode="a",
                timeout=max(0.0, deadline - time.monotonic()),
                check_interval=LOCK_POLL,
                flags=portalocker.LockFlags.EXCLUSIVE | portalocker.LockFlags.NON_BLOCKING,
            )
            try:
                lock.acquire()
            except portalocker.LockException:
                raise self._timeout() from None
            except OSError as e:
                raise StateError(f"{self.lock_path}: cannot open the lock: {e.strerror}") from None
            try:
                yield
            finally:
                lock.release()
        finally:
            self._threads.release()

    def _timeout(self) -> StateError:
        return StateError(
            f"{self.lock_path}: lock not acquired within {self.lock_timeout:g}s "
            "(another gpu-alloc process holds it); try again"
        )

    @contextlib.contextmanager
    def transaction(self) -> Iterator[State]:
        """Lock, read, let the caller change the state, write it back if it changed.

        "Changed" is decided on the encoded bytes against the file's own: one encoding
        per transaction, and none written when nothing changed.
        """
        with self.locked():
            state, raw = self._load()
            yield state
            data = _encode(state)
            if data != raw:
                self._write(data)

    def write(self, state: State) -> None:
        self._write(_encode(state))

    def _write(self, data: bytes) -> None:
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".state.", suffix=".tmp")  # 0600
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            # No fsync of the directory: a rename lost to a power cut leaves the previous
            # state, and the lease it lacks is adopted back from the container's labels.
            os.replace(tmp, self.path)
        except OSError as e:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            raise StateError(
                f"{self.path}: cannot write the state ({e.strerror}); the previous state is "
                "kept; free space or fix permissions on the state directory"
            ) from None


def _encode(state: State) -> bytes:
    # Compact: json's C encoder runs only without indent (indenting cost 0.6 ms a write).
    return json.dumps(state.to_json(), sort_keys=True, separators=(",", ":")).encode()


_EMPTY = _encode(State())


def now() -> float:
    return time.time()
