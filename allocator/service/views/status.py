"""``gpu-alloc status``: the ledger as people and scripts read it, each holder with its
container's name and state as the Engine lists them now."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from allocator.core.leases.clock import Now
from allocator.core.leases.leases import Lease
from allocator.core.machine.gpu_states import GpuState
from allocator.core.machine.health import GpuHealth
from allocator.core.machine.inventory import GPU
from allocator.core.machine.usage import ACTIVE, UNKNOWN, UNUSED
from allocator.core.rules import policy
from allocator.core.timing import timelimits
from allocator.host import clock as hostclock
from allocator.service import fair_share
from allocator.service.views import shares as shared_view
from allocator.service.views.gpus import LiveView
from allocator.service.wiring import Allocator

HOST = "host compute processes"
MIG_MODE = "MIG mode: leased as its slices"


def _state(c: dict[str, Any] | None) -> str:
    if c is None:
        return "unknown"
    state = str(c.get("State") or "unknown")
    if state == "exited":
        status = str(c.get("Status") or "")  # "Exited (0) 5 minutes ago"
        return status.lower().replace(" ago", "") + " ago" if status else "exited"
    return state


def snapshot(alloc: Allocator, live: LiveView | None = None) -> dict[str, Any]:
    got = (live or LiveView(alloc)).read()
    inventory, state, engine = got.inventory, got.ledger, got.containers
    clocks = hostclock.read()
    now = clocks.wall
    read = {s.uuid: s for s in got.gpus}
    held = {s.uuid: s.holder for s in got.gpus if s.holder is not None}
    holder_of = {u: h.to_dict() | {"since": rfc3339(h.since)} for u, h in held.items()}
    holders: dict[tuple[Any, ...], dict[str, Any]] = {}
    index = {g.uuid: g.index for g in inventory.gpus}
    slice_of = {m.uuid: f"{m.index}:{m.mig_index}" for m in inventory.migs}
    for uuid, h in held.items():
        c = engine.get(h.container or "")
        lease = state.leases.get(h.lease or "")
        entry = holders.setdefault(
            (h.lease, h.container),
            {
                "gpus": [],
                "slices": [],
                "uuids": [],
                "container": h.container,
                "name": (c["Names"][0].lstrip("/") if c and c.get("Names") else h.name),
                "state": _state(c) if h.container else "creating",
                "owner": {"uid": h.owner_uid, "user": h.owner},
                "since": rfc3339(h.since),
                "age_s": None if h.since is None else round(now - h.since),
                "pool": h.pool,
                "lease": h.lease,
                "why": h.why,
                "idle": False,
                "use": UNUSED,  # the lease's: unknown if any GPU's is, else active if any is
                # policy.time_limit: the lease's limit and what is left of it (None: none)
                "time_limit_s": lease.time_limit if lease else None,
                "time_left_s": None if lease is None else _left(lease, clocks),
                # the checkpoint signal (core/timing/checkpoint.py): which, its lead, and
                # when it was last sent (None: none, or not yet)
                "signal": (lease.signal or None) if lease else None,
                "signal_lead_s": lease.signal_lead if lease and lease.signal else None,
                "signalled_at": rfc3339(lease.signalled) if lease else None,
            },
        )
        entry["uuids"].append(uuid)
        entry["idle"] = entry["idle"] or read[uuid].idle_since is not None
        entry["use"] = max(entry["use"], read[uuid].use, key=(UNUSED, ACTIVE, UNKNOWN).index)
        if uuid in index:
            entry["gpus"].append(index[uuid])
        elif uuid in slice_of:
            entry["slices"].append(slice_of[uuid])
    for shown in holder_of.values():
        c = engine.get(shown.get("container") or "")
        if c and c.get("Names"):
            shown["name"] = c["Names"][0].lstrip("/")

    rules = alloc.gather.rules

    def row(s: GpuState, g: GPU) -> dict[str, Any]:
        swarm = policy.given_to_swarm(g, rules)  # never grantable here
        holder = holder_of.get(g.uuid)
        if holder is None and g.busy:
            holder = {"container": None, "name": None, "why": HOST}
        if holder is None and g.mig_mode:
            holder = {"container": None, "name": None, "why": MIG_MODE}
        return {
            **g.to_dict(),
            "free": s.free and not swarm,  # grantable now
            "swarm": swarm,
            "state": s.state,
            "container_state": s.container_state,
            "holder": holder,
            "idle_since": s.idle_since,
            "use": s.use,
            **_health(s.health),
        }

    gpus = [row(s, s.gpu) for s in got.gpus if s.gpu is not None and not s.gpu.is_slice]
    migs = [row(s, s.gpu) for s in got.gpus if s.gpu is not None and s.gpu.is_slice]
    departed = [s.uuid for s in got.gpus if s.gpu is None]
    return {
        "gpus": gpus,
        "migs": migs,
        "mig_policy": alloc.gather.policy.mig,
        "holders": sorted(holders.values(), key=lambda r: (r["gpus"] or [1 << 30], r["uuids"])),
        "leases": [
            vars(le) | {"gpus": list(le.gpus), "cpus": list(le.cpus), "mems": list(le.mems)}
            for le in state.leases.values()
        ],
        "claims": [
            vars(c)
            | {"gpus": None if c.gpus is None else list(c.gpus)}
            | {"cpus": list(c.cpus), "mems": list(c.mems)}
            for c in state.claims.values()
        ],
        "departed": [
            {"uuid": uuid, "state": "departed", "holder": holder_of[uuid]} for uuid in departed
        ],
        "free": sum(1 for g in gpus if g["free"]),
        "total": len(gpus),
        "fair_share": fair_share.table(alloc.fair_share, alloc.gather.rules.fair_share_half_life),
        "shared": shared_view.shared(inventory, rules, state),
        "shares": shared_view.shares(inventory, state, _names(engine)),
    }


def _names(engine: dict[str, Any]) -> dict[str, str]:
    return {cid: c["Names"][0].lstrip("/") for cid, c in engine.items() if c.get("Names")}


def _left(lease: Lease, now: Now) -> int | None:
    left = timelimits.left(lease, now)
    return None if left is None else round(left)


def _health(h: GpuHealth) -> dict[str, Any]:
    event = None if h.event is None else asdict(h.event) | {"what": h.event.describe()}
    return {"healthy": h.healthy, "health_event": event, "single_bit_ecc": h.single_bit}


def rfc3339(stamp: float | None) -> str | None:
    """A time as status shows it: to the second, in UTC."""
    if not stamp:
        return None
    return datetime.fromtimestamp(stamp, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
