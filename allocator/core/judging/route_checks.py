"""The checks of every write route but a create: start, update, exec, plugins, volumes.

`verdicts.authz_request` looks a route's check up in `CHECKS`; each reads only the
body and facts it needs and returns a `decisions.Decision`.  A body is decoded as
dockerd decodes it (`gojson`), and one the Engine did not pass is refused, since
the call cannot be judged without it.
"""

from __future__ import annotations

import functools
from typing import Any, overload

from allocator.core.access import advisories, builds, mounts, plugins
from allocator.core.access.facts import HostFacts, Unresolvable
from allocator.core.api import fields, gojson
from allocator.core.api.gojson import AnyBody, Body
from allocator.core.api.routes import Check, Route
from allocator.core.api.service_fields import SERVICE_SPEC
from allocator.core.judging import service_limits, service_marks, services
from allocator.core.judging.decisions import (
    ACCESS_READS,
    ALLOW,
    NO_FACT,
    Decision,
    Deny,
    Fact,
    Facts,
    StartCheck,
    UpdateCheck,
)
from allocator.core.leases import restarts

DEVICE_FIELDS = ("Devices", "DeviceRequests", "DeviceCgroupRules")
MIN_START_BODY_FREE_API = (1, 24)  # below it, start may carry a HostConfig


def needs_body(route: Route, method: str, uri: str, body: AnyBody) -> Deny | None:
    """The denial of a call that needs its body when the Engine passed none."""
    if Body.of(body).raw:
        return None
    return Deny(
        f"gpu-alloc refused {method} {route.path}: the Engine passed no request body to the "
        "authorization plugin (it forwards only application/json bodies, up to 1 MiB, or "
        "4 MiB on Engines with the CVE-2026-34040 fix), and this request cannot be judged "
        "without it"
    )


@overload
def _body_as(
    route: Route, method: str, uri: str, body: AnyBody, schema: fields.Struct, what: str
) -> dict[str, Any] | Deny: ...
@overload
def _body_as(
    route: Route, method: str, uri: str, body: AnyBody, schema: object, what: str
) -> object | Deny: ...
def _body_as(
    route: Route, method: str, uri: str, body: AnyBody, schema: object, what: str
) -> object | Deny:
    """The body decoded as dockerd decodes it, or the denial: missing or unreadable."""
    missing = needs_body(route, method, uri, body)
    if missing:
        return missing
    try:
        return Body.of(body).as_(schema)
    except gojson.BodyError as e:
        return Deny(f"gpu-alloc refused the {what}: {e}")


def _start(route: Route, method: str, uri: str, body: AnyBody, facts: Facts) -> Decision:
    if route.version is not None and route.version < MIN_START_BODY_FREE_API:
        return Deny(
            f"gpu-alloc refused container start on API {'.'.join(map(str, route.version))}: "
            "below 1.24 a start may replace the container's HostConfig, which gpu-alloc "
            "cannot vet; use a client that speaks API 1.24 or newer"
        )
    raw = Body.of(body).raw
    if raw and raw.strip() not in (b"", b"{}", b"null"):
        return Deny(
            "gpu-alloc refused container start: a start with a request body would replace "
            "the container's HostConfig; start it without one"
        )
    return StartCheck(route.name)


def _restart(route: Route, method: str, uri: str, body: AnyBody, facts: Facts) -> Decision:
    return StartCheck(route.name)  # a restart starts the container again: the same check


def _update(route: Route, method: str, uri: str, body: AnyBody, facts: Facts) -> Decision:
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


def _exec(route: Route, method: str, uri: str, body: AnyBody, facts: Facts) -> Decision:
    spec = _body_as(route, method, uri, body, fields.EXEC_BODY, "exec")
    if isinstance(spec, Deny):
        return spec
    if (spec or {}).get("Privileged"):
        return Deny(
            "gpu-alloc refused the exec: Privileged exec can reach devices the container "
            "was not granted; run the exec without --privileged"
        )
    return ALLOW


def _door(route: Route, method: str, uri: str, body: AnyBody, facts: Facts) -> Decision:
    """An attach or an exec's start: nothing in the call itself to refuse; whose the
    container is decides (`verdicts.DOORS`)."""
    return ALLOW


def service(
    route: Route,
    method: str,
    uri: str,
    body: AnyBody,
    facts: Facts,
    marked: bool = False,
    engine_socket: str = "refuse",
    charge: str = "",
) -> Decision:
    """A service create or update: its tasks never pass a plugin, so their spec is judged
    here, for every node (`services.refusal`); one the shim did not mark (``marked``) by
    what dockerd's own socket may set (`service_marks.unmarked_refusal`), and a GPU one
    then within the limit of the owner it is charged to (``charge``: `ChargeCheck`)."""
    spec = _body_as(route, method, uri, body, SERVICE_SPEC, "swarm service")
    if isinstance(spec, Deny):
        return spec
    owner = service_limits.owner_of(spec or {}) if marked else ""  # the shim's label
    why = services.refusal(
        spec or {}, facts.swarm_kind, facts.engine, facts.known_gpus, facts.host,
        facts.volume_of, owner,
    )  # fmt: skip
    if not why and not marked:
        why = service_marks.unmarked_refusal(spec or {}, facts.swarm_kind, engine_socket)
        gpus = service_limits.per_task(spec or {}, facts.swarm_kind)
        if not why and engine_socket == service_marks.CHARGE and charge and gpus:
            ref = route.name if route.path.endswith("/update") else None
            return service_marks.ChargeCheck(charge, ref, spec or {})
    return Deny(f"gpu-alloc refused the swarm service: {why}") if why else ALLOW


def _plugin_create(route: Route, method: str, uri: str, body: AnyBody, facts: Facts) -> Decision:
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


def _plugin(route: Route, method: str, uri: str, body: AnyBody, facts: Facts) -> Decision:
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


def _volume_create(route: Route, method: str, uri: str, body: AnyBody, facts: Facts) -> Decision:
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


def _buildkit(route: Route, method: str, uri: str, body: AnyBody, facts: Facts) -> Decision:
    """BuildKit's gRPC by an upgrade: refused while a build step could be given GPUs.

    The whole connection is refused, not one build: after the upgrade dockerd passes no
    further call to any plugin, so a build that asks for a device cannot be told apart
    from one that does not."""
    doors = builds.open_doors(facts.engine.version, facts.engine.builder)
    return Deny(builds.refusal(method, route.path, doors)) if doors else ALLOW


def _archive(route: Route, method: str, uri: str, body: AnyBody, facts: Facts) -> Decision:
    """Copying into a container: refused on an Engine an advisory says it is unsafe on."""
    found = advisories.denying(facts.engine.version, route.check)
    if found is None:
        return ALLOW
    return Deny(
        f"gpu-alloc refused {method} {route.path}: on this Engine it is {found.cve}: "
        f"{found.what}. Copy files in with a bind mount or an image instead; an "
        f"administrator can upgrade Docker to {found.fixed_in} or later"
    )


def _unknown(route: Route, method: str, uri: str, body: AnyBody, facts: Facts) -> Decision:
    return Deny(
        f"gpu-alloc refused {method} {route.path}: it is not an Engine route gpu-alloc knows, "
        "and it might change device access"
    )


CHECKS = {
    Check.START: _start,
    Check.RESTART: _restart,
    Check.UPDATE: _update,
    Check.EXEC: _exec,
    Check.ATTACH: _door,
    Check.EXEC_START: _door,
    Check.SERVICE: service,
    Check.PLUGIN_INSTALL: _plugin,
    Check.PLUGIN_UPGRADE: _plugin,
    Check.PLUGIN_ENABLE: _plugin,
    Check.PLUGIN_DISABLE: _plugin,
    Check.PLUGIN_CREATE: _plugin_create,
    Check.PLUGIN_SET: _plugin,
    Check.VOLUME_CREATE: _volume_create,
    Check.BUILDKIT: _buildkit,
    Check.ARCHIVE: _archive,
    Check.UNKNOWN: _unknown,
}


# The facts each route's verdict reads (`verdicts.authz_request`), every check listed:
# only these are gathered for it, and a read of another is `decisions.Unread`.  The
# tests make every route's verdict on recording facts and hold it to this table
# (tests/unit/test_fact_reads.py).  A create is judged in `verdicts`; a start's facts
# are read when it is resolved (`StartCheck`: allocator/service/restarts.py), not here.
_A_PLUGIN = frozenset({Fact.ENGINE, Fact.HOST})
READS: dict[Check, frozenset[Fact]] = {
    Check.ALLOW: NO_FACT,
    Check.REMOVE: NO_FACT,
    Check.RENAME: NO_FACT,
    Check.PRUNE: NO_FACT,
    Check.CREATE: ACCESS_READS | {Fact.CONTAINER_OF, Fact.SHIM_SOCKET},
    Check.START: NO_FACT,
    Check.RESTART: NO_FACT,
    Check.UPDATE: NO_FACT,
    Check.EXEC: NO_FACT,
    Check.ATTACH: NO_FACT,
    Check.EXEC_START: NO_FACT,
    Check.SERVICE: ACCESS_READS | {Fact.SWARM_KIND},
    Check.PLUGIN_INSTALL: _A_PLUGIN,
    Check.PLUGIN_UPGRADE: _A_PLUGIN,
    Check.PLUGIN_ENABLE: _A_PLUGIN,
    Check.PLUGIN_DISABLE: _A_PLUGIN,
    Check.PLUGIN_CREATE: NO_FACT,
    Check.PLUGIN_SET: _A_PLUGIN,
    Check.VOLUME_CREATE: frozenset({Fact.HOST}),
    Check.BUILDKIT: frozenset({Fact.ENGINE}),
    Check.ARCHIVE: frozenset({Fact.ENGINE}),
    Check.UNKNOWN: NO_FACT,
}
