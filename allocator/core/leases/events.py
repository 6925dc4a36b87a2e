"""Audit records as data: one dict per grant, release, refusal, denial, hand-over, adoption,
a GPU's health turning, a restart policy gpu-alloc turned off, a reservation made or
cancelled, a container it stopped (past its time limit, or idle) and one it sent its
checkpoint signal before such a stop.

The record is built here from plain values (no clock, no file): the service passes
the time in, the host's `audit` module writes the line.  Keys are fixed, so
``gpu-alloc history`` and any log shipper read every line the same way.
``waited_s`` is how long a create waited in line, on its grant or on the refusal
when its time ran out (None for a create that did not wait), and ``pool`` the pool
a lease was placed in, both for ``gpu-alloc report``.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

KINDS = (
    "grant",
    "release",
    "refusal",
    "denial",
    "hand-over",
    "adoption",
    "health",
    "restart-off",
    "reserve",
    "reserve-cancel",
    "time-limit",
    "idle-reclaim",
    "signal",
)
_INDEX = re.compile(r"\[\d+\]")


def rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds")


def parse_time(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def field_label(field: str) -> str:
    """``HostConfig.DeviceRequests[0]`` -> ``HostConfig.DeviceRequests``: bounded labels."""
    return _INDEX.sub("", field) or "other"


def record(
    kind: str,
    at: float,
    *,
    gpus: tuple[str, ...] | list[str] = (),
    indices: dict[str, int] | None = None,
    lease: str | None = None,
    container: str | None = None,
    name: str = "",
    owner: str | None = None,
    reason: str = "",
    waited_s: float | None = None,
    pool: str | None = None,
    share: str = "",
) -> dict[str, Any]:
    if kind not in KINDS:
        raise ValueError(f"unknown audit event {kind!r}")
    # ``share``: a share lease's part of its GPU ("1/4"), only on a share's lines
    return ({"share": share} if share else {}) | {
        "time": rfc3339(at),
        "event": kind,
        "owner": owner,
        "container": container,
        "name": name,
        "lease": lease,
        "gpus": list(gpus),
        "indices": [(indices or {}).get(u) for u in gpus],
        "reason": reason,
        "waited_s": None if waited_s is None else round(waited_s, 3),
        "pool": pool,
    }
