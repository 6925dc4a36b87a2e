"""Shared GPUs as ``status``, ``gpus``, the metrics and the dashboard show them: each
shared GPU's rule and shares out, and each share with who holds it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from allocator.core.leases.leases import Phase, State
from allocator.core.machine.inventory import Inventory
from allocator.core.placement.shares import out_of
from allocator.core.rules import sharing
from allocator.core.rules.policy import Rules


def shared(inventory: Inventory, rules: Rules, state: State) -> list[dict[str, Any]]:
    """One row per GPU policy.sharing names: its mode, shares, caps and shares out."""
    out = out_of(state.leases.values())
    rows = []
    for gpu in inventory.gpus:
        rule = sharing.rule_for(gpu, rules.sharing)
        if rule is None:
            continue
        rows.append(
            {
                "index": gpu.index,
                "uuid": gpu.uuid,
                "mode": rule.mode,
                "shares": rule.shares,
                "out": out[gpu.uuid].slots if gpu.uuid in out else 0,
                "memory_bytes": rule.memory_of(gpu),  # None: timeslice, nothing capped
                "threads_percent": rule.threads_of(),
                "said": rule.said(gpu),
            }
        )
    return rows


def shares(
    inventory: Inventory, state: State, names: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """One row per live share lease: its GPU, its part, and who holds it.  ``names``:
    container id -> its name, as the Engine lists it now."""
    index = {g.uuid: g.index for g in inventory.gpus}
    rows = []
    for le in state.leases.values():
        if not le.share_of or le.phase is Phase.HANDED_OVER:
            continue
        uuid = le.gpus[0]
        rows.append(
            {
                "index": index.get(uuid),
                "uuid": uuid,
                "share": f"{le.share_slots}/{le.share_of}",
                "fraction": sharing.fraction(le.share_slots, le.share_of),
                "lease": le.id,
                "owner": le.owner or "unknown",
                "user": le.share_user,
                "container": le.container,
                "name": (names or {}).get(le.container or "") or le.name,
                "state": le.state,
            }
        )
    return sorted(
        rows, key=lambda r: (r["index"] if r["index"] is not None else 1 << 30, r["lease"])
    )


def lines(snap: Mapping[str, Any]) -> list[str]:
    """``gpu-alloc status``'s lines for shared GPUs and their shares."""
    out = []
    for g in snap.get("shared") or ():
        out.append(f"GPU {g['index']} shared: {g['out']} of {g['shares']} out; {g['said']}")
        for s in snap.get("shares") or ():
            if s["uuid"] == g["uuid"]:
                who = s["name"] or (s["container"] or "")[:12] or "-"
                out.append(f"  share {s['share']}: {who} of {s['owner']} (lease {s['lease']})")
    return out
