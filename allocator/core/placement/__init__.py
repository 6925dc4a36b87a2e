"""Placement policies: ``allocate(available, required, size)``, one policy a file.

The interface follows NVIDIA's go-gpuallocator: ``available`` are the free GPUs,
``required`` must be part of the answer, and the answer has ``size`` GPUs or is
``None`` (all-or-nothing: never a partial grant).  Policies are pure functions
of their arguments, so they are tested without any I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from allocator.core.placement import first_fit, numa
from allocator.host.inventory import GPU

Policy = Callable[[Sequence[GPU], Sequence[GPU], int], list[GPU] | None]

POLICIES: dict[str, Policy] = {
    "numa": numa.allocate,
    "first-fit": first_fit.allocate,
}
