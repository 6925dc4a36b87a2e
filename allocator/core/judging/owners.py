"""Who is behind a shim connection: the person, not the uid a container runs as.

A process inside a container may run as any uid it likes (``--user 0``, someone else's,
a fresh one), so inside a container the uid says nothing about the person.  The kernel's
word on where a process lives is its cgroup: dockerd puts each container in one named by
its full id (cgroupfs ``/docker/<id>`` or ``<--cgroup-parent>/<id>``, systemd
``docker-<id>.scope``).  A process in one of this Engine's containers is that container's
owner's, as the ledger records the lease gpu-alloc holds for it, or else as the shim
recorded who created it (GPU or not), so ownership carries over to whatever such a
process creates in turn.  Never the container's labels: dockerd
merges an image's labels into every container made from it.  The path alone is not
proof (a user may name a delegated cgroup of their own after someone's container id):
the process must sit at or below the cgroup the container's own first process is in.

Everything else that is not plainly a host process is `UNKNOWN`, never the uid: uid 0
inside a container would be root's exemption.  `UNKNOWN` is never exempt, may use only
open pools, and is counted under the default limit, shared by everything unknown, so
it grants nothing a named person lacks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from allocator.core.rules import policy

_ID = re.compile(r"(?:docker-)?([0-9a-f]{64})(?:\.scope)?")


@dataclass(frozen=True)
class Asker:
    """Whose a connection is, before NSS names the user's groups.

    ``uid`` None: unknown.  ``gid``: the peer's own gid for a host process; None for a
    container's owner (the uid's primary group).  ``user``: the name the lease recorded,
    for a uid NSS no longer knows."""

    uid: int | None
    gid: int | None = None
    user: str = ""
    why: str = ""  # how it was decided, for the log


@dataclass(frozen=True)
class Container:
    """What the Engine, the kernel and the ledger say of the container a peer's cgroup
    names.  Its owner is the ledger's, never its labels': dockerd merges an image's labels
    into every container made from it, so anyone can give a container any label."""

    id: str
    leased: tuple[int | None, str] | None  # (uid, user) of its live lease, else its creator
    cgroup: str | None  # /proc/<its first process>/cgroup; None: not running, unreadable


def unknown(why: str) -> Asker:
    return Asker(None, user=policy.UNKNOWN, why=why)


def hierarchies(text: str) -> dict[str, str] | None:
    """``/proc/<pid>/cgroup`` as {"<id>:<controllers>": path}: cgroup v1 lines name
    their controllers, the v2 line is ``0::<path>``.  None when a line is not of that
    form (or there is none), as no live process's file reads."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        number, sep, rest = line.partition(":")
        controllers, sep2, path = rest.partition(":")
        if not (sep and sep2 and number.isdigit() and path.startswith("/")):
            return None
        out[f"{number}:{controllers}"] = path
    return out or None


def named(path: str) -> str | None:
    """The full id of the innermost container a cgroup path names (a container's own
    sub-cgroups included); None for none."""
    found = [m.group(1) for part in path.split("/") if (m := _ID.fullmatch(part))]
    return found[-1] if found else None


def container_in(cgroup: str | None) -> str | None:
    """The one container id a peer's cgroup file names, for the Engine to be asked
    about; None when it names none, several, or cannot be read."""
    lines = hierarchies(cgroup or "")
    ids = {named(p) for p in lines.values()} - {None} if lines else set()
    return ids.pop() if len(ids) == 1 else None


def asker(uid: int, gid: int, cgroup: str | None, container: Container | None) -> Asker:
    """Whose a connection from a process with ``uid``/``gid`` is, by its ``cgroup`` file
    (None: unreadable, or the process is gone) and the ``container`` that file names
    (None: this Engine does not know it)."""
    lines = hierarchies(cgroup) if cgroup is not None else None
    if lines is None:
        return unknown("its cgroup could not be read")
    ids = {c for c in map(named, lines.values()) if c is not None}
    if not ids:
        return Asker(uid, gid, why="a host process")
    if len(ids) > 1:
        return unknown(f"its cgroups name {len(ids)} containers")
    (cid,) = ids
    if container is None or container.id != cid:
        return unknown(f"it is in container {cid[:12]}, which this Engine does not know")
    home = hierarchies(container.cgroup) if container.cgroup is not None else None
    if home is None or not any(
        named(path) == cid and _within(path, home.get(key)) for key, path in lines.items()
    ):
        return unknown(f"its cgroup names container {cid[:12]} but it is not in it")
    return _leased(container)


def _within(path: str, top: str | None) -> bool:
    return top is not None and (path == top or path.startswith(top.rstrip("/") + "/"))


def _leased(container: Container) -> Asker:
    """The owner of the lease gpu-alloc holds for the container, as its ledger says, else
    its creator as the shim recorded it."""
    where = f"in container {container.id[:12]}"
    found = container.leased
    if found is None:
        return unknown(f"{where}, which holds no lease of gpu-alloc's and was not made by its shim")
    uid, user = found
    if uid is None:
        return unknown(f"{where}, whose owner gpu-alloc did not know")
    return Asker(uid, None, user, why=f"{where}, owned by {user}")
