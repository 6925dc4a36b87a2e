"""Which daemon.json the running dockerd reads, from its own command line.

gpu-alloc stamps its view of the Engine with ``engine.daemon_json``, so an edit there
(a default runtime of nvidia, say) counts at the next decision.  A dockerd started with
``--config-file`` elsewhere reads another file, and an edit to it counts only when
gpu-alloc next asks the Engine; `gpu-alloc doctor` names the file so the config can say
it.  The dockerd is the one behind the Engine's socket (its peer credentials), or, when a
socket activated by systemd names systemd instead, the only dockerd on the host.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

DEFAULT = "/etc/docker/daemon.json"  # rootful dockerd's, without --config-file
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def config_file(engine_socket: str, proc: str = "/proc") -> tuple[str, Path] | None:
    """(the path as dockerd names it, a path to the same file from here: through the
    process's root, which differs in a chroot), or None when no dockerd can be told."""
    pid = _dockerd(engine_socket, proc)
    if pid is None:
        return None
    try:
        args = [
            a.decode(errors="replace")
            for a in (Path(proc) / str(pid) / "cmdline").read_bytes().split(b"\0")
        ]
    except OSError:
        return None
    named = _flag(args, "--config-file") or DEFAULT
    if not named.startswith("/"):
        try:
            named = os.path.join(os.readlink(Path(proc) / str(pid) / "cwd"), named)
        except OSError:  # another user's process: its cwd is not ours to read
            return None
    return named, Path(proc) / str(pid) / "root" / named.lstrip("/")


def serving(engine_socket: str, proc: str = "/proc") -> int | None:
    """The process whose filesystem view is the Engine's: the dockerd behind the socket,
    else (a socket systemd holds, a test's stand-in Engine) the socket's own peer."""
    return _dockerd(engine_socket, proc) or _peer(engine_socket)


def _dockerd(engine_socket: str, proc: str) -> int | None:
    pid = _peer(engine_socket)
    if pid is not None and _comm(proc, pid) == "dockerd":
        return pid
    try:
        pids = [int(e.name) for e in os.scandir(proc) if e.name.isdigit()]
    except OSError:
        return None
    found = [p for p in pids if _comm(proc, p) == "dockerd"]
    return found[0] if len(found) == 1 else None


def _peer(path: str) -> int | None:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2.0)
            s.connect(path)
            pid, _, _ = _CRED.unpack(
                s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size)
            )
    except OSError:
        return None
    return pid or None


def _comm(proc: str, pid: int) -> str:
    try:
        return (Path(proc) / str(pid) / "comm").read_text().strip()
    except OSError:
        return ""


def _flag(args: list[str], name: str) -> str | None:
    """A flag's value as Go's flag package reads it: ``--name=v`` or ``--name v``; the
    last one given wins."""
    value = None
    for i, arg in enumerate(args):
        if arg.startswith(name + "="):
            value = arg[len(name) + 1 :]
        elif arg == name and i + 1 < len(args):
            value = args[i + 1]
    return value


@dataclass(frozen=True)
class Running:
    """The dockerd behind the Engine's socket as doctor needs it: its flags and PATH."""

    pid: int
    args: tuple[str, ...]
    path: str | None  # PATH from its environment; None when not ours to read
    root: Path  # its root directory, through /proc (a chroot's differs from ours)

    def flags(self, name: str) -> list[str]:
        """Every value of a repeatable flag (``--authorization-plugin``), in order."""
        values = []
        for i, arg in enumerate(self.args):
            if arg.startswith(name + "="):
                values.append(arg[len(name) + 1 :])
            elif arg == name and i + 1 < len(self.args):
                values.append(self.args[i + 1])
        return values

    def which(self, program: str) -> str | None:
        """Where dockerd finds ``program`` on its own PATH (in its own root), as it names it."""
        for folder in (self.path or "").split(":"):
            if not folder.startswith("/"):
                continue
            here = self.root / folder.lstrip("/") / program
            if here.is_file() and os.access(here, os.X_OK):
                return os.path.join(folder, program)
        return None


Clocks = Callable[[], tuple[float, float]]  # (epoch seconds, CLOCK_BOOTTIME seconds) at once


def _clocks() -> tuple[float, float]:
    return time.time(), time.clock_gettime(time.CLOCK_BOOTTIME)


# A start reads up to one tick early (truncated), and the two clocks are read microseconds
# apart: a file stamped within two ticks (20 ms at the usual 100 Hz) after a start is taken
# as written before it.  No edit of daemon.json by hand follows dockerd's start that closely.
SLACK = 2 / os.sysconf("SC_CLK_TCK")


def started(pid: int, proc: str = "/proc", clocks: Clocks | None = None) -> float | None:
    """When process ``pid`` started, in seconds since the epoch (None: not readable):
    a setting dockerd reads only at its start counts from then.

    The kernel keeps a start as clock ticks since boot (CLOCK_BOOTTIME); the boot is
    placed on the epoch by reading both clocks at one moment, not by /proc/stat's btime,
    which drops the boot's fraction of a second and so moves every start up to a second
    early.  What is left is the tick's truncation: a start reads up to one tick early
    (``after_start`` allows for it)."""
    try:
        stat = (Path(proc) / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after the command's name
    try:
        ticks = int(fields[19])  # field 22: starttime
    except (IndexError, ValueError):
        return None
    now, since_boot = (clocks or _clocks)()
    return now - since_boot + ticks / os.sysconf("SC_CLK_TCK")


def after_start(written: float, born: float) -> bool:
    """Whether a file stamped ``written`` (st_mtime) changed after a process that started
    at ``born`` (``started``) read it, beyond the start's precision."""
    return written > born + SLACK


def running(engine_socket: str, proc: str = "/proc") -> Running | None:
    """The dockerd behind ``engine_socket``, or None when none can be told or read."""
    pid = _dockerd(engine_socket, proc)
    if pid is None:
        return None
    base = Path(proc) / str(pid)
    try:
        args = tuple(
            a.decode(errors="replace") for a in (base / "cmdline").read_bytes().split(b"\0")
        )
    except OSError:
        return None
    try:
        env = (base / "environ").read_bytes().split(b"\0")
        path = next((e[5:].decode(errors="replace") for e in env if e.startswith(b"PATH=")), "")
    except OSError:
        path = None
    return Running(pid, args, path, base / "root")
