"""The in-flight registry file: the `allocator.core.leases.inflight.Board` every plugin worker
shares.

AuthZReq and AuthZRes of one call may reach different worker processes, so what is in
flight lives in a small file, locked on its own (never the ledger's lock: a start must
not wait on a lease transaction, nor a lease on a rename).  The file is runtime state,
not the ledger: it lives beside the plugin's socket (``/run/docker/plugins``, a tmpfs
the plugin's unit may write), named so that dockerd, which reads ``*.sock``, ``*.spec``
and ``*.json`` there, never takes it for a plugin.  So a full state disk refuses GPU
grants but never a rename, a removal or a named create of a container that touches no
GPU.

Rules
-----
1. Decisions are made under the lock (a `store.Lock` on the file itself, kept open),
   from the file as it is then.  Reads without the lock are hints only (is anything in
   the way yet? did anything change?), and a torn one counts as "yes".
2. The file is rewritten in place, with no fsync: the board holds seconds of calls, and
   after a crash its entries have ended or expire (`inflight.TTL`).  So a begin or an
   end is a small write to a tmpfs, and only the start and removal routes make one.
3. A file that cannot be parsed under the lock is an empty board (it is ours alone,
   rewritten whole by every writer).
4. A call that conflicts waits, polling without the lock, for at most `inflight.WAIT`.
5. An end may be asked not to wait at all (`end(key, wait=False)`): an event loop ends a
   call only when the lock is free at once, and otherwise hands the end to a thread.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from allocator.core.leases import inflight
from allocator.core.leases.inflight import Board, Entry, Hold
from allocator.core.leases.leases import StateError
from allocator.host import store
from allocator.host.config import Config

BOARD_FILE = "gpu-alloc.inflight"
POLL = 0.005  # seconds between looks at the board while waiting


def runtime_dir(config: Config) -> str:
    """Where the registry lives: beside the plugin's socket (runtime state, not the ledger)."""
    return os.path.dirname(os.path.abspath(config.plugin.socket))


class Registry:
    def __init__(self, directory: str | os.PathLike[str], lock_timeout: float = 5.0):
        self.dir = Path(directory)
        self.path = self.dir / BOARD_FILE
        self.lock = store.Lock(self.path, lock_timeout, keep_open=True)

    def read(self) -> Board | None:
        """The board without the lock; None when it cannot be read whole just now."""
        try:
            raw = store.read(self.path)
        except FileNotFoundError:
            return Board()
        except OSError:
            return None
        try:
            board = Board.from_json(json.loads(raw)) if raw else Board()
        except ValueError:
            return None
        return board.keeping(_alive)

    def generation(self) -> int:
        board = self.read()
        return -1 if board is None else board.generation

    def begin(
        self,
        key: str,
        hold: Hold,
        wait: float = inflight.WAIT,
        looked_up: Callable[[Entry], bool] | None = None,
    ) -> tuple[str | None, int]:
        """Put ``hold`` in flight, once nothing it conflicts with is.

        ``looked_up`` asks, without the lock, whether dockerd has already looked up the
        reference of a restart in the way (`inflight.signalled`); such a restart no longer
        holds ``hold`` off.  Returns (why it is refused, or None; the generation just
        before it was added).
        """
        deadline = time.monotonic() + wait
        done: set[Entry] = set()
        while True:
            now = time.time()
            hint = self.read()
            if hint is not None and looked_up is not None:
                done.update(e for e in _waited_on(hint, hold, now, done) if looked_up(e))
            if (
                hint is None
                or hint.blocker(hold, now, done) is None
                or time.monotonic() >= deadline
            ):
                with self.lock.held() as fd:
                    board = _board(fd)
                    blocker = board.blocker(hold, now, done)
                    if blocker is None:
                        entry = Entry(key, hold, now + inflight.TTL, os.getpid())
                        _write(fd, board.with_entry(entry, now))
                        return None, board.generation
                    if time.monotonic() >= deadline:
                        return inflight.clash_text(hold, blocker.hold), board.generation
            time.sleep(POLL)

    def end(self, key: str, wait: bool = True) -> bool:
        """The call ``key`` is over (its AuthZRes came, or it was refused after all).

        Without ``wait``, only if the lock is free at once: False when it was not."""
        hint = self.read()
        if hint is not None and all(e.key != key for e in hint.entries):
            return True
        try:
            with self.lock.held(None if wait else 0.0) as fd:
                board = _board(fd).without(key, time.time())
                if board is not None:
                    _write(fd, board)
        except store.LockTimeout:
            if wait:
                raise
            return False
        return True

    def clear(self) -> None:
        """dockerd (re)activated the plugin: the calls in flight were the previous
        dockerd's, and their AuthZRes will never come."""
        with self.lock.held() as fd:
            board = _board(fd)
            if board.entries:
                _write(fd, inflight.Board(board.generation + 1))


def _board(fd: int) -> Board:
    try:
        raw = os.pread(fd, os.fstat(fd).st_size, 0)
        board = Board.from_json(json.loads(raw)) if raw else Board()
    except (OSError, ValueError):
        return Board()
    return board.keeping(_alive)


def _waited_on(board: Board, hold: Hold, now: float, done: set[Entry]) -> list[Entry]:
    """The restarts in the way whose look-up dockerd may have shown since (a kill event)."""
    return [
        e
        for e in board.entries
        if e not in done
        and e.expires > now
        and inflight.signalled(e.hold) is not None
        and inflight.clash(hold, e.hold)
    ]


def _alive(pid: int) -> bool:
    """Is the worker that wrote an entry still there (0: an entry from before pids)?"""
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _write(fd: int, board: Board) -> None:
    data = json.dumps(board.to_json(), separators=(",", ":")).encode()
    try:
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    except OSError as e:
        raise StateError(f"in-flight registry: cannot write: {e.strerror}") from None
