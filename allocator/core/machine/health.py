"""Each GPU's health as data: what NVML events do to it, and how it comes back.

Rules
-----
1. A critical Xid or a double-bit ECC error marks a GPU unhealthy; an
   unhealthy GPU is never placed and an explicit request for it is refused
   naming the event and its time.  Its current holder is only reported.
2. Xids that are the application's fault (the Kubernetes device plugin's list,
   `DEFAULT_IGNORED_XIDS`) and single-bit ECC errors change nothing; single-bit
   errors are counted so status can show a GPU that is wearing out.
3. A GPU comes back by ``gpu-alloc health clear`` or by the automatic probe:
   once ``recheck_after`` seconds have passed since its last event, the GPU is
   free and NVML still answers for it.  A new event restarts the wait.

Every change is a pure function from (`Health`, event) to `Health`, so the
watcher, the CLI and the tests share the one rule book (`EFFECTS`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

# The NVIDIA Kubernetes device plugin's applicationErrorXids: errors of the job, not the GPU.
DEFAULT_IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})

XID, DOUBLE_BIT, SINGLE_BIT = "xid", "double-bit ECC", "single-bit ECC"
MARK, COUNT, IGNORE = "mark unhealthy", "count", "ignore"


@dataclass(frozen=True)
class HealthPolicy:
    disabled: bool = False
    ignored_xids: frozenset[int] = DEFAULT_IGNORED_XIDS
    recheck_after: float = 300.0  # seconds; 0 turns the automatic probe off


@dataclass(frozen=True)
class GpuEvent:
    """One NVML event (or a simulated one) on one GPU."""

    uuid: str
    kind: str  # XID, DOUBLE_BIT or SINGLE_BIT
    at: float
    xid: int | None = None

    def describe(self) -> str:
        what = f"Xid {self.xid}" if self.kind == XID else f"a {self.kind} error"
        stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.at))
        return f"{what} at {stamp}"


@dataclass(frozen=True)
class GpuHealth:
    healthy: bool = True
    event: GpuEvent | None = None  # the event that made it unhealthy
    last_event: float = 0.0  # time of the latest critical event, for the probe
    single_bit: int = 0

    def reason(self) -> str:
        return "" if self.healthy or self.event is None else self.event.describe()


@dataclass(frozen=True)
class Health:
    gpus: Mapping[str, GpuHealth] = field(default_factory=dict)

    def of(self, uuid: str) -> GpuHealth:
        return self.gpus.get(uuid, GpuHealth())

    def unhealthy(self) -> dict[str, str]:
        """UUID -> why, for placement and status."""
        return {u: h.reason() for u, h in self.gpus.items() if not h.healthy}

    def with_gpu(self, uuid: str, h: GpuHealth) -> Health:
        return Health({**self.gpus, uuid: h})

    def to_json(self) -> dict[str, Any]:
        return {"version": 1, "gpus": {u: asdict(h) for u, h in sorted(self.gpus.items())}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Health:
        gpus = {}
        for uuid, raw in (data.get("gpus") or {}).items():
            event = raw.get("event")
            gpus[uuid] = GpuHealth(
                healthy=bool(raw.get("healthy", True)),
                event=GpuEvent(**event) if event else None,
                last_event=float(raw.get("last_event") or 0.0),
                single_bit=int(raw.get("single_bit") or 0),
            )
        return cls(gpus)


def effect(event: GpuEvent, policy: HealthPolicy) -> str:
    """What one event does, by the table of rules above."""
    if policy.disabled:
        return IGNORE
    if event.kind == SINGLE_BIT:
        return COUNT
    if event.kind == XID and event.xid in policy.ignored_xids:
        return IGNORE
    return MARK


def observe(health: Health, events: Iterable[GpuEvent], policy: HealthPolicy) -> Health:
    for ev in events:
        h = health.of(ev.uuid)
        what = effect(ev, policy)
        if what == COUNT:
            health = health.with_gpu(ev.uuid, replace(h, single_bit=h.single_bit + 1))
        elif what == MARK:
            first = ev if h.healthy else h.event
            health = health.with_gpu(
                ev.uuid, replace(h, healthy=False, event=first, last_event=ev.at)
            )
    return health


def clear(health: Health, uuid: str) -> Health:
    """The operator's word: the GPU is healthy again (its single-bit count is kept)."""
    return health.with_gpu(uuid, replace(health.of(uuid), healthy=True, event=None))


def probe_due(h: GpuHealth, now: float, policy: HealthPolicy) -> bool:
    """Is an unhealthy GPU due for the automatic probe?"""
    return not h.healthy and policy.recheck_after > 0 and now - h.last_event >= policy.recheck_after


def recover(
    health: Health, now: float, policy: HealthPolicy, free: set[str], answers: set[str]
) -> Health:
    """The automatic probe: due GPUs that are free and answer NVML become healthy."""
    for uuid, h in health.gpus.items():
        if probe_due(h, now, policy) and uuid in free and uuid in answers:
            health = clear(health, uuid)
    return health


def turns(before: Health, after: Health) -> list[tuple[str, bool, str]]:
    """(UUID, healthy now, what happened) for each GPU whose health turned: the audit
    trail's and the log's one account of it."""
    out = []
    for uuid, h in sorted(after.gpus.items()):
        old = before.of(uuid)
        if old.healthy and not h.healthy:
            out.append((uuid, False, f"unhealthy: {h.reason()}; it is no longer granted"))
        elif not old.healthy and h.healthy:
            out.append((uuid, True, f"healthy again (was: {old.reason()})"))
    return out
