"""Pure decisions: what the plugin answers and how the shim rewrites a create.

Rules
-----
1. Fail closed: a body we cannot read, a body that should be there and is not,
   a route we do not know, a field we cannot vet: deny, saying which and why.
2. One analysis for everyone: creates go through `access.of_create`, whichever
   socket they came through; the shim and the plugin differ only in what they
   do with a leasable ask (the shim leases and rewrites, the plugin checks the
   lease's token, which the shim sends in the `labels.LEASE_HEADER` header).
3. No I/O here.  A decision that needs the ledger comes back as `NeedsLease`
   and the caller (plugin/app.py, shim/create.py) reads it.

Every denial says what was refused, why, and what to do instead, because the
docker CLI prints ``Msg`` to the user as it is.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, overload

from allocator.core import access, fields, gojson, labels, mounts, plugins, privileged, restarts
from allocator.core.access_ctx import MountsOf, VolumeOf
from allocator.core.ask import Ask, ask_of
from allocator.core.createbody import decode_create
from allocator.core.facts import EngineView, HostFacts, Unresolvable
from allocator.core.grants import Access, Grant, Refusal
from allocator.core.inflight import Target
from allocator.core.inventory import Inventory, InventoryError
from allocator.core.plugins import PluginCheck
from allocator.core.routes import CLEARED, Check, Route, RouteError, classify

DEFAULT_SHIM_SOCKET = "/run/gpu-alloc/docker.sock"


def context_hint(shim_socket: str = DEFAULT_SHIM_SOCKET) -> str:
    """What to do instead, for a refusal on the real socket: the command that fixes it."""
    return (
        "GPUs are leased only through the gpu-alloc socket: create its context once with "
        f"'docker context create gpu-alloc --docker host=unix://{shim_socket}', then run "
        "'docker --context gpu-alloc run --gpus 1 ...' (or a Compose device reservation; "
        f"docker-compose v1 reads only DOCKER_HOST=unix://{shim_socket})"
    )


HINT = context_hint()
# Plain words for the grants people hit most, before the field that carries them.
# Fields whose refusal reads better in plain words first: (what, what to do about it).
PLAIN = {
    "HostConfig.Privileged": (
        "a privileged container sees every device on the host, every GPU included, so "
        "it is not allowed here",
        "remove --privileged, and add with --cap-add only what the container really needs",
    ),
}
SHIM_INSTEAD = "ask for GPUs with --gpus N (or a Compose device reservation) instead"
DEVICE_FIELDS = ("Devices", "DeviceRequests", "DeviceCgroupRules")
MIN_START_BODY_FREE_API = (1, 24)  # below it, start may carry a HostConfig


NO_GPUS = Inventory(())


@dataclass(frozen=True)
class Facts:
    """The world a decision is made against.

    The inventory is a fact that may be missing (a simulated file gone, NVML failing):
    work that touches no GPU goes on without it, and only a grant is refused, naming
    ``inventory_error``.
    """

    inventory: Inventory | None
    engine: EngineView
    host: HostFacts
    mounts_of: MountsOf | None = None  # another container's binds, for VolumesFrom
    inventory_error: str = ""  # why `inventory` is None
    volume_of: VolumeOf | None = None  # a named volume's driver and options
    shim_socket: str = DEFAULT_SHIM_SOCKET  # for the hint on the real socket
    privileged_mode: str = privileged.REFUSE  # policy.privileged, as the shim leases by it

    @property
    def known_gpus(self) -> Inventory:
        """The inventory, or no GPUs at all: enough to tell whether a request touches a
        GPU (every GPU source is a grant with or without an inventory), never to grant."""
        return self.inventory if self.inventory is not None else NO_GPUS

    def require_inventory(self) -> Inventory:
        if self.inventory is None:
            raise InventoryError(self.inventory_error or "the GPU inventory cannot be read")
        return self.inventory


@dataclass(frozen=True)
class Allow:
    pass


@dataclass(frozen=True)
class Deny:
    msg: str
    field: str = ""  # the GPU-granting field refused, when one was (for the metrics)


@dataclass(frozen=True)
class NeedsLease:
    """Allow only if the ledger has a pending lease ``lease_id`` for exactly ``gpus``."""

    lease_id: str
    token: str
    gpus: frozenset[str]


@dataclass(frozen=True)
class StartCheck:
    """Allow only if container ``ref``, as it resolves now, passes `starts.refusal`."""

    ref: str


@dataclass(frozen=True)
class AllowStart:
    """A start allowed for the container its reference named when judged (None: it named
    none; dockerd will say so).  The shim forwards it by that container's full id."""

    target: Target | None


@dataclass(frozen=True)
class UpdateCheck:
    """Allow unless ``ref``'s lease set one of ``fields`` (its leased cores or memory), or
    the update sets a ``restart`` policy (`restarts.asked`) a start of ``ref`` fails."""

    ref: str
    fields: tuple[str, ...]
    restart: str = ""


Decision = Allow | Deny | NeedsLease | StartCheck | AllowStart | UpdateCheck | PluginCheck
ALLOW = Allow()


# ----------------------------------------------------------------- request phase


def route_of(method: str, uri: str) -> Route | Deny:
    """The call's route, classified once per call by whoever received it."""
    try:
        return classify(method, uri)
    except RouteError as e:
        return Deny(f"gpu-alloc refused {method} {uri}: {e}")


def cleared(route: Route) -> bool:
    """True when the route table alone allows the call: no body, no facts, no ledger."""
    return route.check in CLEARED


def authz_request(
    route: Route,
    method: str,
    uri: str,
    body: bytes | None,
    facts: Facts,
    headers: Mapping[str, Any] | None = None,
) -> Decision:
    """The verdict on a call before the Engine acts (the plugin's AuthZReq; the shim's
    non-create writes).  Reads and harmless writes return before any parsing, and
    ``facts`` may be lazy: only the checks that need them read them.  ``headers``: the
    request's, where a leased create carries its lease token (creates alone read it)."""
    if cleared(route):
        return ALLOW
    if route.check is Check.CREATE:
        return _create(route, method, uri, body, facts, labels.parse_lease_header(headers))
    return _CHECKS[route.check](route, method, uri, body, facts)


def _needs_body(route: Route, method: str, uri: str, body: bytes | None) -> Deny | None:
    if body:
        return None
    return Deny(
        f"gpu-alloc refused {method} {route.path}: the Engine passed no request body to the "
        "authorization plugin (it forwards only application/json bodies, up to 1 MiB, or "
        "4 MiB on Engines with the CVE-2026-34040 fix), and this request cannot be judged "
        "without it"
    )


@overload
def _body_as(
    route: Route, method: str, uri: str, body: bytes | None, schema: fields.Struct, what: str
) -> dict[str, Any] | Deny: ...
@overload
def _body_as(
    route: Route, method: str, uri: str, body: bytes | None, schema: object, what: str
) -> object | Deny: ...
def _body_as(
    route: Route, method: str, uri: str, body: bytes | None, schema: object, what: str
) -> object | Deny:
    """The body decoded as dockerd decodes it, or the denial: missing or unreadable."""
    missing = _needs_body(route, method, uri, body)
    if missing:
        return missing
    try:
        return gojson.decode(body or b"", schema)
    except gojson.BodyError as e:
        return Deny(f"gpu-alloc refused the {what}: {e}")


def _create(
    route: Route,
    method: str,
    uri: str,
    body: bytes | None,
    facts: Facts,
    lease: tuple[str, str] = ("", ""),
) -> Decision:
    """A create: allowed when it reaches no GPU, or when everything it reaches is pinned
    to the GPUs of the pending lease that its lease header (``lease``: id, token) and
    its lease label both name."""
    missing = _needs_body(route, method, uri, body)
    if missing:
        return missing
    try:
        spec = decode_create(body or b"")
    except gojson.BodyError as e:
        return Deny(f"gpu-alloc refused the container create: {e}")
    grants = grants_of_create(spec, facts)
    if isinstance(grants, Deny):
        return grants
    if grants.none and lease[0]:
        # The header is the shim's, on the GPU creates it leased; on any other create it
        # could only be made up, and the answer to it must never settle a real lease.
        return Deny(
            f"gpu-alloc refused the container create: it carries a {labels.LEASE_HEADER} "
            "header but asks for no GPU; only the gpu-alloc shim sets that header, on "
            "the GPU creates it leased: send the create without it"
        )
    if grants.none:
        return ALLOW
    refused = grants.refused()
    lease_all = bool(lease[0]) and privileged.asked(grants)  # policy.privileged: lease-all
    if refused and not lease_all:
        return Deny(_refusal_text(refused, context_hint(facts.shim_socket)), refused[0].field)
    lease_id, token = lease
    first = grants.grants[0]
    if not lease_id or not token or labels.lease_of(spec.get("Labels")) != lease_id:
        return Deny(
            "gpu-alloc refused the container create: it asks for GPUs without a gpu-alloc "
            f"lease ({first.describe()}); {context_hint(facts.shim_socket)}",
            first.field,
        )
    if lease_all:
        every = privileged.leased(spec, grants, facts.known_gpus)
        return (
            Deny(every, privileged.FIELD) if isinstance(every, str) else NeedsLease(*lease, every)
        )
    if not grants.pinned:
        return Deny(
            f"gpu-alloc refused the container create: {first.describe()} is not pinned to "
            f"GPUs by UUID, so no lease can cover it; {HINT}",
            first.field,
        )
    gpus = grants.gpus(facts.known_gpus)
    guard = access.env_values(spec.get("Env") or (), access.VISIBLE)
    if [set(v.split(",")) for v in guard] != [set(gpus)]:
        return Deny(
            f"gpu-alloc refused the container create: Config.Env must set {access.VISIBLE} "
            f"once, to the leased GPUs {','.join(sorted(gpus))}; {HINT}",
            "Config.Env",
        )
    return NeedsLease(lease_id, token, gpus)


def grants_of_create(spec: Mapping[str, Any], facts: Facts) -> Access | Deny:
    """The create's effective access; without an inventory, only a create with none passes."""
    try:
        grants = access.of_create(
            spec, facts.engine, facts.known_gpus, facts.host, facts.mounts_of, facts.volume_of
        )
    except Refusal as e:
        if facts.inventory is None:
            return Deny(
                f"gpu-alloc refused the container create: {e} (and gpu-alloc cannot read "
                f"the GPU inventory: {facts.inventory_error})"
            )
        return Deny(f"gpu-alloc refused the container create: {e}")
    if facts.inventory is None and not grants.none:
        return Deny(
            f"gpu-alloc refused the container create: {grants.grants[0].describe()} touches "
            f"GPUs, and gpu-alloc cannot read the GPU inventory: {facts.inventory_error}. "
            "Containers without GPUs still run; fix the inventory ('gpu-alloc doctor' "
            "checks it) and try again"
        )
    return grants


def _refusal_text(refused: Sequence[Grant], instead: str) -> str:
    """Plain words first (`PLAIN`), then the field and its detail, then what to do."""
    plain = [PLAIN[g.field] for g in refused if g.field in PLAIN]
    what = "; ".join(g.describe() for g in refused)
    if plain:
        words = "; ".join(w for w, _ in plain)
        todo = "; ".join(t for _, t in plain)
        return f"gpu-alloc refused the container create: {words} ({what}); {todo}; {instead}"
    return (
        f"gpu-alloc refused the container create: {what}. gpu-alloc leases GPUs only through "
        f"device requests (--gpus, Compose reservations) or the nvidia runtime with "
        f"NVIDIA_VISIBLE_DEVICES; {instead}"
    )


def _start(route: Route, method: str, uri: str, body: bytes | None, facts: Facts) -> Decision:
    if route.version is not None and route.version < MIN_START_BODY_FREE_API:
        return Deny(
            f"gpu-alloc refused container start on API {'.'.join(map(str, route.version))}: "
            "below 1.24 a start may replace the container's HostConfig, which gpu-alloc "
            "cannot vet; use a client that speaks API 1.24 or newer"
        )
    if body and body.strip() not in (b"", b"{}", b"null"):
        return Deny(
            "gpu-alloc refused container start: a start with a request body would replace "
            "the container's HostConfig; start it without one"
        )
    return StartCheck(route.name)


def _restart(route: Route, method: str, uri: str, body: bytes | None, facts: Facts) -> Decision:
    return StartCheck(route.name)  # a restart starts the container again: the same check


def _update(route: Route, method: str, uri: str, body: bytes | None, facts: Facts) -> Decision:
    spec = _body_as(route, method, uri, body, fields.UPDATE_BODY, "container update")
    if isinstance(spec, Deny):
        return spec
    touched = [f for f in DEVICE_FIELDS if (spec or {}).get(f)]
    if touched:
        return Deny(
            f"gpu-alloc refused the container update: {', '.join(touched)} would change the "
            "container's device access; recreate the container through gpu-alloc instead"
        )
    leasable = tuple(f for f in LEASED_FIELDS if (spec or {}).get(f))
    restart = restarts.asked(spec)
    return UpdateCheck(route.name, leasable, restart) if leasable or restart else ALLOW


# HostConfig fields a CPU or memory lease sets; only their updates need the ledger.
LEASED_FIELDS = ("CpusetCpus", "CpusetMems", "Memory")


def _exec(route: Route, method: str, uri: str, body: bytes | None, facts: Facts) -> Decision:
    spec = _body_as(route, method, uri, body, fields.EXEC_BODY, "exec")
    if isinstance(spec, Deny):
        return spec
    if (spec or {}).get("Privileged"):
        return Deny(
            "gpu-alloc refused the exec: Privileged exec can reach devices the container "
            "was not granted; run the exec without --privileged"
        )
    return ALLOW


def _service(route: Route, method: str, uri: str, body: bytes | None, facts: Facts) -> Decision:
    return Deny(
        "gpu-alloc refused the swarm service: swarm tasks are created by the daemon without "
        "passing the authorization plugin, so their GPU access cannot be leased; run the "
        f"containers directly ({HINT})"
    )


def _plugin_create(
    route: Route, method: str, uri: str, body: bytes | None, facts: Facts
) -> Decision:
    return Deny(
        "gpu-alloc refused 'docker plugin create': a plugin built from a local tarball can "
        "ask for any device, and its manifest is not visible to gpu-alloc; install plugins "
        "with 'docker plugin install', whose privileges gpu-alloc checks"
    )


_PLUGIN_BODIES = {
    Check.PLUGIN_INSTALL: (fields.PLUGIN_PRIVILEGES_BODY, "plugin install"),
    Check.PLUGIN_UPGRADE: (fields.PLUGIN_PRIVILEGES_BODY, "plugin upgrade"),
    Check.PLUGIN_SET: (fields.PLUGIN_SET_BODY, "plugin settings"),
}


def _plugin(route: Route, method: str, uri: str, body: bytes | None, facts: Facts) -> Decision:
    """Plugin installs, upgrades, settings, enables, disables and removals: the body (when
    the route has one) decoded here, the verdict `plugins.verdict`'s."""
    decoded: object = None
    if route.check in _PLUGIN_BODIES:
        schema, what = _PLUGIN_BODIES[route.check]
        decoded = _body_as(route, method, uri, body, schema, what)
        if isinstance(decoded, Deny):
            return decoded
    exposes = functools.partial(_exposes, facts.host)
    found = plugins.verdict(route, method, uri, decoded, facts.engine.authz_chain, exposes)
    return Deny(found) if isinstance(found, str) else found or ALLOW


_VOLUME_BODY = fields.Struct(
    Name=str,
    Driver=str,
    DriverOpts=fields.STRING_MAP,
    Labels=fields.STRING_MAP,
    ClusterVolumeSpec=fields.OPAQUE,
)


def _volume_create(
    route: Route, method: str, uri: str, body: bytes | None, facts: Facts
) -> Decision:
    spec = _body_as(route, method, uri, body, _VOLUME_BODY, "volume create")
    if isinstance(spec, Deny):
        return spec
    spec = spec or {}
    if str(spec.get("Driver") or "") not in mounts.LOCAL_DRIVERS:
        return ALLOW  # a volume plugin: its own privileges were vetted at install
    made = mounts.local_volume(spec.get("DriverOpts") or {})
    exposed = made.refusal or _exposes(facts.host, made.source, made.read_only)
    where = "DriverOpts.device" if made.source else "DriverOpts"
    if exposed:
        return Deny(
            f"gpu-alloc refused the volume create: {where}: {exposed}; a volume may be a "
            "plain directory, a tmpfs, a network share, or a bind of a path that exposes no "
            "GPU device or Engine control file"
        )
    return ALLOW


def _exposes(host: HostFacts, path: str, read_only: bool = False) -> str:
    """What a bind of ``path`` exposes, in words; empty when nothing."""
    if not path.startswith("/"):
        return ""
    try:
        real = host.resolve(path)
    except Unresolvable as e:
        return f"{path} cannot be judged: {e}"
    exposed = mounts.exposure(host, real, read_only)
    if exposed:
        return f"a bind of {path} exposes {exposed}"
    node = host.node(real)
    if node is not None and node.kind == "chr":
        return f"{path} is a device node"
    return ""


def _unknown(route: Route, method: str, uri: str, body: bytes | None, facts: Facts) -> Decision:
    return Deny(
        f"gpu-alloc refused {method} {route.path}: it is not an Engine route gpu-alloc knows, "
        "and it might change device access"
    )


_CHECKS = {
    Check.START: _start,
    Check.RESTART: _restart,
    Check.UPDATE: _update,
    Check.EXEC: _exec,
    Check.SERVICE: _service,
    Check.PLUGIN_INSTALL: _plugin,
    Check.PLUGIN_UPGRADE: _plugin,
    Check.PLUGIN_ENABLE: _plugin,
    Check.PLUGIN_DISABLE: _plugin,
    Check.PLUGIN_CREATE: _plugin_create,
    Check.PLUGIN_SET: _plugin,
    Check.VOLUME_CREATE: _volume_create,
    Check.UNKNOWN: _unknown,
}


# ------------------------------------------------------------------- shim side


def shim_ask(spec: Mapping[str, Any], facts: Facts) -> Ask | Deny:
    """Turn a decoded create into an `Ask`, or refuse the fields no lease can cover."""
    grants = grants_of_create(spec, facts)
    if isinstance(grants, Deny):
        return grants
    lease_all = facts.privileged_mode == privileged.LEASE_ALL and privileged.asked(grants)
    refused = tuple(g for g in grants.refused() if not g.guarded and not lease_all)
    if refused:
        return Deny(_refusal_text(refused, SHIM_INSTEAD), refused[0].field)
    ask = ask_of(Access(tuple(g for g in grants.grants if g.leasable)))
    return replace(ask, required=(), count=0, every=True) if lease_all else ask
