"""One way to keep a file under the state directory: lock it, replace it, read it.

Every store there (the ledger and its journals, GPU health, activity, the audit trail)
and the plugin's in-flight board use these helpers, and a new small store should too:

- ``Lock(path, timeout)``, then ``with lock.held() as fd:``: an exclusive flock on
  ``path`` (created 0600 with its directory, 0700, when missing) through portalocker;
  ``held(shared=True)`` takes a shared one.  Threads of one process queue on the
  instance's thread lock (shared holds too); other processes are polled every `POLL`
  seconds (portalocker's own 0.25 s poll, not the work, would set the pace under
  contention).  A lock not free within the timeout raises `LockTimeout`, a
  `StateError`, which the service already turns into a refusal; one that cannot be
  opened or taken at all raises `StateError`.  The file is opened for each hold, so an
  operator may remove it; ``keep_open=True`` keeps one descriptor (opened again in a
  forked child, or once the file was replaced) for a store that is its own lock file
  and reads and writes through ``fd``.
- ``replace(path, data, mode=0o600, sync=True)``: write a temp file beside ``path``
  (``.NAME.*.tmp``, never read as a store), fsync it unless ``sync`` is False, and rename
  it over ``path``.  A process killed at any instant leaves the old file or the new one,
  never half of one.  The directory is not fsync'd: a rename lost to a power cut leaves
  the previous file, which each store's own rules account for.  An error raises the
  `OSError` with the temp file removed; the store says in its own words what failed.
- ``read(path)``: a file's bytes by bare system calls (a file object costs more than the
  read of a small file); `OSError` as `open` raises it.

The lock is an advisory flock: every writer of a store takes it; a reader without it
relies on `replace` being atomic (or, like the in-flight board's, takes what it reads
as a hint).  A new store, say ``state_dir/example.json``::

    lock = store.Lock(state_dir / "example.lock", timeout=5.0)
    with lock.held():
        data = json.loads(store.read(path))  # FileNotFoundError: none yet
        ...
        store.replace(path, json.dumps(data).encode())
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import portalocker

from allocator.core.leases.leases import StateError

__all__ = ["POLL", "Lock", "LockTimeout", "read", "replace"]

POLL = 0.003  # seconds between tries for a lock another process holds
_EXCLUSIVE = portalocker.LockFlags.EXCLUSIVE | portalocker.LockFlags.NON_BLOCKING
_SHARED = portalocker.LockFlags.SHARED | portalocker.LockFlags.NON_BLOCKING


class LockTimeout(StateError):
    """A store's lock was not free in time."""


class Lock:
    """The lock on the file ``path``, held with `held`; one instance per store and process."""

    def __init__(self, path: str | os.PathLike[str], timeout: float, *, keep_open: bool = False):
        self.path = Path(path)
        self.timeout = timeout
        self.keep_open = keep_open
        self._threads = threading.Lock()
        self._fd: int | None = None  # with keep_open: the descriptor, and the pid that opened it
        self._pid = 0

    @contextlib.contextmanager
    def held(self, timeout: float | None = None, *, shared: bool = False) -> Iterator[int]:
        """Hold the lock (``timeout`` seconds at most to get it, 0: only if free now) and
        yield the lock file's descriptor."""
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        if not self._threads.acquire(timeout > 0, timeout if timeout > 0 else -1):
            raise self._late(timeout)
        try:
            fd = self._open()
            try:
                self._take(fd, _SHARED if shared else _EXCLUSIVE, deadline, timeout)
                try:
                    yield fd
                finally:  # unlocked before closed: a child forked meanwhile shares the fd
                    portalocker.unlock(fd)
            finally:
                if not self.keep_open:
                    os.close(fd)
        finally:
            self._threads.release()

    def _take(self, fd: int, flags: portalocker.LockFlags, deadline: float, timeout: float) -> None:
        while True:
            try:
                portalocker.lock(fd, flags)
                return
            except portalocker.LockException as e:
                if not _held(e):
                    why = getattr(e.__cause__, "strerror", None) or e
                    raise StateError(f"{self.path}: cannot lock: {why}") from None
            if time.monotonic() >= deadline:
                raise self._late(timeout)
            time.sleep(POLL)

    def _open(self) -> int:
        """The lock file's descriptor: a new one, or with ``keep_open`` the kept one while
        it is still this process's and still names ``path`` (flock is per open file: one
        shared with a parent would not exclude it, one on a removed file excludes no one)."""
        if self.keep_open:
            fd, self._fd = self._fd, None
            if fd is not None:
                if self._pid == os.getpid() and _same_file(fd, self.path):
                    self._fd = fd
                    return fd
                with contextlib.suppress(OSError):
                    os.close(fd)
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
        try:
            try:
                fd = os.open(self.path, flags, 0o600)
            except FileNotFoundError:
                self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                fd = os.open(self.path, flags, 0o600)
        except OSError as e:
            raise StateError(f"{self.path}: cannot open the lock: {e.strerror}") from None
        if self.keep_open:
            self._fd, self._pid = fd, os.getpid()
        return fd

    def _late(self, timeout: float) -> LockTimeout:
        return LockTimeout(
            f"{self.path}: lock not acquired within {timeout:g}s "
            "(another gpu-alloc process holds it); try again"
        )


def replace(path: Path, data: bytes, *, mode: int = 0o600, sync: bool = True) -> None:
    """Replace the file ``path`` by one holding ``data``, atomically (see the module)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # 0600
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if mode != 0o600:
                os.fchmod(fd, mode)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read(path: Path) -> bytes:
    """The bytes of the file ``path``."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except OSError:
        return False


def _held(e: portalocker.LockException) -> bool:
    """Another holds the lock (portalocker 4 says AlreadyLocked; older ones wrap EAGAIN)."""
    cause = e.__cause__
    return isinstance(e, portalocker.AlreadyLocked) or (
        isinstance(cause, OSError) and cause.errno in (errno.EAGAIN, errno.EACCES)
    )
