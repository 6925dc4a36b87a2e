"""One server per unix socket: a second copy refuses instead of taking the socket over.

Binding a unix socket means removing the file first, and both the shim and gunicorn
(which binds the plugin's socket itself) do, then unlink it again on exit.  A second
copy started while one runs would so leave the live one deaf, with systemd none the
wiser.  `claim` is called before anything binds: it takes an exclusive lock on
``SOCKET.lock`` for the life of the process (two copies starting at the same moment
cannot both pass), refuses if the socket answers a connect (a copy that does not take
the lock, an older version), and only then removes a stale socket file.

The lock file is never removed: removing it would let a third copy lock a new file
while the second still holds the old one.  It is no store's lock (`store.Lock`): it is
never waited for, is held for the life of the process rather than around a change,
and lives beside the socket, not under the state directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import stat
import time

CONNECT_TIMEOUT = 1.0


class AlreadyRunning(OSError):
    """Another server holds or answers on the socket."""


class Claim:
    """The lock that makes this process the one server on ``path``; held until closed.

    A plain flock on a close-on-exec descriptor: the kernel drops it when the process
    dies, however it dies, so a crash never leaves a copy locked out.
    """

    def __init__(self, path: str, fd: int):
        self.path = path
        self._fd: int | None = fd

    def close(self) -> None:
        """Close this process's descriptor.  In a forked child (a gunicorn worker) that
        leaves the parent's lock in place: flock holds while any descriptor is open."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def claim(path: str, what: str) -> Claim:
    """Become the one ``what`` serving on ``path``, or raise `AlreadyRunning`.

    Returns with the path free to bind: a socket file nobody answers on is removed;
    anything else at the path that is not a socket is an error, never removed.
    """
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    held = Claim(path, fd)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AlreadyRunning(f"{what} is already running on {path}") from None
        if answers(path):
            raise AlreadyRunning(f"{what} is already running on {path}")
        remove_stale(path)
    except BaseException:
        held.close()
        raise
    return held


def answers(path: str) -> bool:
    """Does something accept connections on the unix socket ``path``?"""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(CONNECT_TIMEOUT)
        try:
            s.connect(path)
        except TimeoutError:
            return True  # a full backlog is a live server
        except OSError:
            return False
        return True


def wait_until_answers(path: str, timeout: float) -> bool:
    """For systemd's ExecStartPost: the unit counts as started once the socket answers."""
    deadline = time.monotonic() + timeout
    while not answers(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def remove_stale(path: str) -> None:
    """Remove a socket file nothing listens on; refuse to remove anything else."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise FileExistsError(f"{path} exists and is not a socket; move it away")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
