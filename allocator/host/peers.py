"""The process at the other end of a unix socket, as the kernel names it.

``SO_PEERCRED`` gives the pid, uid and gid of the process that connect()ed, as they
were then.  A pid alone is a race: that process may exit and its pid go to another
one before anyone reads ``/proc/<pid>``.  So each connection also holds a pidfd for
that very process (``SO_PEERPIDFD``, Linux 6.5; else ``pidfd_open`` at once, Linux
5.3): whatever is read from ``/proc/<pid>`` while it still answers is that process's.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import threading
from dataclasses import dataclass, field

from allocator.core.judging.owners import Asker

_CRED = struct.Struct("3i")
SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)


@dataclass(eq=False)
class Peer:
    """One connection's client: who it was at connect time, and a handle on it."""

    pid: int
    uid: int
    gid: int
    pidfd: int | None = None  # None: the process was gone before it could be held
    # Whose the connection is, decided once (allocator/host/owners.py).
    asker: Asker | None = field(default=None, repr=False)
    # A closing connection never frees the fd under a check in flight (the number could
    # be another connection's pidfd by then).
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def alive(self) -> bool:
        """Whether the process that connected still runs (so its pid is still its own)."""
        with self._lock:
            if self.pidfd is None:
                return False
            try:
                signal.pidfd_send_signal(self.pidfd, 0)
            except PermissionError:  # it runs, as someone this process may not signal
                return True
            except OSError:
                return False
            return True

    def close(self) -> None:
        with self._lock:
            fd, self.pidfd = self.pidfd, None
        if fd is not None:
            os.close(fd)


def of(sock: socket.socket | None) -> Peer | None:
    """The kernel's word on who connected to ``sock`` (None: not a unix socket)."""
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    try:
        pid, uid, gid = _CRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size)
        )
    except OSError:
        return None
    return Peer(pid, uid, gid, _pidfd(sock, pid))


def _pidfd(sock: socket.socket, pid: int) -> int | None:
    try:
        return sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
    except OSError:
        pass
    if pid <= 0:  # in a pid namespace this one cannot see
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None
