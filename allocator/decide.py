"""Pure decisions: what the plugin answers and how the shim rewrites a create.

Rules
-----
1. Fail closed: a body we cannot read, a body that should be there and is not,
   a route we do not know, a field we cannot vet: deny, saying which and why.
2. One analysis for everyone: creates go through `access.of_create`, whichever
   socket they came through; the shim and the plugin differ only in what they
   do with a leasable ask (the shim leases and rewrites, the plugin checks the
   lease's token).
3. No I/O here.  A decision that needs the ledger comes back as `NeedsLease`
   and the caller (plugin/app.py, shim/create.py) does the locking.

Every denial says what was refused, why, and what to do instead, because the
docker CLI prints ``Msg`` to the user as it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from allocator import access, fields, gojson
from allocator.access import Access, Demand, EngineView, Host, Refusal
from allocator.inventory import GPU, Inventory
from allocator.placement import Policy
from allocator.routes import Check, Route, RouteError, classify

LABEL_PREFIX = "io.gpu-alloc."
LEASE_LABEL = LABEL_PREFIX + "lease"
HINT = "use 'docker --context gpu-alloc' and ask with --gpus or a Compose device reservation"
DEVICE_FIELDS = ("Devices", "DeviceRequests", "DeviceCgroupRules")
MIN_START_BODY_FREE_API = (1, 24)  # below it, start may carry a HostConfig


@dataclass(frozen=True)
class Facts:
    """The world a decision is made against."""

    inventory: Inventory
    engine: EngineView = field(default_factory=EngineView)
    host: Host = field(default_factory=Host)
    mounts_of: access.MountsOf | None = None  # another container's binds, for VolumesFrom


@dataclass(frozen=True)
class Allow:
    pass


@dataclass(frozen=True)
class Deny:
    msg: str


@dataclass(frozen=True)
class NeedsLease:
    """Allow only if the ledger has a pending lease ``lease_id`` for exactly ``gpus``."""

    lease_id: str
    token: str
    gpus: frozenset[str]


@dataclass(frozen=True)
class StartCheck:
    """Allow unless the ledger says ``ref`` handed its GPUs to a replacement."""

    ref: str


Decision = Allow | Deny | NeedsLease | StartCheck
ALLOW = Allow()


# ----------------------------------------------------------------- request phase


def authz_request(method: str, uri: str, body: bytes | None, facts: Facts) -> Decision:
    """The plugin's AuthZReq.  Reads and harmless writes return before any parsing."""
    try:
        route = classify(method, uri)
    except RouteError as e:
        return Deny(f"gpu-alloc refused {method} {uri}: {e}")
    if route.check in _CLEARED:
        return ALLOW
    return _CHECKS[route.check](route, method, uri, body, facts)


def clears_at_once(method: str, uri: str) -> bool:
    """True when the route table alone allows the call: no body, no facts, no ledger."""
    try:
        return classify(method, uri).check in _CLEARED
    except RouteError:
        return False


def _needs_body(route: Route, method: str, uri: str, body: bytes | None) -> Deny | None:
    if body:
        return None
    return Deny(
        f"gpu-alloc refused {method} {route.path}: the Engine passed no request body to the "
        "authorization plugin (it forwards only application/json bodies, up to 1 MiB, or "
        "4 MiB on Engines with the CVE-2026-34040 fix), and this request cannot be judged "
        "without it"
    )


def _create(route: Route, method: str, uri: str, body: bytes | None, facts: Facts) -> Decision:
    missing = _needs_body(route, method, uri, body)
    if missing:
        return missing
    try:
        spec = decode_create(body or b"")
        grants = access.of_create(spec, facts.engine, facts.inventory, facts.host, facts.mounts_of)
    except (gojson.BodyError, Refusal) as e:
        return Deny(f"gpu-alloc refused the container create: {e}")
    if grants.none:
        return ALLOW
    refused = grants.refused()
    if refused:
        return Deny(_refusal_text(refused))
    label = ((spec.get("Labels") or {}).get(LEASE_LABEL)) or ""
    lease_id, _, token = label.partition(".")
    first = grants.grants[0]
    if not lease_id or not token:
        return Deny(
            f"gpu-alloc refused the container create: {first.describe()} asks for GPUs "
            f"without a gpu-alloc lease; {HINT}"
        )
    if not grants.pinned:
        return Deny(
            f"gpu-alloc refused the container create: {first.describe()} is not pinned to "
            f"GPUs by UUID, so no lease can cover it; {HINT}"
        )
    gpus = grants.gpus(facts.inventory)
    guard = access.env_values(spec.get("Env") or (), access.VISIBLE)
    if [set(v.split(",")) for v in guard] != [set(gpus)]:
        return Deny(
            f"gpu-alloc refused the container create: Config.Env must set {access.VISIBLE} "
            f"once, to the leased GPUs {','.join(sorted(gpus))}; {HINT}"
        )
    return NeedsLease(lease_id, token, gpus)


def _refusal_text(refused: Sequence[access.Grant]) -> str:
    what = "; ".join(g.describe() for g in refused)
    return (
        f"gpu-alloc refused the container create: {what}. gpu-alloc leases GPUs only through "
        f"device requests (--gpus, Compose reservations) or the nvidia runtime with "
        f"NVIDIA_VISIBLE_DEVICES; {HINT}"
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


def _update(route: Route, method: str, uri: str, body: bytes | None, facts: Facts) -> Decision:
    missing = _needs_body(route, method, uri, body)
    if missing:
        return missing
    try:
        spec = gojson.decode(body or b"", fields.UPDATE_BODY)
    except gojson.BodyError as e:
        return Deny(f"gpu-alloc refused the container update: {e}")
    touched = [f for f in DEVICE_FIELDS if (spec or {}).get(f)]
    if touched:
        return Deny(
            f"gpu-alloc refused the container update: {', '.join(touched)} would change the "
            "container's device access; recreate the container through gpu-alloc instead"
        )
    return ALLOW


def _exec(route: Route, method: str, uri: str, body: bytes | None, facts: Facts) -> Decision:
    missing = _needs_body(route, method, uri, body)
    if missing:
        return missing
    try:
        spec = gojson.decode(body or b"", fields.EXEC_BODY)
    except gojson.BodyError as e:
        return Deny(f"gpu-alloc refused the exec: {e}")
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


def _plugin_install(
    route: Route, method: str, uri: str, body: bytes | None, facts: Facts
) -> Decision:
    missing = _needs_body(route, method, uri, body)
    if missing:
        return missing
    try:
        privileges = gojson.decode(body or b"", fields.PLUGIN_PRIVILEGES_BODY) or []
    except gojson.BodyError as e:
        return Deny(f"gpu-alloc refused the plugin install: {e}")
    for p in privileges:
        name = str((p or {}).get("Name") or "")
        values = [str(v) for v in (p or {}).get("Value") or ()]
        if name in ("device", "devices", "allow-all-devices") or (
            name == "mount" and any(_exposes(facts.host, v) for v in values)
        ):
            return Deny(
                f"gpu-alloc refused the plugin install: it asks for the privilege '{name}' "
                f"{values}, which can reach GPUs outside any lease"
            )
    return ALLOW


def _plugin_set(route: Route, method: str, uri: str, body: bytes | None, facts: Facts) -> Decision:
    missing = _needs_body(route, method, uri, body)
    if missing:
        return missing
    try:
        settings = gojson.decode(body or b"", fields.PLUGIN_SET_BODY) or []
    except gojson.BodyError as e:
        return Deny(f"gpu-alloc refused the plugin settings: {e}")
    for s in settings:
        key, _, value = str(s).partition("=")
        if "device" in key.lower() or _exposes(facts.host, value):
            return Deny(
                f"gpu-alloc refused the plugin setting '{s}': it can give the plugin device "
                "access outside any lease"
            )
    return ALLOW


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
    missing = _needs_body(route, method, uri, body)
    if missing:
        return missing
    try:
        spec = gojson.decode(body or b"", _VOLUME_BODY) or {}
    except gojson.BodyError as e:
        return Deny(f"gpu-alloc refused the volume create: {e}")
    opts = spec.get("DriverOpts") or {}
    device = str(opts.get("device") or "")
    if (spec.get("Driver") or "local") == "local" and device and _exposes(facts.host, device):
        return Deny(
            f"gpu-alloc refused the volume create: DriverOpts.device {device} would expose "
            "GPU devices or the Engine's control files to containers; bind a narrower path"
        )
    return ALLOW


def _exposes(host: Host, path: str) -> bool:
    if not path.startswith("/"):
        return False
    real = host.resolve(path)
    return any(access.within(real, p) or access.within(p, real) for p in host.protected)


def _unknown(route: Route, method: str, uri: str, body: bytes | None, facts: Facts) -> Decision:
    return Deny(
        f"gpu-alloc refused {method} {route.path}: it is not an Engine route gpu-alloc knows, "
        "and it might change device access"
    )


_CLEARED = (Check.ALLOW, Check.REMOVE)
_CHECKS = {
    Check.CREATE: _create,
    Check.START: _start,
    Check.UPDATE: _update,
    Check.EXEC: _exec,
    Check.SERVICE: _service,
    Check.PLUGIN_INSTALL: _plugin_install,
    Check.PLUGIN_CREATE: _plugin_create,
    Check.PLUGIN_SET: _plugin_set,
    Check.VOLUME_CREATE: _volume_create,
    Check.UNKNOWN: _unknown,
}


def decode_create(body: bytes) -> dict[str, Any]:
    """A create body as dockerd reads it, with the ambiguous old shapes refused."""
    spec = gojson.decode(body, fields.CREATE_BODY)
    if not isinstance(spec, dict):
        raise gojson.BodyError("the create body must be a JSON object")
    promoted = sorted(k for k in spec if k in fields.HOST_CONFIG and k not in fields.CONFIG)
    if promoted:
        raise gojson.BodyError(
            f'top-level {", ".join(promoted)}: HostConfig fields outside "HostConfig" are '
            'read differently by different Engine versions; put them inside "HostConfig"'
        )
    return spec


# ---------------------------------------------------------------- response phase


@dataclass(frozen=True)
class Bind:
    lease_id: str
    container: str


@dataclass(frozen=True)
class Release:
    lease_id: str


@dataclass(frozen=True)
class Forget:
    """A container was removed: end the lease of the container ``ref`` names."""

    ref: str


MIN_ID_PREFIX = 12  # a shorter reference could be a name: leave that one to reconcile


def authz_response(
    method: str, uri: str, body: bytes | None, status: int, response: bytes | None
) -> Bind | Release | Forget | None:
    """The plugin's AuthZRes: settle the lease of a create that carried one, or a removal."""
    if method == "DELETE":
        try:
            route = classify(method, uri)
        except RouteError:
            return None
        ref = route.name
        if (
            route.check is Check.REMOVE
            and status == 204
            and len(ref) >= MIN_ID_PREFIX
            and all(c in "0123456789abcdef" for c in ref)
        ):
            return Forget(ref)
        return None
    if method != "POST" or not body or LEASE_LABEL.encode() not in body:
        return None
    try:
        if classify(method, uri).check is not Check.CREATE:
            return None
        label = ((decode_create(body).get("Labels") or {}).get(LEASE_LABEL)) or ""
    except (RouteError, gojson.BodyError):
        return None
    lease_id = label.partition(".")[0]
    if not lease_id:
        return None
    if status == 201:
        try:
            container = gojson.decode(response or b"", fields.OPAQUE).get("Id")
        except (gojson.BodyError, AttributeError):
            container = None
        if isinstance(container, str) and container:
            return Bind(lease_id, container)
        return None  # created, but unreadable: reconciliation finds it by label
    return Release(lease_id) if 400 <= status < 500 else None


# ------------------------------------------------------------------- shim side


@dataclass(frozen=True)
class Ask:
    """What a create asks of the allocator, once its fields are understood."""

    required: tuple[str, ...]  # UUIDs named explicitly
    count: int  # further GPUs, any
    every: bool  # all GPUs of the host
    caps: tuple[str, ...]

    @property
    def any(self) -> bool:
        return self.every or self.count > 0 or bool(self.required)


def shim_ask(spec: Mapping[str, Any], facts: Facts) -> Ask | Deny:
    """Turn a decoded create into an `Ask`, or refuse the fields no lease can cover."""
    try:
        grants = access.of_create(spec, facts.engine, facts.inventory, facts.host, facts.mounts_of)
    except Refusal as e:
        return Deny(f"gpu-alloc refused the container create: {e}")
    refused = grants.refused()
    if refused:
        return Deny(_refusal_text(refused))
    return _ask(grants, facts.inventory)


def _ask(grants: Access, inventory: Inventory) -> Ask:
    required: list[str] = []
    count, every, caps = 0, False, []
    for g in grants.grants:
        d: Demand = g.demand  # type: ignore[assignment]  # refused() left only leasable ones
        every |= d.all
        count += d.count
        required += [u for u in sorted(g.gpus or ()) if u not in required]
        caps += [c for c in d.caps if c not in caps]
    return Ask(tuple(required), count, every, tuple(caps) or ("gpu",))


@dataclass(frozen=True)
class Shortage:
    msg: str


def place(
    ask: Ask, inventory: Inventory, held: Mapping[str, str], policy: Policy
) -> list[GPU] | Shortage:
    """Pick GPUs for `ask` among those not in ``held`` (UUID -> holder); all or nothing."""
    free = [g for g in inventory.gpus if g.uuid not in held and not g.busy]
    if ask.every:
        required = list(inventory.gpus)
        size = len(required)
    else:
        required = [g for g in inventory.gpus if g.uuid in ask.required]
        size = len(required) + ask.count
    taken = [g for g in required if g not in free]
    picked = None if taken else policy(free, required, size)
    if picked is not None:
        return picked
    return Shortage(_shortage_text(ask, size, free, taken, inventory, held))


def _shortage_text(
    ask: Ask,
    size: int,
    free: Sequence[GPU],
    taken: Sequence[GPU],
    inventory: Inventory,
    held: Mapping[str, str],
) -> str:
    asked = "all GPUs" if ask.every else f"{size} GPU{'s' * (size != 1)}"
    if taken:
        asked += " including " + ", ".join(f"GPU {g.index} ({g.uuid})" for g in taken)
    holders = "; ".join(
        f"GPU {g.index} held by {held[g.uuid]}"
        if g.uuid in held
        else f"GPU {g.index} busy with host processes"
        for g in inventory.gpus
        if g not in free
    )
    return (
        f"gpu-alloc: not enough free GPUs: asked for {asked}, {len(free)} of "
        f"{len(inventory.gpus)} free"
        + (f" ({holders})" if holders else "")
        + ". Remove a container that holds GPUs, or ask for fewer; 'gpu-alloc status' "
        "shows who holds what"
    )


def rewrite(
    spec: dict[str, Any], uuids: Sequence[str], label: str | None, caps: Sequence[str] = ("gpu",)
) -> dict[str, Any]:
    """The canonical body the shim forwards: UUID device request, guard env, lease label.

    Without GPUs (``label`` None) only the guard is added: ``void`` keeps an image's own
    ``NVIDIA_VISIBLE_DEVICES`` from reaching any GPU should a hook ever run.
    """
    out = dict(spec)
    hc = dict(out.get("HostConfig") or {})
    env = [e for e in (out.get("Env") or ()) if not str(e).startswith(access.VISIBLE + "=")]
    labels = {k: v for k, v in (out.get("Labels") or {}).items() if not k.startswith(LABEL_PREFIX)}
    if label is None:
        env.append(f"{access.VISIBLE}=void")
    else:
        env.append(f"{access.VISIBLE}={','.join(uuids)}")
        labels[LEASE_LABEL] = label
        if hc.get("DeviceRequests"):
            hc["DeviceRequests"] = [
                {
                    "Driver": "nvidia",
                    "Count": 0,
                    "DeviceIDs": list(uuids),
                    "Capabilities": [list(caps)],
                    "Options": {},
                }
            ]
    out["Env"] = env
    out["Labels"] = labels
    if hc or "HostConfig" in out:
        out["HostConfig"] = hc
    return out


def strip_labels(spec: dict[str, Any]) -> dict[str, Any]:
    """Client-supplied labels under gpu-alloc's prefix are never trusted: drop them."""
    labels = spec.get("Labels")
    if not isinstance(labels, dict) or not any(k.startswith(LABEL_PREFIX) for k in labels):
        return spec
    return {**spec, "Labels": {k: v for k, v in labels.items() if not k.startswith(LABEL_PREFIX)}}
