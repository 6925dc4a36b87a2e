"""Whose a shim connection is: the peer's cgroup, the Engine's word on the container it
names, and the host's NSS for the person's name and groups.

The decision itself is allocator/core/judging/owners.py's; this module reads what it needs
(the container's owner from the ledger, through ``leased``).  A
connection is decided once, the first time a call needs its owner (a GPU create, an
explain), so calls that touch no GPU never read a file for it.  The container a cgroup
names is inspected once per id: gpu-alloc's labels never change, and a container's
cgroup is where it lives as long as it runs.
"""

from __future__ import annotations

import grp
import logging
import os
import pwd
import threading
import time
from collections.abc import Callable

from allocator.core.judging import owners
from allocator.core.rules import policy
from allocator.host.engine import Engine
from allocator.host.peers import Peer

log = logging.getLogger("gpu-alloc.owners")
OWNER_TTL = 10.0  # seconds an NSS answer is kept: a group change counts within this
_KEPT = 4096  # containers, or NSS answers, kept at most
_named: dict[tuple[int, int | None], tuple[float, policy.Owner]] = {}
_clock = time.monotonic


# Container id -> (uid, user) of the live lease the ledger binds to it, or None.
LeaseOwner = Callable[[str], tuple[int | None, str] | None]


class Owners:
    def __init__(self, engine: Engine | None, leased: LeaseOwner, proc: str = "/proc"):
        self.engine = engine
        self.leased = leased
        self.proc = proc
        self._containers: dict[str, owners.Container | None] = {}
        self._lock = threading.Lock()

    def of(self, peer: Peer | None) -> policy.Owner:
        """The person behind a connection (`policy.NOBODY` without peer credentials)."""
        if peer is None:
            return policy.NOBODY
        if peer.asker is None:
            peer.asker = self._decide(peer)
            if peer.asker.gid is None:  # not the peer's own uid
                log.info("pid %s (uid %s) counts as %s: %s", peer.pid, peer.uid,
                         peer.asker.user or peer.asker.uid, peer.asker.why)  # fmt: skip
        return person(peer.asker)

    def _decide(self, peer: Peer) -> owners.Asker:
        cgroup = _read(f"{self.proc}/{peer.pid}/cgroup") if peer.pid > 0 else None
        if not peer.alive():  # what was read may be another process's, under a reused pid
            cgroup = None
        cid = owners.container_in(cgroup)
        return owners.asker(peer.uid, peer.gid, cgroup, self._container(cid) if cid else None)

    def _container(self, cid: str) -> owners.Container | None:
        with self._lock:
            if cid in self._containers:
                return self._containers[cid]
        info = self.engine.inspect(cid) if self.engine is not None else None
        if info is None or info.get("Id") != cid:
            found = None
        else:
            pid = (info.get("State") or {}).get("Pid")
            home = _read(f"{self.proc}/{pid}/cgroup") if isinstance(pid, int) and pid > 0 else None
            found = owners.Container(cid, self.leased(cid), home)
            if home is None:
                return found  # not running now: asked again next time
        with self._lock:
            if len(self._containers) >= _KEPT:
                self._containers.clear()
            self._containers[cid] = found
        return found


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def person(asker: owners.Asker) -> policy.Owner:
    """The user and groups behind an asker's uid, as this host's NSS knew them at most
    `OWNER_TTL` ago (each answer reads /etc/passwd and /etc/group, or asks a directory,
    on the path of every GPU create).  An answer NSS gave only in
    part (a directory not answering) is not kept."""
    if asker.uid is None:
        return policy.NOBODY
    now = _clock()
    key = (asker.uid, asker.gid)
    known = _named.get(key)
    if known is not None and now < known[0]:
        return known[1]
    owner, whole = _lookup(asker.uid, asker.gid, asker.user)
    if whole:
        if len(_named) >= _KEPT:  # users come and go: forget the ones not seen lately
            for old in [k for k, (until, _) in _named.items() if until <= now]:
                del _named[old]
        _named[key] = (now + OWNER_TTL, owner)
    return owner


def _lookup(uid: int, gid: int | None, recorded: str) -> tuple[policy.Owner, bool]:
    """The owner, and whether NSS answered every question about it.  ``gid`` None: the
    uid's primary group; ``recorded``: the name to show for a uid NSS does not know."""
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return policy.Owner(uid, recorded or str(uid)), False
    user, gid = entry.pw_name, entry.pw_gid if gid is None else gid
    whole = True
    try:
        gids = os.getgrouplist(user, gid)
    except OSError:
        gids, whole = [gid], False
    groups = []
    for g in gids:
        try:
            groups.append(grp.getgrgid(g).gr_name)
        except KeyError:
            whole = False
    return policy.Owner(uid, user, tuple(groups)), whole


def groups_of(user: str) -> tuple[str, ...]:
    """A user's groups by name, as NSS says now (``gpu-alloc report --by group``)."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return ()
    return _lookup(entry.pw_uid, entry.pw_gid, user)[0].groups
