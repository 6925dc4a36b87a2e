"""Per-user limits for swarm services: a service's replicas × GPUs count for its owner.

A service created or updated through the shim carries its owner in a label of the
ServiceSpec (`labels.OWNER`, "<uid>:<user>", as on a leased container): the person who
last set the spec through the shim.  Its GPUs are its tasks × the GPUs of the swarm kind
each task reserves: ``Replicas`` for a replicated service, the ready and active nodes of
the swarm for a global one (placement constraints are not evaluated: an upper bound),
``MaxConcurrent`` for a replicated job.

The owner's policy limit (`policy.limit_of`) applies to their GPUs in swarm, across every
node, apart from their local leases on each host: a local limit is per host already, and
a local create on a worker cannot list the swarm's services.  A write is refused only when
it raises the owner's total past the limit, so scaling down or changing anything else
stays possible while they are over it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from allocator.core.api import labels
from allocator.core.rules import policy
from allocator.core.rules.policy import Owner, Refusal, Rules


def _field(obj: Any, name: str) -> Any:
    """``obj[name]`` of a spec dockerd stored or `services.decode` read: either spells each
    key as its field (`gojson` refuses a key that differs from its field by case)."""
    return obj.get(name) if isinstance(obj, Mapping) else None


def _count(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def per_task(spec: Mapping[str, Any], kind: str) -> int:
    """The GPUs of ``kind`` each task reserves (discrete values, and one per named one)."""
    reservations = ((spec.get("TaskTemplate") or {}).get("Resources") or {}).get("Reservations")
    total = 0
    for r in (reservations or {}).get("GenericResources") or ():
        discrete = r.get("DiscreteResourceSpec") or {}
        named = r.get("NamedResourceSpec") or {}
        if discrete.get("Kind") == kind:
            total += max(_count(discrete.get("Value"), 0), 0)
        if named.get("Kind") == kind:
            total += 1
    return total


def is_global(spec: Mapping[str, Any]) -> bool:
    """A global service or job: one task per node."""
    mode = spec.get("Mode")
    return _field(mode, "Global") is not None or _field(mode, "GlobalJob") is not None


def tasks(spec: Mapping[str, Any], nodes: int) -> int:
    """The tasks that may run at once: a spec without a mode is one replica, as dockerd
    makes it; a replicated job runs ``MaxConcurrent`` (default 1) at a time."""
    mode = spec.get("Mode")
    if is_global(spec):
        return nodes
    job = _field(mode, "ReplicatedJob")
    if job is not None:
        return max(_count(_field(job, "MaxConcurrent"), 1), 0)
    return max(_count(_field(_field(mode, "Replicated"), "Replicas"), 1), 0)


def gpus(spec: Mapping[str, Any], kind: str, nodes: int) -> int:
    """The service's GPUs of ``kind`` in swarm: its tasks × each task's reservation."""
    each = per_task(spec, kind)
    return each * tasks(spec, nodes) if each else 0


def owned(spec: Mapping[str, Any], owner: Owner) -> dict[str, Any]:
    """The spec labelled as ``owner``'s, without any other label under gpu-alloc's prefix
    (a client's own is never taken as its owner)."""
    given = labels.strip(spec.get("Labels"))
    return {**spec, "Labels": {**given, labels.OWNER: policy.owner_label(owner)}}


def owner_of(spec: Mapping[str, Any], unowned: str = "") -> str:
    """The user a stored service counts for; ``unowned`` when it has no owner label (one
    created on dockerd's own socket: root's, trusted, counted for nobody, or for the
    owner ``swarm.engine_socket_services: {charge: <owner>}`` names)."""
    found = policy.user_of_label(str((spec.get("Labels") or {}).get(labels.OWNER) or ""))
    return found or unowned


def totals(
    services: Iterable[tuple[str, Mapping[str, Any]]],
    user: str,
    target: str | None,
    new: Mapping[str, Any],
    kind: str,
    nodes: int,
    unowned: str = "",
) -> tuple[int, int]:
    """(before, after): ``user``'s GPUs in swarm over the stored ``services`` ((id, spec)),
    and with ``new`` in place of the service ``target`` (its id; None for a create).
    ``unowned``: whom a service without an owner label counts for (`owner_of`)."""
    before = others = 0
    for sid, spec in services:
        if owner_of(spec, unowned) != user:
            continue
        held = gpus(spec, kind, nodes)
        before += held
        if sid != target:
            others += held
    return before, others + gpus(new, kind, nodes)


def refusal(owner: Owner, before: int, after: int, rules: Rules) -> Refusal | None:
    """Refuse a service write that raises ``owner``'s GPUs in swarm past their limit."""
    limit = policy.limit_of(owner, rules)
    if limit is None or after <= limit[0] or after <= before:
        return None
    allowed, rule = limit
    return Refusal(
        f"gpu-alloc refused the swarm service: {owner.user} may hold {allowed} "
        f"GPU{'s' * (allowed != 1)} in swarm at once ({rule}), counted as replicas × "
        f"GPUs per task over their services, and this would make {after} (now {before}); "
        "scale a service down or remove one ('docker service scale', 'docker service rm'), "
        "or ask your operator"
    )
