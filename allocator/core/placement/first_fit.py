"""The lowest free indices: predictable, and what ``nvidia-smi`` users expect."""

from __future__ import annotations

from collections.abc import Sequence

from allocator.core.machine.inventory import GPU


def allocate(available: Sequence[GPU], required: Sequence[GPU], size: int) -> list[GPU] | None:
    if size < len(required) or any(g not in available for g in required):
        return None
    rest = sorted((g for g in available if g not in required), key=lambda g: g.index)
    picked = list(required) + rest[: size - len(required)]
    return sorted(picked, key=lambda g: g.index) if len(picked) == size else None
