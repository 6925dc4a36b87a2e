"""Classify an Engine API request the way dockerd's router would.

Rules
-----
1. dockerd (gorilla/mux) routes on the percent-decoded path, with or without a
   ``/v{version:[0-9.]+}`` prefix; the query string never takes part.  We do the
   same, so ``/v1.41/containers%2Fcreate`` is a create here as it is there.
2. Container and image names are ``{name:.*}``: they may contain slashes, and a
   route is told apart by its fixed suffix.  Patterns below keep that shape.
3. Reads (GET, HEAD) never change device access; one is still a way into a running
   container, a websocket attach, whose stdin counts as an attach's.  A write we cannot
   classify is denied: the table below is the complete list of writes dockerd 20.10 to 29
   serves, each with the check it needs (`Check`).

The table is data: add a route by adding a row.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from enum import Enum
from urllib.parse import unquote_to_bytes, urlsplit


class Check(Enum):
    ALLOW = "allow"  # no device access can change
    CREATE = "create"  # POST /containers/create: the body decides
    START = "start"  # a body here is the pre-1.24 HostConfig: refuse it; judged at start
    RESTART = "restart"  # starts the container again: judged like a start
    UPDATE = "update"  # container update: no device fields
    REMOVE = "remove"  # container removal: allowed; afterwards its lease ends
    RENAME = "rename"  # allowed; it and REMOVE, PRUNE wait for a start they could redirect
    PRUNE = "prune"  # container prune: removals, as REMOVE
    EXEC = "exec"  # exec create: no privileged exec
    ATTACH = "attach"  # an attach's stdin, like an exec, is a way into an owned container
    EXEC_START = "exec-start"  # an exec's start takes its stream: its container's owner's
    SERVICE = "service"  # swarm services: tasks never pass the plugin
    PLUGIN_INSTALL = "plugin-install"  # plugin pull: privileges in the body, and its name
    PLUGIN_UPGRADE = "plugin-upgrade"  # privileges, and not the authorization plugin's
    PLUGIN_CREATE = "plugin-create"  # a plugin from a tarball: nothing to vet
    PLUGIN_SET = "plugin-set"  # settings can name devices, or reconfigure the authz plugin
    PLUGIN_ENABLE = "plugin-enable"  # no plugin implementing authz
    PLUGIN_DISABLE = "plugin-disable"  # disable, remove: not the authorization plugin
    VOLUME_CREATE = "volume-create"  # a local volume can bind-mount any host path
    ARCHIVE = "archive"  # copy into a container: refused where an advisory says (advisories)
    BUILDKIT = "buildkit"  # /grpc, /session upgrades: refused while builds reach GPUs (builds)
    UNKNOWN = "unknown"  # a write we do not know: deny


@dataclass(frozen=True)
class Route:
    check: Check
    path: str  # the decoded path without the version prefix
    version: tuple[int, ...] | None  # the /vX.Y prefix, if any
    name: str = ""  # the {name} parameter, when the route has one


_N = "(?P<name>.*)"
# (method, path pattern, check); every write route of dockerd's routers.
_WRITES: tuple[tuple[str, str, Check], ...] = (
    ("POST", "/containers/create", Check.CREATE),
    ("POST", "/containers/prune", Check.PRUNE),
    ("POST", f"/containers/{_N}/start", Check.START),
    ("POST", f"/containers/{_N}/restart", Check.RESTART),
    ("POST", f"/containers/{_N}/update", Check.UPDATE),
    ("POST", f"/containers/{_N}/exec", Check.EXEC),
    ("POST", f"/containers/{_N}/(?:kill|pause|unpause|stop|wait|resize|copy)", Check.ALLOW),
    ("POST", f"/containers/{_N}/attach", Check.ATTACH),
    ("POST", f"/containers/{_N}/rename", Check.RENAME),
    ("PUT", f"/containers/{_N}/archive", Check.ARCHIVE),
    ("POST", f"/containers/{_N}/checkpoints", Check.ALLOW),
    ("DELETE", f"/containers/{_N}/checkpoints/(?P<checkpoint>[^/]*)", Check.ALLOW),
    ("DELETE", f"/containers/{_N}", Check.REMOVE),
    ("POST", "/commit", Check.ALLOW),
    ("POST", f"/exec/{_N}/start", Check.EXEC_START),
    ("POST", f"/exec/{_N}/resize", Check.ALLOW),
    ("POST", "/images/(?:create|load|prune)", Check.ALLOW),
    ("POST", f"/images/{_N}/(?:push|tag)", Check.ALLOW),
    ("DELETE", f"/images/{_N}", Check.ALLOW),
    ("POST", "/build(?:/prune|/cancel)?", Check.ALLOW),
    ("POST", "/(?:session|grpc)", Check.BUILDKIT),
    ("POST", "/auth", Check.ALLOW),
    ("POST", "/volumes/create", Check.VOLUME_CREATE),
    ("POST", "/volumes/prune", Check.ALLOW),
    ("PUT", f"/volumes/{_N}", Check.ALLOW),
    ("DELETE", f"/volumes/{_N}", Check.ALLOW),
    ("POST", "/networks/(?:create|prune)", Check.ALLOW),
    ("POST", f"/networks/{_N}/(?:connect|disconnect)", Check.ALLOW),
    ("DELETE", f"/networks/{_N}", Check.ALLOW),
    ("POST", "/plugins/(?:pull)", Check.PLUGIN_INSTALL),
    ("POST", "/plugins/create", Check.PLUGIN_CREATE),
    ("POST", f"/plugins/{_N}/upgrade", Check.PLUGIN_UPGRADE),
    ("POST", f"/plugins/{_N}/set", Check.PLUGIN_SET),
    ("POST", f"/plugins/{_N}/enable", Check.PLUGIN_ENABLE),
    ("POST", f"/plugins/{_N}/disable", Check.PLUGIN_DISABLE),
    ("POST", f"/plugins/{_N}/push", Check.ALLOW),
    ("DELETE", f"/plugins/{_N}", Check.PLUGIN_DISABLE),
    ("POST", "/services/create", Check.SERVICE),
    ("POST", f"/services/{_N}/update", Check.SERVICE),
    ("DELETE", f"/services/{_N}", Check.ALLOW),
    ("POST", "/swarm/(?:init|join|leave|update|unlock)", Check.ALLOW),
    ("POST", f"/(?:nodes|secrets|configs)/{_N}/update", Check.ALLOW),
    ("POST", "/(?:secrets|configs)/create", Check.ALLOW),
    ("DELETE", f"/(?:nodes|secrets|configs)/{_N}", Check.ALLOW),
)
# The one read that is a way in: a websocket attach carries the container's stdin.
_READ_DOORS = (("GET", f"/containers/{_N}/attach/ws", Check.ATTACH),)
_TABLE: dict[str, tuple[tuple[re.Pattern[str], Check], ...]] = {}
for _method, _pattern, _check in (*_READ_DOORS, *_WRITES):
    _TABLE.setdefault(_method, ())
    _TABLE[_method] += ((re.compile(_pattern + r"\Z", re.DOTALL), _check),)

# Allowed by the route alone: no body, no facts, no ledger (the plugin still has
# renames and removals wait for a start they could redirect: allocator/core/leases/inflight.py).
CLEARED = frozenset({Check.ALLOW, Check.REMOVE, Check.RENAME, Check.PRUNE})
# Judged by the plugin alone, from the Engine's version and configuration: the shim
# splices them (a tar stream of any size, an upgrade to BuildKit's gRPC), and dockerd
# asks the plugin about them as about every call on every socket.
PLUGIN_JUDGED = frozenset({Check.ARCHIVE, Check.BUILDKIT})
# Calls kept to an owned container's owner that the shim splices unread while no
# container can be owned, else reads whole, marks with who asks and passes on to stream
# (shim/create.py): the hijacked ways in (an attach, an exec's start), and a rename, which
# could move an owned container under a reference judged on another.
SPLICED_DOORS = frozenset({Check.ATTACH, Check.EXEC_START, Check.RENAME})

_VERSION = re.compile(r"/v(?P<v>[0-9.]+)(?=/)")
_READS = frozenset({"GET", "HEAD", "OPTIONS"})


class RouteError(ValueError):
    """The request target cannot be read the way dockerd would read it."""


def decode_path(target: str) -> str:
    """The path dockerd routes on: absolute-form allowed, query dropped, %XX decoded."""
    if target.startswith(("http://", "https://")):
        target = urlsplit(target).path or "/"
    path = target.split("?", 1)[0]
    if "%" in path:
        if re.search(r"%(?![0-9A-Fa-f]{2})", path):
            raise RouteError(f"invalid percent-escape in request path '{target}'")
        try:
            path = unquote_to_bytes(path).decode("utf-8")
        except UnicodeDecodeError:
            raise RouteError(f"request path '{target}' is not UTF-8 once decoded") from None
    if not path.startswith("/"):
        raise RouteError(f"request target '{target}' is not an absolute path")
    return path


def api_version(text: str) -> tuple[int, ...]:
    """dockerd's versions.compare: numeric dot-separated parts, junk counts as 0."""
    return tuple(int(p) if p.isdigit() else 0 for p in text.split("."))


@functools.lru_cache(maxsize=4096)
def classify(method: str, target: str) -> Route:
    """The route dockerd takes for ``method target``.

    Memoized (a `Route` is immutable): the shim asks on the request head and again in
    its handler, so a call is classified once; the bound keeps a client that sends
    endless distinct targets from growing it.
    """
    path = decode_path(target)
    version = None
    m = _VERSION.match(path)
    if m:
        version = api_version(m["v"])
        path = path[m.end() :]
    if method in _READS and not (method == "GET" and path.endswith("/attach/ws")):
        return Route(Check.ALLOW, path, version)
    for pattern, check in _TABLE.get(method, ()):
        hit = pattern.match(path)
        if hit:
            return Route(check, path, version, hit.groupdict().get("name") or "")
    if method in _READS:
        return Route(Check.ALLOW, path, version)
    return Route(Check.UNKNOWN, path, version)


def by_id(target: str, route: Route, container: str) -> str:
    """``target`` naming its container by ``container`` (a full id: nothing to escape), with
    its version prefix and query kept.  The shim forwards a start this way, so dockerd
    starts the container that was judged whatever its reference names by then."""
    prefix = _VERSION.match(decode_path(target))
    head = "/containers/"
    rest = route.path[len(head) + len(route.name) :]
    query = target.split("?", 1)[1] if "?" in target else None
    path = f"{prefix[0] if prefix else ''}{head}{container}{rest}"
    return path if query is None else f"{path}?{query}"


def needs_check(method: str, target: str) -> bool:
    """Cheap pre-filter for the shim: everything but reads, harmless writes and what the
    plugin alone judges (`PLUGIN_JUDGED`) is vetted."""
    if method in _READS:
        return False
    try:
        check = classify(method, target).check
    except RouteError:
        return True
    return check not in CLEARED and check not in PLUGIN_JUDGED and check not in SPLICED_DOORS


def spliced_door(method: str, target: str) -> bool:
    """Whether ``method target`` is an attach, an exec's start or a rename (`SPLICED_DOORS`)."""
    try:
        return classify(method, target).check in SPLICED_DOORS
    except RouteError:
        return False
