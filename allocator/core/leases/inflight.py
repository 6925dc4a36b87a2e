"""Calls in flight that may not overlap: a start, and whatever could change what it names.

The race
--------
The plugin judges ``POST /containers/{ref}/start`` (and ``/restart``) on the container
``ref`` names when the plugin asks (`starts.refusal`), but dockerd looks ``ref`` up
again when it acts: full id, then exact name, then unique id prefix
(``daemon.GetContainer``).  A call landing between the two that changes what ``ref``
names makes dockerd start a container nobody judged: ``docker rename A A2; docker
rename B A``; removing A and creating another A; creating a container *named* like the
id prefix ``ref`` (a name wins over a prefix); even a start by full id, once that
container is removed, falls through to a container *named* like the id.

The rule
--------
A start or restart the plugin allows stays *in flight* from its AuthZReq to its
AuthZRes, and so does every call that can change what a reference names: a rename, a
removal, a container prune, a create with a name.  Both sides announce themselves
before they are allowed, so whichever comes second sees the first, waits for it to end
(up to `WAIT`), and is refused with "retry" if it has not.  `clash` says which pairs
conflict: a start by
its container's full id or exact name is *pinned*, and only a call on that container
itself can move it, so Compose's and ``docker run``'s starts (by full id) never wait on
renames and removals of other containers.

Two things change names without any call the plugin sees: a ``--rm`` container is
removed by dockerd itself when it exits, and an unnamed create brings new ids (and so
new id prefixes).  Hence `refusal`: a start whose reference could then fall through to
another container is refused outright (it names nothing but reads as an id prefix; it
names a ``--rm`` container that may exit, other than by its full id or a name that
cannot be a prefix), and a start by full id of such a container is checked for a
container named like that id (the plugin does that look-up).

A restart of a running container can stay in flight for its whole stop timeout (a
process that ignores SIGTERM: 10 s).  Its reference was looked up long before: dockerd
signals the container only after looking it up, so a ``kill`` event of that container
since the restart began (`signalled`) says nothing can redirect it any more, and it
holds off no prune, removal, rename or create from then on (``looked_up`` in
`Board.blocker`).  Without that event it holds them off as any start does.

Why not judge in the response phase (which container did start?): by then it has
run, GPUs and all; AuthZReq and AuthZRes carry no request id, arrive at any of the
plugin's workers, and a rename back can come before AuthZRes.  Announcing the calls is
cheap instead: only these routes touch the registry, never a read.

This module only decides; allocator/host/inflight.py keeps the registry file and
plugin/inflight.py applies it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_plus

from allocator.core.api.routes import Check, Route

WAIT = 2.0  # seconds a call waits for the one it conflicts with, before "retry"
TTL = 120.0  # an entry whose AuthZRes never came (a later plugin denied) ends by itself
STARTS = frozenset({Check.START, Check.RESTART})
CHANGES = {Check.RENAME: "rename", Check.REMOVE: "remove", Check.PRUNE: "prune"}
GUARDED = STARTS | set(CHANGES) | {Check.CREATE}
_HEX = re.compile(r"[0-9a-f]+")
_GONE = ("removing", "dead")  # dockerd refuses to start these; they vanish next


def _norm(ref: str) -> str:
    """A reference as a name: dockerd adds the leading "/" and trims a rename's spaces."""
    return ref.strip().lstrip("/")


def _prefix_like(ref: str) -> bool:
    """True when dockerd could read ``ref`` as a container id prefix (ids are hex)."""
    return _HEX.fullmatch(ref) is not None


@dataclass(frozen=True)
class Target:
    """The container a reference named when the start was judged."""

    id: str
    name: str  # without the leading "/"
    auto_remove: bool = False
    status: str = ""

    @classmethod
    def of(cls, info: Mapping[str, Any] | None) -> Target | None:
        if not info:
            return None
        return cls(
            str(info.get("Id") or ""),
            str(info.get("Name") or "").lstrip("/"),
            bool((info.get("HostConfig") or {}).get("AutoRemove")),
            str((info.get("State") or {}).get("Status") or ""),
        )

    @property
    def vanishing(self) -> bool:
        """dockerd may remove it by itself at any moment: a --rm container that has run."""
        return self.auto_remove and self.status != "created"


@dataclass(frozen=True)
class Start:
    verb: str  # "start" or "restart", for the messages
    ref: str  # as the client wrote it
    target: Target | None  # None: it named nothing

    @property
    def name(self) -> str:
        return _norm(self.ref)

    @property
    def linked(self) -> bool:
        """``parent/alias``: a legacy link's name, moved by whatever moves its parent."""
        return "/" in self.name

    @property
    def pinned(self) -> bool:
        """Only a call on its own container can change what the reference names."""
        t = self.target
        return (
            t is not None
            and not t.vanishing
            and not self.linked
            and (self.ref == t.id or self.name == t.name)
        )

    @property
    def at_risk(self) -> frozenset[str]:
        """Names that, taken by another container, could move the reference."""
        return frozenset({self.name, self.name.split("/", 1)[0]})

    def touched_by(self, ref: str) -> bool:
        """Whether a rename or removal of ``ref`` may act on this start's container."""
        r, t = _norm(ref), self.target
        if "/" in r or self.linked or r == self.name:
            return True
        return t is not None and (r == t.name or t.id.startswith(r))

    def describe(self) -> str:
        return f"a {self.verb} of {self.ref}"


@dataclass(frozen=True)
class Change:
    kind: str  # "rename", "remove", "prune", "create"
    ref: str = ""  # the container a rename or removal names
    names: frozenset[str] = frozenset()  # the names a create may take

    def describe(self) -> str:
        if self.kind == "prune":
            return "a container prune"
        if self.kind == "create":
            return f"a create of a container named {'/'.join(sorted(self.names))}"
        return f"{'a rename' if self.kind == 'rename' else 'a removal'} of {self.ref}"


Hold = Start | Change

# Which change conflicts with which in-flight start.  A rename's new name may come in a
# form body the plugin never sees, so it counts as any name: it moves only unpinned starts.
_CLASHES: dict[str, Callable[[Start, Change], bool]] = {
    "prune": lambda s, c: True,
    "remove": lambda s, c: s.touched_by(c.ref),
    "rename": lambda s, c: s.touched_by(c.ref) or not s.pinned,
    "create": lambda s, c: bool(c.names & s.at_risk),
}


def clash(a: Hold, b: Hold) -> bool:
    """Whether calls ``a`` and ``b`` may not be in flight together (either order)."""
    if isinstance(a, Change) and isinstance(b, Change):
        return False
    if isinstance(a, Start) and isinstance(b, Start):
        # Two starts of one --rm container: the first may run it, it exits, dockerd
        # removes it, and the second's reference falls through to another container.
        ta, tb = a.target, b.target
        return ta is not None and tb is not None and ta.id == tb.id and ta.auto_remove
    start, change = (a, b) if isinstance(a, Start) else (b, a)
    assert isinstance(start, Start) and isinstance(change, Change)
    return _CLASHES[change.kind](start, change)


def signalled(hold: Hold) -> Target | None:
    """The container whose ``kill`` event, once a restart began, shows that dockerd has
    looked the restart's reference up: a restart of a container that was running when it
    was judged signals it to stop, which dockerd does only on the container it found."""
    if isinstance(hold, Start) and hold.verb == "restart" and hold.target is not None:
        return hold.target if hold.target.status == "running" else None
    return None


def clash_text(new: Hold, old: Hold) -> str:
    """The refusal of ``new`` while ``old`` is in flight."""
    if isinstance(new, Start):
        what = f"gpu-alloc refused to {new.verb} {new.ref}"
    else:
        what = f"gpu-alloc refused {new.describe()}"
    return (
        f"{what}: {old.describe()} is in progress (waited {WAIT:g}s), and together they "
        "could make dockerd start another container than the one gpu-alloc judged; retry"
    )


def refusal(start: Start) -> str | None:
    """Why a start must be refused whatever is in flight: its reference could fall through
    to another container by a change no call announces (a --rm exit, a new id)."""
    t, what = start.target, f"gpu-alloc refused to {start.verb} {start.ref}"
    if t is None:
        if not _prefix_like(start.ref):
            return None  # dockerd answers "no such container"; a create of it waits
        return (
            f"{what}: no container is called {start.ref}, and it reads as an id prefix, "
            "which a container created meanwhile could take; check the name with "
            "'docker ps -a'"
        )
    if t.status in _GONE:
        return f"{what}: the container is being removed"
    safe = start.ref == t.id or (start.name == t.name and not _prefix_like(start.name))
    if t.vanishing and not safe:
        return (
            f"{what}: dockerd removes it by itself once it exits (--rm), and then "
            f"'{start.ref}' could name another container; {start.verb} it by its full id "
            f"(docker {start.verb} {t.id})"
        )
    return None


def needs_name_check(start: Start) -> bool:
    """A start by full id of a --rm container: once it is removed, dockerd looks the id
    up as a name, so no container may be named like it."""
    t = start.target
    return t is not None and t.vanishing and start.ref == t.id


def named_like_id_text(start: Start, other: str) -> str:
    return (
        f"gpu-alloc refused to {start.verb} {start.ref}: container {other[:12]} is named "
        "like its id, and dockerd starts it instead once this --rm container is removed; "
        "rename or remove that container"
    )


def moved_text(start: Start) -> str:
    return (
        f"gpu-alloc refused to {start.verb} {start.ref}: what it names changed while "
        "gpu-alloc judged it; retry"
    )


def create_names(uri: str) -> frozenset[str]:
    """Every name a create's query may give it, as dockerd's ``r.Form.Get("name")`` reads
    it: Go's older query parser also split at ";", so both readings count."""
    query = uri.split("?", 1)[1] if "?" in uri else ""
    found = set()
    for sep in ("&", "[&;]"):
        for pair in re.split(sep, query):
            key, _, value = pair.partition("=")
            if unquote_plus(key) == "name" and value:
                found.add(_norm(unquote_plus(value)))
    return frozenset(n for n in found if n)


def hold_of(route: Route, uri: str) -> Change | None:
    """The change a call announces (None: it changes no name), for the routes in GUARDED
    other than starts."""
    kind = CHANGES.get(route.check)
    if kind is not None:
        return Change(kind, route.name)
    if route.check is Check.CREATE:
        names = create_names(uri)
        return Change("create", names=names) if names else None
    return None


def key(method: str, uri: str) -> str:
    """What pairs an AuthZRes with its AuthZReq: the call itself (there is no request id;
    identical calls in flight are interchangeable)."""
    return f"{method} {uri}"


# ------------------------------------------------------------------ the registry's data


@dataclass(frozen=True)
class Entry:
    key: str
    hold: Hold
    expires: float
    pid: int = 0  # the plugin worker that put it in flight: its death ends the entry

    @property
    def began(self) -> float:
        return self.expires - TTL


@dataclass(frozen=True)
class Board:
    """What is in flight.  ``generation`` counts every change to it, so a start can tell
    whether any call began or ended while it was being judged."""

    generation: int = 0
    entries: tuple[Entry, ...] = ()

    def blocker(self, hold: Hold, now: float, looked_up: Collection[Entry] = ()) -> Entry | None:
        """The first live entry ``hold`` conflicts with, but for the starts dockerd has
        already looked up (``looked_up``: nothing can redirect those)."""
        return next(
            (
                e
                for e in self.entries
                if e.expires > now and clash(hold, e.hold) and e not in looked_up
            ),
            None,
        )

    def keeping(self, alive: Callable[[int], bool]) -> Board:
        """Without the entries of workers no longer alive (a worker killed between a
        call's AuthZReq and AuthZRes: dockerd failed that call, no AuthZRes will come)."""
        kept = tuple(e for e in self.entries if alive(e.pid))
        return self if len(kept) == len(self.entries) else Board(self.generation, kept)

    def with_entry(self, entry: Entry, now: float) -> Board:
        live = tuple(e for e in self.entries if e.expires > now)
        return Board(self.generation + 1, (*live, entry))

    def without(self, key: str, now: float) -> Board | None:
        """The board with one entry of ``key`` ended (and expired ones dropped); None when
        nothing changes."""
        live = tuple(e for e in self.entries if e.expires > now)
        index = next((i for i, e in enumerate(live) if e.key == key), None)
        if index is None and len(live) == len(self.entries):
            return None
        if index is not None:
            live = live[:index] + live[index + 1 :]
        return Board(self.generation + 1, live)

    def to_json(self) -> dict[str, Any]:
        return {"generation": self.generation, "entries": [_entry_json(e) for e in self.entries]}

    @classmethod
    def from_json(cls, data: Any) -> Board:
        """The board a file holds; anything unreadable is an empty board (the file holds
        seconds of calls, and every writer rewrites it whole)."""
        try:
            entries = tuple(_entry_of(e) for e in data["entries"])
            return cls(int(data["generation"]), entries)
        except (KeyError, TypeError, ValueError, AttributeError):
            return cls()


def _entry_json(e: Entry) -> dict[str, Any]:
    h = e.hold
    if isinstance(h, Start):
        t = h.target
        target = None if t is None else [t.id, t.name, t.auto_remove, t.status]
        hold: dict[str, Any] = {"start": [h.verb, h.ref, target]}
    else:
        hold = {"change": [h.kind, h.ref, sorted(h.names)]}
    return {"key": e.key, "expires": e.expires, "pid": e.pid, **hold}


def _entry_of(data: dict[str, Any]) -> Entry:
    if "start" in data:
        verb, ref, target = data["start"]
        t = None if target is None else Target(str(target[0]), str(target[1]), *target[2:])
        hold: Hold = Start(str(verb), str(ref), t)
    else:
        kind, ref, names = data["change"]
        if kind not in _CLASHES:
            raise ValueError(kind)
        hold = Change(str(kind), str(ref), frozenset(map(str, names)))
    return Entry(str(data["key"]), hold, float(data["expires"]), int(data.get("pid", 0)))
