"""The read models on the shim's socket: their paths, their JSON, and the client that
reads them back for users in the docker group who cannot read the state dir.

The paths are not Engine routes (dockerd has no /gpu-alloc), so the shim answers them
itself; explain is asked of the shim for the peer that asks, never for another user.
"""

from __future__ import annotations

import http.client
import json
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from allocator.core.api import numbers
from allocator.core.leases.leases import StateError
from allocator.host import unixhttp

EPOCH = numbers.Kind(
    "a time in seconds since 1970, such as 1767225600", fraction=True, high=253402300799
)

STATUS_PATH = "/gpu-alloc/v1/status"
QUEUE_PATH = "/gpu-alloc/v1/queue"  # the creates waiting in the shim's memory
GPUS_PATH = "/gpu-alloc/v1/gpus"
EXPLAIN_PATH = "/gpu-alloc/v1/explain"  # the asker is the peer
REPORT_PATH = "/gpu-alloc/v1/report"  # the asker's own rows
RESERVATIONS_PATH = "/gpu-alloc/v1/reservations"
PATHS = frozenset((STATUS_PATH, QUEUE_PATH, GPUS_PATH, RESERVATIONS_PATH))


def encode(view: Any) -> str:
    """A view as JSON, the same on the socket and in ``--json``."""
    return json.dumps(view, indent=2, sort_keys=True)


def explain_target(gpus: str, pairs: list[str]) -> str:
    """The shim's explain route for this request."""
    return f"{EXPLAIN_PATH}?{urlencode([('gpus', gpus), *(('label', p) for p in pairs)])}"


def explain_request(target: str) -> tuple[str, list[str]]:
    """(gpus, labels) from the route `explain_target` made."""
    query = parse_qs(urlsplit(target).query)
    return (query.get("gpus") or ["1"])[0], query.get("label") or []


def status(socket_path: str, why: str) -> dict[str, Any]:
    """The shim's ``gpu-alloc status``."""
    return _ask(socket_path, STATUS_PATH, why, timeout=30)


def gpus(socket_path: str) -> dict[str, Any]:
    """The shim's ``gpu-alloc gpus``."""
    try:
        code, body = unixhttp.request(socket_path, "GET", GPUS_PATH, timeout=30)
    except (OSError, http.client.HTTPException) as e:
        raise StateError(f"the shim at {socket_path} did not answer: {e}") from None
    if code != 200:
        raise StateError(f"the shim answered {code}: {body[:200]!r}")
    return json.loads(body)


def explain(socket_path: str, gpus: str, pairs: list[str], why: str) -> dict[str, Any]:
    """The shim's answer for whoever asks it (it knows them by their socket)."""
    return _ask(socket_path, explain_target(gpus, pairs), why, timeout=60)


def report_target(since: float, until: float | None, by: str) -> str:
    """The shim's report route for this window."""
    query = [("since", repr(since)), ("by", by), *([("until", repr(until))] if until else [])]
    return f"{REPORT_PATH}?{urlencode(query)}"


def report_request(target: str) -> tuple[float, float | None, str]:
    """(since, until, by) from the route `report_target` made; ValueError when malformed."""
    query = parse_qs(urlsplit(target).query)
    until = query.get("until")
    return (
        _epoch("--since", (query.get("since") or [""])[0]),
        _epoch("--until", until[0]) if until else None,
        (query.get("by") or ["user"])[0],
    )


def _epoch(flag: str, text: str) -> float:
    try:
        return float(numbers.read(text, EPOCH))
    except numbers.BadNumber as e:
        raise ValueError(f"{flag} {e}") from None


def report(socket_path: str, since: float, until: float | None, by: str) -> dict[str, Any]:
    """The shim's ``gpu-alloc report``: the asker's own rows."""
    why = "cannot read the audit trail in the state directory (it is root's)"
    return _ask(socket_path, report_target(since, until, by), why, timeout=60)


def reservations(socket_path: str) -> list[dict[str, Any]]:
    """The shim's ``gpu-alloc reservations``: their rows, as ``--json`` prints them."""
    why = "cannot read the reservations in the state directory (it is root's)"
    return list(_ask(socket_path, RESERVATIONS_PATH, why, timeout=30)["reservations"])


def queue(socket_path: str) -> list[dict[str, Any]] | None:
    """The shim's queue (it lives in the shim's memory); None when the shim does not answer."""
    try:
        code, body = unixhttp.request(socket_path, "GET", QUEUE_PATH, timeout=5)
        return list(json.loads(body)["queue"]) if code == 200 else None
    except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError):
        return None


def _ask(socket_path: str, target: str, why: str, timeout: float) -> dict[str, Any]:
    try:
        code, body = unixhttp.request(socket_path, "GET", target, timeout=timeout)
    except (OSError, http.client.HTTPException) as e:
        raise StateError(f"{why}; and the shim at {socket_path} did not answer: {e}") from None
    if code != 200:
        raise StateError(f"{why}; the shim answered {code}: {body[:200]!r}")
    try:
        return json.loads(body)
    except ValueError:
        raise StateError(f"{why}; the shim answered {body[:200]!r}") from None
