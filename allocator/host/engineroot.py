"""dockerd's filesystem as dockerd sees it: through ``/proc/<pid>/root`` and its cwd.

dockerd resolves bind sources, device paths and local volumes' devices in its own mount
namespace.  gpu-alloc may run in another (a unit's private /tmp and /home, an Engine in
a chroot), where the same path names another file or none.  So the questions access asks
of a path are asked here, inside dockerd's root; where that root cannot be read, a path
cannot be judged and `Unresolvable` says why (binds and devices are then refused).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from allocator.core.access import inroot
from allocator.core.access.facts import Unresolvable
from allocator.host import dockerd


class EngineRoot:
    """The root of the process serving the Engine's socket; its pid is found again when
    that process is gone (dockerd restarted) or the pid names another process."""

    def __init__(self, engine_socket: str, proc: str = "/proc"):
        self.socket = engine_socket
        self.proc = proc
        self._known: tuple[int, str] | None = None  # pid, its start time

    def pid(self) -> int:
        known = self._known
        if known is not None and _start_time(self.proc, known[0]) == known[1]:
            return known[0]
        pid = dockerd.serving(self.socket, self.proc)
        started = _start_time(self.proc, pid) if pid else ""
        if not pid or not started:
            raise Unresolvable(
                f"no dockerd process answers on {self.socket} that this process can see (a "
                "pid namespace of its own hides it), so paths cannot be resolved as it "
                "resolves them"
            )
        self._known = (pid, started)
        return pid

    def base(self) -> str:
        """``/proc/<pid>/root``, once it is known to be readable here."""
        base = f"{self.proc}/{self.pid()}/root"
        try:
            os.stat(base)
        except OSError as e:
            raise Unresolvable(
                f"dockerd's root ({base}) cannot be read here ({e.strerror}); gpu-alloc needs "
                "it to judge bind and device paths (CAP_SYS_PTRACE, see the shipped units)"
            ) from None
        return base

    def resolve(self, path: str) -> str:
        base = self.base()
        cwd = "/" if path.startswith("/") else self._cwd(base)

        def readlink(inside: str) -> str | None:
            try:
                return os.readlink(base + inside)
            except OSError:  # no link, or nothing there: kept as spelled
                return None

        return inroot.resolve(path, readlink, cwd)

    def lstat(self, path: str) -> os.stat_result:
        """The node at ``path`` inside dockerd's root, its links followed there."""
        return os.lstat(self.base() + self.resolve(path))

    def walk(self, top: str) -> Iterator[str]:
        base = self.base()
        for root, _dirs, files in os.walk(base + self.resolve(top)):
            for f in files:
                yield os.path.join(root, f)[len(base) :]

    def mountinfo(self) -> str:
        """dockerd's mount table; the kernel names mount points from dockerd's root."""
        return f"{self.proc}/{self.pid()}/mountinfo"

    def _cwd(self, base: str) -> str:
        """dockerd's working directory inside its root (``/`` for a dockerd systemd or
        chroot started), against which it resolves a relative path."""
        cwd = os.path.dirname(base) + "/cwd"
        try:
            if os.path.samefile(cwd, base):
                return "/"
            here, root = os.readlink(cwd), os.readlink(base)
        except OSError as e:
            why = f"dockerd's working directory cannot be read ({e.strerror})"
            raise Unresolvable(why) from None
        inside = os.path.relpath(here, root)
        if inside.startswith(".."):
            raise Unresolvable("dockerd's working directory lies outside its root")
        return "/" + inside


def _start_time(proc: str, pid: int) -> str:
    """Field 22 of /proc/<pid>/stat: with the pid, it names one process for good."""
    try:
        with open(f"{proc}/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return ""
