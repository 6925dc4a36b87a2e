"""What effective access comes to: grants, each naming the field that caused it.

`allocator.core.access.access` produces an `Access` for a create body or a container;
the verdicts refuse what is not leasable, the shim leases what is, and adoption
records the rest as claims.  A grant that cannot be pinned to GPUs (``gpus`` None)
holds the whole inventory: fail closed.
"""

from __future__ import annotations

from dataclasses import dataclass

from allocator.core.machine.inventory import Inventory


class Refusal(Exception):
    """The request is malformed in a way dockerd would also refuse, or is ambiguous."""


@dataclass(frozen=True)
class Demand:
    """A leasable ask: ``count`` GPUs, every GPU, or the GPUs named in ``ids``."""

    count: int = 0
    all: bool = False
    ids: tuple[str, ...] = ()
    caps: tuple[str, ...] = ("gpu",)


@dataclass(frozen=True)
class Grant:
    field: str  # where it came from, e.g. "HostConfig.DeviceRequests[0]"
    detail: str  # what it asks, in words
    gpus: frozenset[str] | None  # UUIDs; None: cannot be pinned, holds every GPU
    demand: Demand | None = None  # set only for leasable sources
    # True when only the toolkit's reading of NVIDIA_VISIBLE_DEVICES grants it, so the
    # shim's NVIDIA_VISIBLE_DEVICES=void guard (appended last, it wins) takes it away.
    guarded: bool = False
    # True for a power over the host outside the allow-list (core/access/powers.py): its
    # detail is the whole refusal, what to do included.
    power: bool = False

    @property
    def leasable(self) -> bool:
        return self.demand is not None

    def describe(self) -> str:
        return f"{self.field}: {self.detail}"


@dataclass(frozen=True)
class Access:
    grants: tuple[Grant, ...] = ()

    @property
    def none(self) -> bool:
        return not self.grants

    @property
    def pinned(self) -> bool:
        return all(g.gpus is not None for g in self.grants)

    def gpus(self, inventory: Inventory) -> frozenset[str]:
        """The UUIDs held; unpinned grants hold the whole inventory."""
        held: set[str] = set()
        for g in self.grants:
            held |= inventory.uuids if g.gpus is None else g.gpus
        return frozenset(held)

    def refused(self) -> tuple[Grant, ...]:
        return tuple(g for g in self.grants if not g.leasable)
