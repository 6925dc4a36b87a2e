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

Here are the route of a call, the create's verdict and the shim's ask; what a
decision can be is in `decisions`, the checks of the other write routes in
`route_checks`.

Every denial says what was refused, why, and what to do instead, because the
docker CLI prints ``Msg`` to the user as it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from allocator.core.access import access, owned, privileged, socket_binds
from allocator.core.access.facts import EngineView, NotAsked
from allocator.core.access.grants import Access, Grant, Refusal
from allocator.core.access.owned import DoorCheck
from allocator.core.api import gojson, labels
from allocator.core.api.createbody import decode_create
from allocator.core.api.gojson import AnyBody, Body
from allocator.core.api.routes import CLEARED, Check, Route, RouteError, classify
from allocator.core.judging import service_marks
from allocator.core.judging.ask import Ask, ask_of
from allocator.core.judging.decisions import (
    ACCESS_READS,
    ALLOW,
    HINT,
    NO_FACT,
    START_READS,
    Allow,
    AllowStart,
    Decision,
    Deny,
    Fact,
    Facts,
    NeedsLease,
    StartCheck,
    Unread,
    UpdateCheck,
    context_hint,
)
from allocator.core.judging.route_checks import CHECKS, READS, needs_body, service
from allocator.core.judging.service_marks import Signing
from allocator.core.rules import power_grants, sharing

# The decisions are this module's answers: callers read them from here.
__all__ = [
    "ACCESS_READS",
    "ALLOW",
    "DOORS",
    "HINT",
    "SIGNED",
    "START_READS",
    "Allow",
    "AllowStart",
    "Decision",
    "Deny",
    "DoorCheck",
    "Fact",
    "Facts",
    "NeedsLease",
    "StartCheck",
    "Unread",
    "UpdateCheck",
    "authz_request",
    "cleared",
    "grants_of_create",
    "route_of",
    "shim_ask",
]

# Plain words for the grants people hit most, before the field that carries them.
# Fields whose refusal reads better in plain words first: (what, what to do about it).
PLAIN = {
    "HostConfig.Privileged": (
        "a privileged container sees every device on the host, every GPU included, so "
        "it is not allowed here",
        "remove --privileged, and add with --cap-add only what the container really needs; "
        "for Docker-in-Docker ask your operator for policy.powers: {privileged: {users: "
        "[you]}} (a privileged container holds every GPU while it exists)",
    ),
}
SHIM_INSTEAD = "ask for GPUs with --gpus N (or a Compose device reservation) instead"


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


def reads_facts(route: Route) -> frozenset[Fact]:
    """The facts `authz_request` reads for ``route`` (`route_checks.READS`); empty when
    it reads none, and then none is gathered for it (`unread` will do)."""
    return NO_FACT if cleared(route) else READS[route.check]


# What `shim_ask` reads: a create's grants, policy.privileged, and its owner's grants.
SHIM_ASK_READS = READS[Check.CREATE] - {Fact.SHIM_SOCKET} | {Fact.PRIVILEGED_MODE}
# The routes into a running container that an owned one keeps to its owner (`owned`).
DOORS = {
    Check.EXEC: owned.EXEC,
    Check.ARCHIVE: owned.COPY,
    Check.ATTACH: owned.ATTACH,
    Check.EXEC_START: owned.EXEC_START,
    Check.RENAME: owned.RENAME,
}
# The checks whose verdict reads the shim's marks on a request (`authz_request`'s signing).
SIGNED = frozenset({Check.CREATE, Check.SERVICE, *DOORS})


def unread() -> Facts:
    """Facts for a verdict that reads none (`reads_facts` empty): none gathered, so any
    read of one is `Unread`."""
    return Facts(None, EngineView(), NotAsked(()), gathered=NO_FACT)


def authz_request(
    route: Route,
    method: str,
    uri: str,
    body: AnyBody,
    facts: Facts,
    headers: Mapping[str, Any] | None = None,
    signing: Signing | None = None,
) -> Decision:
    """The verdict on a call before the Engine acts (the plugin's AuthZReq; the shim's
    non-create writes).  Reads and harmless writes return before any parsing, and
    touch no fact.  ``headers``: the request's, where a leased create carries its lease
    token (and, when its owner may bind the Engine's socket, the shim's mark:
    `socket_binds`) and a service write the shim's mark (`service_marks`), checked with
    ``signing`` (creates and services alone read them).  ``body``: its bytes, or the
    `gojson.Body` that keeps its decoding for the next time the call is judged."""
    if route.check is Check.RENAME:  # cleared by the table, but an owned container's own
        asker = owned.asker(headers, (signing or Signing()).key, method, uri)
        return DoorCheck(route.name, owned.RENAME, asker)
    if cleared(route):
        return ALLOW
    kept = Body.of(body)
    if route.check is Check.CREATE:
        key = (signing or Signing()).key
        binds = socket_binds.marked(headers, key, method, uri, kept.raw)
        lease = labels.parse_lease_header(headers)
        return _create(route, method, uri, kept, facts, lease, binds)
    if route.check is Check.SERVICE:
        sign = signing or Signing()
        marked = service_marks.marked(headers, sign.key, kept.raw)
        return service(route, method, uri, kept, facts, marked, sign.engine_socket, sign.charge)
    decision = CHECKS[route.check](route, method, uri, kept, facts)
    door = DOORS.get(route.check)
    if door is None or decision is not ALLOW:
        return decision
    if door == owned.ATTACH and not owned.feeds_stdin(route, method, uri, headers):
        return ALLOW  # it only reads the output, as `docker logs` does
    asker = owned.asker(headers, (signing or Signing()).key, method, uri)
    return DoorCheck(route.name, door, asker)  # settled on the container (`owned`)


def _create(
    route: Route,
    method: str,
    uri: str,
    body: Body,
    facts: Facts,
    lease: tuple[str, str] = ("", ""),
    binds_marked: bool = False,
) -> Decision:
    """A create: allowed when it reaches no GPU, or when everything it reaches is pinned
    to the GPUs of the pending lease that its lease header (``lease``: id, token) and
    its lease label both name.  ``binds_marked``: it carries the shim's mark for a create
    whose owner may bind the Engine's socket (`socket_binds`)."""
    missing = needs_body(route, method, uri, body)
    if missing:
        return missing
    try:
        spec = body.decoded(decode_create)
    except gojson.BodyError as e:
        return Deny(f"gpu-alloc refused the container create: {e}")
    forged = socket_binds.forged(spec, binds_marked)
    if forged:
        return Deny(forged, "Config.Labels")
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
    shared = _share_refusal(spec, grants)
    if shared is not None:
        return shared
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


def _share_refusal(spec: Mapping[str, Any], grants: Access) -> Deny | None:
    """A share's create (it binds its GPU's MPS directories) keeps its private /dev/shm:
    ``--ipc host`` (or another container's IPC) beside it is refused."""
    if not any(g.detail.startswith(sharing.BIND_DETAIL) for g in grants.grants):
        return None
    ipc = str((spec.get("HostConfig") or {}).get("IpcMode") or "")
    why = sharing.client_refusal((), ipc)
    return None if why is None else Deny(f"gpu-alloc refused the container create: {why}")


def grants_of_create(spec: Mapping[str, Any], facts: Facts) -> Access | Deny:
    """The create's effective access; without an inventory, only a create with none passes."""
    try:
        grants = access.of_create(
            spec, facts.engine, facts.known_gpus, facts.host, facts.container_of, facts.volume_of
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
    """Plain words first (`PLAIN`), then the field and its detail, then what to do.  A
    power outside the allow-list says all that itself (`powers`), and comes first."""
    powers = [g for g in refused if g.power]
    if powers:
        return "gpu-alloc refused the container create: " + "; ".join(g.describe() for g in powers)
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


# ------------------------------------------------------------------- shim side


def shim_ask(spec: Mapping[str, Any], facts: Facts) -> Ask | Deny:
    """Turn a decoded create into an `Ask`, or refuse the fields no lease can cover."""
    grants = grants_of_create(spec, facts)
    if isinstance(grants, Deny):
        return grants
    lease_all = privileged.asked(grants) and (
        facts.privileged_mode == privileged.LEASE_ALL
        or power_grants.may_use(facts.host, socket_binds.labelled(spec), privileged.POWER)
    )
    refused = tuple(g for g in grants.refused() if not g.guarded and not lease_all)
    if refused:
        return Deny(_refusal_text(refused, SHIM_INSTEAD), refused[0].field)
    ask = ask_of(Access(tuple(g for g in grants.grants if g.leasable)))
    return replace(ask, required=(), count=0, every=True) if lease_all else ask
