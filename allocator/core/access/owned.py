"""The doors into a running container that hand what it holds to whoever uses them, kept
to its owner where it holds what only its owner was granted.

Rules
-----
1. A container is *owned* when, judged with nobody named, it runs privileged, holds a
   power outside the allow-list (`powers`) or binds the Engine's socket (`socket_binds`):
   what ``policy.privileged``, ``policy.powers`` and ``policy.engine_socket_binds`` let
   through for a named owner alone.
2. ``docker exec`` into a container runs a new process with all of that: on an owned
   container it is its owner's and root's alone (`refusal`).  Only the shim knows who
   asks: it marks an exec with the asker (`mark`: an HMAC under the state directory's
   key, of the method, the URI and the name), and the plugin believes the name only with
   a good mark.  On dockerd's own socket nobody asks by name, so the exec is refused.
3. An attach that feeds the container's stdin (`feeds_stdin`: ``docker attach``,
   ``docker run -i``, a websocket attach) types into its main process, and whoever
   starts an exec (``POST /exec/{id}/start``) gets that exec's stream: both are kept as
   an exec is.  The shim reads them whole, marks them, and passes them on to stream.
   An attach that only reads output is anyone's, as ``docker logs`` is.
4. ``docker cp`` into a container (``PUT /containers/{id}/archive``) can replace what it
   runs.  The shim passes a copy's tar stream on unread (it may be of any size), so it
   cannot say who asks: into an owned container every copy is refused, and its owner
   writes files by an exec instead.
5. Each of these is judged on the container its reference names when it is asked, and
   dockerd looks the reference up again when it acts.  So nothing may move an owned
   container under another reference in between: renaming it is its owner's and root's
   alone (kept as an exec is), a call whose reference names no container is refused
   (`unnamed`), so is one by a link's alias (`aliased`: renaming its parent moves it),
   and one that could be read as an id prefix is judged on every container it could
   name (`refs`; the service looks them up).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from allocator.core.access import privileged, socket_binds
from allocator.core.access.grants import Access
from allocator.core.api import goform
from allocator.core.api.routes import Route
from allocator.core.rules.policy import UNKNOWN

HEADER = "X-Gpu-Alloc-Asker"  # the shim's mark: "<user> <hmac>"
ROOT = "root"  # root on the host: every door is theirs anyway
EXEC, COPY, ATTACH, EXEC_START, RENAME = "exec", "copy", "attach", "exec-start", "rename"
# (what the call does to the container, why it is kept to the owner)
WHAT = {
    EXEC: ("exec into", "an exec would hand that to whoever asks"),
    COPY: ("copy files into", "a copy would hand that to whoever asks"),
    ATTACH: ("attach to the input of", "an attach would hand that to whoever asks"),
    EXEC_START: ("start an exec in", "starting it would hand that to whoever asks"),
    RENAME: ("rename", "a new name could carry into it a call judged on another container"),
}
WS_STDIN_ASKED = (1, 42)  # a websocket attach reads ``stdin`` from this API version on


@dataclass(frozen=True)
class DoorCheck:
    """An exec, an attach or a copy into container ``ref`` (as the request names it; an
    exec's id for an exec's start), asked by ``asker`` (the name the shim's mark vouches
    for; empty: nobody by name)."""

    ref: str
    door: str
    asker: str = ""


def feeds_stdin(route: Route, method: str, uri: str, headers: Mapping[str, Any] | None) -> bool:
    """Whether an attach may feed the container's stdin, as dockerd reads it: the
    ``stdin`` value (`goform`), and on a websocket below API 1.42, always (a route with
    no version prefix may be served at 1.41, 20.10's own)."""
    if method == "GET" and (route.version is None or route.version < WS_STDIN_ASKED):
        return True
    return goform.bool_value(uri, headers, "stdin")


def held(anyone: Access) -> tuple[str, ...]:
    """The fields of what ``anyone`` (a container's access judged with no owner named)
    holds only by an owner's grant; empty: the container is nobody's in particular."""
    fields = (
        g.field
        for g in anyone.grants
        if g.power or g.field == privileged.FIELD or socket_binds.SOCKET_WORDS in g.detail
    )
    return tuple(dict.fromkeys(fields))


def refusal(check: DoorCheck, fields: tuple[str, ...], owner: str) -> str | None:
    """Why ``check`` is refused on a container holding ``fields`` by ``owner``'s grant, or
    None."""
    if not fields:
        return None
    verb, why = WHAT[check.door]
    held = (
        f"gpu-alloc refused to {verb} {check.ref}: it holds what the policy grants "
        f"{owner or 'its owner'} alone ({', '.join(fields)}), and {why}"
    )
    if check.door == COPY:
        return (
            f"{held}; no copy into it is allowed, since gpu-alloc cannot tell who sends one. "
            f"Its owner can write a file with an exec: docker exec -i {check.ref} "
            "sh -c 'cat > PATH' < FILE"
        )
    named = check.asker not in ("", UNKNOWN)  # the shim could not tell who: nobody
    if check.asker == ROOT or (named and check.asker == owner):
        return None
    whose = f"{owner}'s" if owner else "its owner's"
    only = (
        f"{held}; only {whose} own requests through the gpu-alloc context "
        "(docker --context gpu-alloc ...), or root's, may"
    )
    if check.door == ATTACH:
        return f"{only}. Its output is anyone's: docker attach --no-stdin, or docker logs -f"
    return only


def unnamed(check: DoorCheck) -> str:
    """Why ``check`` is refused when its reference names no container now."""
    verb, _ = WHAT[check.door]
    return (
        f"gpu-alloc refused to {verb} {check.ref}: no container is {check.ref} now, and "
        "while containers can be kept to their owners a call that names none could land "
        "in one given that name in between. Check the name (docker ps -a); if it was just "
        "renamed, try again"
    )


def aliased(check: DoorCheck) -> str:
    """Why ``check`` is refused when its reference is a legacy link's alias: renaming the
    alias's parent, which is anyone's, moves it onto another container."""
    verb, _ = WHAT[check.door]
    return (
        f"gpu-alloc refused to {verb} {check.ref}: it names a container by a link's alias, "
        "which moves to another container whenever its parent is renamed, and while "
        "containers can be kept to their owners a call must name the container itself: "
        "use its name or id (docker ps)"
    )


def mark(key: bytes, method: str, uri: str, user: str) -> str:
    """The header's value for ``user`` asking ``method`` ``uri``."""
    message = b"\0".join((method.upper().encode(), uri.encode(), user.encode()))
    return f"{user} {hmac.new(key, message, hashlib.sha256).hexdigest()}"


def asker(headers: Mapping[str, Any] | None, key: bytes, method: str, uri: str) -> str:
    """The name a good mark on this request vouches for; empty without one."""
    want = HEADER.lower()
    given = next((str(v) for k, v in (headers or {}).items() if str(k).lower() == want), "")
    user = given.rpartition(" ")[0]
    if not (key and user) or not hmac.compare_digest(given, mark(key, method, uri, user)):
        return ""
    return user
