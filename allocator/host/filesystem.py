"""This host's answers to the filesystem questions effective access asks.

The core (allocator.core.access.access) decides from `Node`s and resolved paths; this
is the one place that stats, resolves and walks for it, in dockerd's mount namespace
(allocator.host.engineroot) wherever one is given.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass, replace

from allocator.core.access import inroot
from allocator.core.access.access_devices import DRM_MAJOR
from allocator.core.access.facts import Node, Unresolvable
from allocator.core.access.mounts import Mount
from allocator.core.access.power_grants import NO_GRANTS, PowerGrants
from allocator.core.judging.socket_binds import NOBODY_BINDS, Binders
from allocator.host import apparmor
from allocator.host.engineroot import EngineRoot
from allocator.host.owners import groups_of

DEFAULT_PROTECTED = (
    "/dev",
    "/sys",
    "/proc",
    "/etc/docker",
    "/run/docker",
    "/run/containerd",
    "/var/lib/docker",
    "/var/lib/gpu-alloc",
)


@dataclass(frozen=True)
class Host:
    """Filesystem facts of this host; ``protected`` are the paths no bind may reach.

    Paths are asked of ``engine``, dockerd's root, when given (gpu-alloc's services
    always give it); without one, of this process's own namespace.
    """

    protected: tuple[str, ...] = DEFAULT_PROTECTED
    sysfs: str = "/sys"
    proc_devices: str = "/proc/devices"
    mountinfo: str = "/proc/self/mountinfo"
    engine: EngineRoot | None = None
    # Where shared GPUs' MPS directories are (protected too): a bind of exactly one GPU's
    # pipe or shm directory reaches that GPU (allocator/core/rules/sharing.py).
    mps_dir: str = ""
    # The Engine's API sockets (protected too), and who the policy lets bind one
    # (allocator/core/judging/socket_binds.py).
    engine_sockets: tuple[str, ...] = ()
    binders: Binders = NOBODY_BINDS
    # policy.powers: who holds which power outside the allow-list (core/access/powers.py)
    power_grants: PowerGrants = NO_GRANTS

    def may_bind_engine(self, user: str) -> bool:
        """``user`` is one ``policy.engine_socket_binds`` names, by name or by a group NSS
        puts them in now."""
        if not self.binders or not user:
            return False
        return self.binders.allow(user, () if user in self.binders.users else groups_of(user))

    def may_use_power(self, user: str, power: str) -> bool:
        """``policy.powers`` grants ``power`` to ``user``, by name or by a group NSS puts
        them in now."""
        if not self.power_grants or not user:
            return False
        return self.power_grants.allow(power, user, groups_of(user))

    def apparmor_loaded(self) -> bool:
        return apparmor.loaded(self.sysfs)

    def resolve(self, path: str) -> str:
        if self.engine:
            return self.engine.resolve(path)
        return inroot.resolve(path, _readlink, os.getcwd())

    def node(self, path: str) -> Node | None:
        try:
            st = self.engine.lstat(path) if self.engine else os.stat(path)
        except (OSError, Unresolvable):
            return None
        if stat.S_ISCHR(st.st_mode):
            return Node("chr", os.major(st.st_rdev), os.minor(st.st_rdev))
        return Node("dir" if stat.S_ISDIR(st.st_mode) else "other")

    def walk(self, top: str) -> Iterable[str]:
        if self.engine:
            yield from self.engine.walk(top)
            return
        for root, _dirs, files in os.walk(top):
            for f in files:
                yield os.path.join(root, f)

    def drm_bus_id(self, minor: int) -> str | None:
        link = os.path.join(self.sysfs, "dev/char", f"{DRM_MAJOR}:{minor}", "device")
        try:
            return os.path.basename(os.path.realpath(link, strict=True))
        except OSError:
            return None

    def dynamic_majors(self) -> frozenset[int]:
        return _dynamic_majors(self.proc_devices)

    def mounts(self) -> Iterable[Mount]:
        """The mount table (fields 5 and the type after ``-`` of mountinfo), dockerd's
        where given."""
        try:
            with open(self.engine.mountinfo() if self.engine else self.mountinfo) as f:
                lines = f.read().splitlines()
        except (OSError, Unresolvable):
            return ()
        table = []
        for line in lines:
            left, _, right = line.partition(" - ")
            fields, kind = left.split(), right.split()
            if len(fields) >= 5 and kind:
                table.append(Mount(_unescape(fields[4]), kind[0]))
        return table

    def with_engine_sockets(self, *paths: str) -> Host:
        """The host with these Engine API sockets protected, and known as such."""
        return replace(self.with_protected(*paths), engine_sockets=paths)

    def with_protected(self, *paths: str) -> Host:
        merged = tuple(dict.fromkeys((*self.protected, *(p for p in paths if p))))
        return replace(self, protected=merged)

    def with_resolved(self) -> Host:
        """The host with each protected path (the Engine's sockets among them) as written
        and as it resolves in dockerd's root now, and the MPS directory as it resolves.

        A bind source is judged by where it resolves; a protected path given through a
        link (``/var/run`` is ``/run`` on Debian) must be known by its target too, or a
        bind of the target reaches it unseen.  A path that cannot be resolved is kept as
        written: the binds below it cannot be resolved either, and are refused."""
        mps_dir = self.mps_dir
        if mps_dir:
            with suppress(Unresolvable):
                mps_dir = self.resolve(mps_dir)
        return replace(
            self,
            protected=self._and_resolved(self.protected),
            engine_sockets=self._and_resolved(self.engine_sockets),
            mps_dir=mps_dir,
        )

    def _and_resolved(self, paths: tuple[str, ...]) -> tuple[str, ...]:
        found = [*paths]
        for path in paths:
            with suppress(Unresolvable):
                found.append(self.resolve(path))
        return tuple(dict.fromkeys(found))


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _dynamic_majors(proc_devices: str) -> frozenset[int]:
    """nvidia-uvm and nvidia-caps get dynamic majors; /proc/devices names them.  Read at
    every ask (only a create with devices or cgroup rules asks): a module loaded after
    gpu-alloc started, or loaded again, has a major of its own."""
    try:
        with open(proc_devices) as f:
            lines = f.read().split("Block devices:")[0].splitlines()
    except OSError:
        return frozenset()
    return frozenset(
        int(n)
        for n, _, name in (ln.strip().partition(" ") for ln in lines)
        if n.isdigit() and name.startswith("nvidia")
    )


# dockerd's flags and daemon.json keys that name the paths it keeps its control files in.
_ENGINE_FLAGS = {
    "--data-root": "data-root",
    "--graph": "data-root",
    "-g": "data-root",
    "--exec-root": "exec-root",
    "--containerd": "containerd",
    "--pidfile": "pidfile",
    "-p": "pidfile",
    "--config-file": "config-file",
}
_PATH_KEYS = ("data-root", "graph", "exec-root", "pidfile")


def engine_paths(info: dict, daemon_json: str, socket: str, proc: str = "/proc") -> tuple[str, ...]:
    """The paths this Engine keeps its state and sockets in, from what it says itself.

    ``GET /info`` names the data root; its command line (read from /proc for the process
    listening on ``socket``, when readable) and daemon.json name the exec root and
    containerd's socket.  Each path is given as named and as it resolves.  So are the
    Engine's API sockets (``socket``, each unix ``-H``/``hosts`` it listens on, else its
    default): a container given one calls dockerd where the plugin cannot tell who asks,
    which turns a user of the shim alone into one of the real socket.
    """
    argv = _listener_cmdline(socket, proc)
    flags = _cmdline_flags(argv)
    conf = _read_json(flags.get("config-file") or daemon_json)
    found = [*api_sockets(daemon_json, socket, proc, argv)]
    found.append(str(info.get("DockerRootDir") or ""))
    found += [str(conf.get(k) or "") for k in _PATH_KEYS]
    found += [flags.get(k, "") for k in ("data-root", "exec-root", "pidfile")]
    for sock in (str(conf.get("containerd") or ""), flags.get("containerd", "")):
        found.append(os.path.dirname(sock) if sock else "")
    absolute = [p for p in found if p.startswith("/")]
    return tuple(dict.fromkeys([*absolute, *map(os.path.realpath, absolute)]))


DEFAULT_SOCKET = "/var/run/docker.sock"  # dockerd's unix listener without -H or hosts


def api_sockets(
    daemon_json: str, socket: str, proc: str = "/proc", argv: list[str] | None = None
) -> tuple[str, ...]:
    """The unix sockets this Engine serves its API on (``socket``, each ``-H``/``hosts``,
    else its default), each as named and as it resolves."""
    argv = _listener_cmdline(socket, proc) if argv is None else argv
    conf = _read_json(_cmdline_flags(argv).get("config-file") or daemon_json)
    named = [p for p in (socket, *_api_sockets(argv, conf)) if p.startswith("/")]
    return tuple(dict.fromkeys([*named, *map(os.path.realpath, named)]))


def _api_sockets(argv: list[str], conf: dict) -> list[str]:
    """The unix sockets dockerd serves its API on: every ``-H``/``--host`` of its command
    line and daemon.json's ``hosts``; its default when it names none (``fd://`` is
    systemd's socket, by convention that same path)."""
    hosts = [str(h) for h in conf.get("hosts") or () if isinstance(h, str)]
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in ("-H", "--host"):
            hosts.append(value if eq else argv[i + 1] if i + 1 < len(argv) else "")
        elif arg.startswith("-H") and len(arg) > 2:
            hosts.append(arg[2:])
    named = [h.removeprefix("unix://") for h in hosts if h.startswith("unix://")]
    if not all(named) or "fd://" in hosts or not named:  # "unix://" alone is the default
        named.append(DEFAULT_SOCKET)
    return [p for p in named if p]


def _read_json(path: str) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _cmdline_flags(argv: list[str]) -> dict[str, str]:
    flags: dict[str, str] = {}
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in _ENGINE_FLAGS:
            if not eq:
                value = argv[i + 1] if i + 1 < len(argv) else ""
            flags[_ENGINE_FLAGS[name]] = value
    return flags


def _listener_cmdline(socket: str, proc: str) -> list[str]:
    """The argv of the process that holds the listening unix socket at ``socket``."""
    try:
        with open(os.path.join(proc, "net/unix")) as f:
            rows = [ln.split() for ln in f.read().splitlines()[1:]]
    except OSError:
        return []
    inodes = {r[6] for r in rows if len(r) >= 8 and r[7] == socket}
    if not inodes:
        return []
    wanted = {f"socket:[{i}]" for i in inodes}
    pids = [p for p in _listdir(proc) if p.isdigit()]
    # Processes named dockerd first: reading every fd of every process is the slow part.
    pids.sort(key=lambda pid: "dockerd" not in _read(os.path.join(proc, pid, "comm")))
    for pid in pids:
        fd_dir = os.path.join(proc, pid, "fd")
        for fd in _listdir(fd_dir):
            try:
                if os.readlink(os.path.join(fd_dir, fd)) in wanted:
                    with open(os.path.join(proc, pid, "cmdline"), "rb") as f:
                        return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
            except OSError:
                continue
    return []


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _readlink(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:  # no link, or nothing there: kept as spelled
        return None
