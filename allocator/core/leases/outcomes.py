"""What the Engine's answer to a create or a removal means for the ledger (pure).

The response phase: the plugin's ``AuthZRes`` and the shim, after forwarding a
leased create, both come here, so the two sockets follow one rule
(`create_outcome`); `allocator.service.leasebook.LeaseBook.settle` applies what it returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from allocator.core.api import fields, gojson, labels
from allocator.core.api.routes import Check, RouteError, classify


@dataclass(frozen=True)
class Bind:
    """A leased create answered 201: bind the lease to ``container`` if ``token`` is the
    lease's (a 201 to a create whose header was forged binds nothing).  ``admitted``: the
    plugin's own AuthZReq let this very request in, which it does only for a create
    whose header it checked (`verdicts`), so the token needs no second look."""

    lease_id: str
    container: str
    token: str
    admitted: bool = False


@dataclass(frozen=True)
class Unanswered:
    """A leased create answered with something other than 201: see `create_outcome`.
    Nothing is done unless ``token`` is the lease's: a made-up header frees nothing."""

    lease_id: str
    label: str  # the lease label value a container made by that create carries
    token: str = ""


@dataclass(frozen=True)
class Forget:
    """A container ``ref`` was removed.  ``ref`` is what the client typed, which dockerd
    resolved as full id, then exact name, then unique id prefix: it only says which
    leases to ask about.  A lease ends only once the Engine answers 404 for its
    container's full id (`LeaseBook.settle`)."""

    ref: str


Outcome = Bind | Unanswered | Forget


def authz_response(
    method: str,
    uri: str,
    status: int,
    response: bytes | None,
    headers: Mapping[str, Any] | None = None,
) -> Outcome | None:
    """The plugin's AuthZRes: settle the lease of a create that carried one (its lease
    header names it: the body is not read again), or a removal."""
    if method == "DELETE":
        try:
            route = classify(method, uri)
        except RouteError:
            return None
        if route.check is Check.REMOVE and status == 204 and route.name:
            return Forget(route.name)
        return None
    lease_id, token = labels.parse_lease_header(headers)
    if method != "POST" or not lease_id:
        return None
    try:
        if classify(method, uri).check is not Check.CREATE:
            return None
    except RouteError:
        return None
    return create_outcome(lease_id, token, status, response, admitted=True)


def create_outcome(
    lease_id: str, token: str, status: int, response: bytes | None, *, admitted: bool = False
) -> Bind | Unanswered | None:
    """The one rule for what the Engine's answer to a leased create means, on both sockets.

    201 binds the lease to the new container.  Any other answer proves nothing:
    dockerd may have created the container and failed the call after (a broken
    AuthZRes, a dropped connection), so the lease is freed only once the Engine shows no
    container carrying it (`Unanswered`).  A 201 whose id cannot be read leaves the
    lease pending; reconcile finds the container by label.
    """
    if status != 201:
        return Unanswered(lease_id, labels.lease_label(lease_id), token)
    try:
        answer = gojson.decode(response or b"", fields.OPAQUE)
    except gojson.BodyError:
        answer = None
    container = answer.get("Id") if isinstance(answer, dict) else None
    if isinstance(container, str) and container:
        return Bind(lease_id, container, token, admitted)
    return None
