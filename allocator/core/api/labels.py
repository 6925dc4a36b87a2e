"""The labels gpu-alloc reads and writes on containers: one format, one parser.

Every label under `PREFIX` is gpu-alloc's alone: the shim strips any a client
sets before it adds its own, so a label seen on a container created through the
shim was written by gpu-alloc.  The lease label is the lease id alone: it tells
reconcile which lease a container was made for.  The proof that a create was
leased, the lease's secret token, travels in the `LEASE_HEADER` request header,
from the shim to dockerd to the plugin (dockerd hands the plugin the request's
headers): it is never stored on the container, so nobody reads it back with
``docker inspect``, and only the shim, which sends each token once, ever has it.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

PREFIX = "io.gpu-alloc."
LEASE = PREFIX + "lease"
LEASE_HEADER = "X-Gpu-Alloc-Lease"  # "<lease id>.<token>", as Go canonicalizes the name
HEADER_PREFIX = "x-gpu-alloc-"  # every request header under it is gpu-alloc's alone
REQUEST_CPUS = PREFIX + "request.cpus"
REQUEST_MEMORY = PREFIX + "request.memory"
REQUEST_TOPOLOGY = PREFIX + "request.topology"
MIG_REQUEST = PREFIX + "request.mig"  # a client's ask: count MIG slices of this profile
PLACED = PREFIX + "placed"  # which of HostConfig's cores and memory gpu-alloc leased it
POOL = PREFIX + "pool"  # a client's ask, and gpu-alloc's record of the pool leased from
MODEL = PREFIX + "request.model"
MIN_MEMORY = PREFIX + "request.min-memory"
OWNER = PREFIX + "owner"  # set by gpu-alloc only: "<uid>:<user>"
ENGINE_SOCKET = PREFIX + "engine-socket"  # set by the shim only (core/access/socket_binds.py)
DEFAULTS = PREFIX + "defaults"  # set by gpu-alloc only: what policy.gpu_defaults added
WAIT = PREFIX + "wait"  # a client's ask: wait this long for GPUs instead of a 409
TIME = PREFIX + "time"  # a client's ask: a time limit shorter than the policy's
SIGNAL = PREFIX + "signal"  # a client's ask: a checkpoint signal before a stop (api/signals.py)
SHARE = PREFIX + "share"  # a client's ask: a fraction of a shared GPU (core/rules/sharing.py)
SHARE_MEMORY = PREFIX + "memory"  # a client's ask: a share with this much GPU memory
# The labels a client may set to ask gpu-alloc for something, and the ones gpu-alloc sets
# itself (a client's own are stripped by the shim, and name no lease on the real socket).
# Any other key under `PREFIX` is a typo that would be ignored: refused by name.
REQUESTS = (
    POOL,
    MODEL,
    MIN_MEMORY,
    WAIT,
    TIME,
    SIGNAL,
    REQUEST_CPUS,
    REQUEST_MEMORY,
    REQUEST_TOPOLOGY,
    MIG_REQUEST,
    SHARE,
    SHARE_MEMORY,
)
KNOWN = frozenset((*REQUESTS, LEASE, OWNER, PLACED, DEFAULTS, ENGINE_SOCKET))


def mig_profile(labels: Mapping[str, Any] | None) -> str:
    """The MIG profile a create asks for (read before `strip` removes the label)."""
    return str((labels or {}).get(MIG_REQUEST) or "").strip()


def lease_label(lease_id: str) -> str:
    return lease_id


def lease_of(labels: Mapping[str, Any] | None) -> str:
    """The lease id a container's labels name ("" for none).  Containers made by 0.1,
    which labelled the token too, carry ``<lease id>.<token>``: the id is what comes first."""
    return str((labels or {}).get(LEASE) or "").partition(".")[0]


def lease_header(lease_id: str, token: str) -> str:
    return f"{lease_id}.{token}"


def parse_lease_header(headers: Mapping[str, Any] | None) -> tuple[str, str]:
    """(lease id, token) from a request's headers, the name matched as HTTP does (any
    case); empty strings where absent."""
    want = LEASE_HEADER.lower()
    value = next((str(v) for k, v in (headers or {}).items() if str(k).lower() == want), "")
    lease_id, _, token = value.partition(".")
    return lease_id, token


def strip(labels: Mapping[str, Any] | None) -> dict[str, Any]:
    """The labels without any under gpu-alloc's prefix."""
    return {k: v for k, v in (labels or {}).items() if not k.startswith(PREFIX)}


def unknown(labels: Mapping[str, Any] | None) -> str | None:
    """Why a create's labels must be refused: a key under `PREFIX` gpu-alloc does not
    know, in any case (label keys are case-sensitive in Docker, so ``IO.GPU-ALLOC.pool``
    is not gpu-alloc's label, yet it can only be meant as one); None when all are known."""
    for key in labels or {}:
        if not key.lower().startswith(PREFIX) or key in KNOWN:
            continue
        asked = key.lower().removeprefix(PREFIX)  # the shared prefix would make all alike
        close = difflib.get_close_matches(asked, [r.removeprefix(PREFIX) for r in REQUESTS], 1)
        meant = f" (did you mean {PREFIX}{close[0]}?)" if close else ""
        return (
            f"label {key} is not a gpu-alloc label{meant}, and gpu-alloc would ignore it; "
            f"label keys are case-sensitive. gpu-alloc's labels: {', '.join(REQUESTS)}"
        )
    return None
