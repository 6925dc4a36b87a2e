"""GPU time as data: held intervals and utilisation samples in, report rows out.

A *held* interval is one GPU of one use (`core.timing.uses`: a grant joined to its
release, the same intervals ``gpu-alloc history`` lists), from the grant to the
release or, still held, to ``now``.  Each report row adds, over the part of each
interval inside ``[since, until)``:

- GPU-seconds *held*;
- GPU-seconds *used*: held time weighted by the GPU's sampled utilisation (each
  `Bucket` is one sampling period's mean, e.g. a minute);
- GPU-seconds *idle*: held time in which the GPU ran no process at 0 %;
- GPU-seconds *unsampled*: held time no bucket covers (the shim was not sampling),
  counted neither used nor idle;
- grants, waits (count, total, longest; a create that waited in line, on its grant
  or on its refusal when its time ran out) and refusals by a bounded reason.

`decayed` is fair share's usage (Slurm's classic): each owner's GPU-seconds held,
each second weighted by ``2 ** (-age / half_life)``, integrated exactly.

Pure: ``now``, ``since`` and ``until`` come in; nothing here reads a clock or file.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from allocator.core.leases.events import parse_time

BY = ("user", "group", "pool", "gpu")
NONE = "-"  # the row of what has no group, pool or GPU (a refusal, an owner in no group)


@dataclass(frozen=True)
class Held:
    """One GPU of one use, from its grant to its release (None: still held)."""

    owner: str
    uuid: str
    index: int | None
    start: float
    end: float | None
    pool: str | None = None  # the pool its lease was placed in
    name: str = ""  # the holder container's name (its short id when it had none)
    part: float = 1.0  # the part of the GPU held: a share's fraction (core/rules/sharing.py)


@dataclass(frozen=True)
class Bucket:
    """One GPU's sampling period: its mean utilisation (0..1) and how much of it it ran."""

    start: float
    seconds: float
    utilization: float
    active: float  # the share of samples with a process or non-zero utilisation


Buckets = Mapping[str, Sequence[Bucket]]  # UUID -> its buckets, by start time


def held(uses: Iterable[dict[str, Any]]) -> list[Held]:
    """The held intervals of `core.timing.uses` rows, one per GPU of each use.  A use handed
    over to a Compose replacement holds its GPUs until the hand-over (the replacement's
    lease holds them from then), not until its own release."""
    rows = list(uses)
    handed = {
        r["lease"]: parse_time(r["from"])
        for r in rows
        if r.get("event") == "hand-over" and r.get("lease") and r.get("from")
    }
    found = []
    for row in rows:
        if row.get("event") != "use" or not row.get("from"):
            continue
        start = parse_time(row["from"])
        end = parse_time(row["to"]) if row.get("to") else None
        if row.get("lease") in handed and start <= handed[row["lease"]]:
            end = handed[row["lease"]] if end is None else min(end, handed[row["lease"]])
        gpus = row.get("gpus") or []
        indices = [*(row.get("indices") or []), *[None] * len(gpus)]
        for uuid, index in zip(gpus, indices, strict=False):
            owner, pool = row.get("owner") or "", row.get("pool")
            name = row.get("name") or (row.get("container") or "")[:12]
            part = share_part(row.get("share"))
            found.append(Held(owner, str(uuid), index, start, end, pool, name, part))
    return found


def share_part(share: Any) -> float:
    """A use's part of its GPU by its audit line's ``share`` ("1/4"); 1 for a whole GPU."""
    num, _, den = str(share or "").partition("/")
    return int(num) / int(den) if num.isdigit() and den.isdigit() and int(den) else 1.0


def clipped(h: Held, since: float, until: float) -> tuple[float, float] | None:
    """The part of ``h`` inside ``[since, until)``; ``until`` is at most now."""
    start, end = max(h.start, since), min(until if h.end is None else h.end, until)
    return (start, end) if end > start else None


def weighed(
    buckets: Sequence[Bucket], start: float, end: float, starts: Sequence[float] | None = None
) -> tuple[float, float, float]:
    """(used, idle, sampled) seconds of ``[start, end)`` by the buckets overlapping it
    (``starts``: the buckets' start times, when the caller has them at hand)."""
    used = idle = sampled = 0.0
    starts = [b.start for b in buckets] if starts is None else starts
    first = max(0, bisect_right(starts, start) - 1)
    for b in buckets[first:]:
        if b.start >= end:
            break
        overlap = min(end, b.start + b.seconds) - max(start, b.start)
        if overlap <= 0:
            continue
        sampled += overlap
        used += overlap * b.utilization
        idle += overlap * (1.0 - b.active)
    return used, idle, sampled


def decayed(intervals: Iterable[Held], now: float, half_life: float) -> dict[str, float]:
    """Owner -> GPU-seconds held, each weighted by ``2 ** (-age / half_life)``."""
    rate = math.log(2) / half_life
    usage: dict[str, float] = {}
    for h in intervals:
        start, end = h.start, min(now, now if h.end is None else h.end)
        if end <= start:
            continue
        weight = (math.exp(-rate * (now - end)) - math.exp(-rate * (now - start))) / rate
        usage[h.owner] = usage.get(h.owner, 0.0) + weight * h.part
    return usage


def shares(usage: Mapping[str, float]) -> dict[str, float]:
    """Owner -> their part (0..1) of everyone's decayed usage, for explain and status."""
    total = sum(usage.values())
    return {o: (u / total if total else 0.0) for o, u in usage.items()}


def reason_kind(reason: str) -> str:
    """A refusal's reason as one of a few kinds, so rows and labels stay bounded."""
    text = reason.lower()
    for needle, kind in (
        ("kept for", "kept for the line"),
        ("policy.limits", "owner limit"),
        ("policy.pools", "pool"),
        ("unhealthy", "unhealthy"),
        ("not enough free", "short of GPUs"),
        ("cuda", "CUDA version"),
        ("mig", "MIG"),
    ):
        if needle in text:
            return kind
    return "other policy"


COUNTED = ("use", "refusal", "denial")  # the events a row counts: grants, waits, refusals


@dataclass(frozen=True)
class Window:
    since: float
    until: float  # at most now


def rows(
    uses: Sequence[dict[str, Any]],
    buckets: Buckets,
    window: Window,
    by: str,
    key: Callable[[str, Held | None], Iterable[str]],
) -> list[dict[str, Any]]:
    """One row per ``key`` value, sorted by GPU-hours held (most first), then name.

    ``key(owner, held)`` names the rows an owner's interval (or, with None, a grant,
    wait or refusal that names no GPU) counts in: several groups or pools count it
    in each.
    """
    table: dict[str, dict[str, Any]] = {}
    starts = {uuid: [b.start for b in bs] for uuid, bs in buckets.items()}

    def row(name: str) -> dict[str, Any]:
        return table.setdefault(name, _empty(by, name))

    for h in held(uses):
        span = clipped(h, window.since, window.until)
        if span is None:
            continue
        used, idle, sampled = weighed(buckets.get(h.uuid, ()), *span, starts.get(h.uuid, []))
        for name in key(h.owner, h):
            r = row(name)
            r["gpu_seconds_held"] += (span[1] - span[0]) * h.part
            r["gpu_seconds_used"] += used * h.part
            r["gpu_seconds_idle"] += idle * h.part
            r["gpu_seconds_unsampled"] += (span[1] - span[0] - sampled) * h.part
    for e in uses:
        if e.get("event") not in COUNTED:  # a reservation, a health turn: no row of its own
            continue
        if not e.get("from") or not window.since <= parse_time(e["from"]) < window.until:
            continue
        owner, event = e.get("owner") or "", e.get("event")
        names = list(key(owner, None)) if event != "use" else _use_keys(e, owner, key)
        for name in names:
            r = row(name)
            if event == "use":
                r["grants"] += 1
            elif event in ("refusal", "denial"):
                why = "denied" if event == "denial" else reason_kind(e.get("reason") or "")
                r["refusals"][why] = r["refusals"].get(why, 0) + 1
            waited = e.get("waited_s")
            if event in ("use", "refusal") and waited is not None:
                r["waits"] += 1
                r["wait_seconds_total"] += waited
                r["wait_seconds_longest"] = max(r["wait_seconds_longest"], waited)
    return [
        _hours(r) for r in sorted(table.values(), key=lambda r: (-r["gpu_seconds_held"], r[by]))
    ]


def _use_keys(
    use: dict[str, Any], owner: str, key: Callable[[str, Held | None], Iterable[str]]
) -> list[str]:
    """The rows a grant counts in: those of its GPUs, each row once."""
    names: dict[str, None] = {}
    for h in held([{**use, "to": None}]):
        names.update(dict.fromkeys(key(owner, h)))
    return list(names) or list(key(owner, None))


def _empty(by: str, name: str) -> dict[str, Any]:
    return {
        by: name,
        "gpu_seconds_held": 0.0,
        "gpu_seconds_used": 0.0,
        "gpu_seconds_idle": 0.0,
        "gpu_seconds_unsampled": 0.0,
        "grants": 0,
        "waits": 0,
        "wait_seconds_total": 0.0,
        "wait_seconds_longest": 0.0,
        "refusals": {},
    }


def _hours(r: dict[str, Any]) -> dict[str, Any]:
    """GPU-seconds as GPU-hours, rounded for reading (the seconds stay in the JSON)."""
    out = dict(r)
    for what in ("held", "used", "idle", "unsampled"):
        out[f"gpu_hours_{what}"] = round(r[f"gpu_seconds_{what}"] / 3600, 4)
        out[f"gpu_seconds_{what}"] = round(r[f"gpu_seconds_{what}"], 3)
    out["wait_seconds_total"] = round(r["wait_seconds_total"], 3)
    out["wait_seconds_longest"] = round(r["wait_seconds_longest"], 3)
    return out
