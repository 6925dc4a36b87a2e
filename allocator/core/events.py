"""Audit records as data: one dict per grant, release, refusal, denial, hand-over, adoption,
a GPU's health turning, a restart policy gpu-alloc turned off, and a reservation made or
cancelled.

The record is built here from plain values (no clock, no file): the service passes
the time in, the host's `audit` module writes the line.  Keys are fixed, so
``gpu-alloc history`` and any log shipper read every line the same way.
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
) -> dict[str, Any]:
    if kind not in KINDS:
        raise ValueError(f"unknown audit event {kind!r}")
    return {
        "time": rfc3339(at),
        "event": kind,
        "owner": owner,
        "container": container,
        "name": name,
        "lease": lease,
        "gpus": list(gpus),
        "indices": [(indices or {}).get(u) for u in gpus],
        "reason": reason,
    }
