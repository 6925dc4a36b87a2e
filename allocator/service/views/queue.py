"""The creates waiting for GPUs, in the order they will be served (``gpu-alloc status``).

The queue itself lives in the shim's memory (shim/waitline.py); this is what it
shows of it: each waiter's place, what it asks for, and what it waits for, free
GPUs or its owner's own containers to go (their limit).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from allocator.core.leases.leases import State
from allocator.core.rules import policy, queue


def rows(
    waiting: Sequence[tuple[queue.Waiter, float]],
    state: State,
    rules: policy.Rules,
    now: float,
    usage: queue.Usage = None,
) -> list[dict[str, Any]]:
    """``waiting``: each waiter with the wall-clock time it joined; ``state``: the ledger;
    ``usage``: each owner's decayed use, when fair share orders the line."""
    since = {w.id: at for w, at in waiting}
    held = {w.owner: state.held_by(w.owner) for w, _ in waiting}
    out = []
    for position, w in enumerate(queue.order([w for w, _ in waiting], held, usage), 1):
        req = w.ask  # the service's LeaseRequest
        over = policy.over_limit(req.owner, held[w.owner], w.gpus, rules)
        limit = policy.limit_of(req.owner, rules) if over else None
        out.append(
            {
                "position": position,
                "owner": w.owner,
                "name": req.name,
                "gpus": w.gpus,
                "all": req.ask.every,
                "pool": req.want.pool,
                "priority": w.priority,
                "since": since[w.id],
                "waited_s": round(now - since[w.id]),
                "held_back_by": None
                if limit is None
                else f"{limit[1]}: {w.owner} holds {held[w.owner]} of {limit[0]}",
            }
        )
    return out
