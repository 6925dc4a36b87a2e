"""What a create asks of the allocator, once its fields are understood."""

from __future__ import annotations

from dataclasses import dataclass

from allocator.core.access.grants import Access


@dataclass(frozen=True)
class Ask:
    """What a create asks of the allocator, once its fields are understood."""

    required: tuple[str, ...]  # UUIDs named explicitly
    count: int  # further GPUs, any
    every: bool  # all GPUs of the host
    caps: tuple[str, ...]
    profile: str = ""  # a MIG profile (io.gpu-alloc.request.mig): count slices of it

    @property
    def any(self) -> bool:
        return self.every or self.count > 0 or bool(self.required)


def ask_of(grants: Access) -> Ask:
    """The leasable grants of a create, summed into one ask."""
    required: list[str] = []
    count, every, caps = 0, False, []
    for g in grants.grants:
        d = g.demand
        assert d is not None  # refused() left only leasable ones
        every |= d.all
        count += d.count
        required += [u for u in sorted(g.gpus or ()) if u not in required]
        caps += [c for c in d.caps if c not in caps]
    return Ask(tuple(required), count, every, tuple(caps) or ("gpu",))
