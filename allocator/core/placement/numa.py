"""Keep a multi-GPU job on one NUMA node when it fits, on the tightest node.

Tightest fit leaves the emptier nodes whole for the next large request, the
reference design's behaviour; a request no node can hold spills across nodes,
fullest-first, so it touches as few nodes as possible.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from allocator.core.machine.inventory import GPU


def allocate(available: Sequence[GPU], required: Sequence[GPU], size: int) -> list[GPU] | None:
    if size < len(required) or any(g not in available for g in required):
        return None
    need = size - len(required)
    nodes: dict[int, list[GPU]] = defaultdict(list)
    for g in sorted(available, key=lambda g: g.index):
        if g not in required:
            nodes[-1 if g.numa_node is None else g.numa_node].append(g)
    wanted = {-1 if g.numa_node is None else g.numa_node for g in required}
    # Nodes already used by required GPUs first, then the tightest node that fits.
    fits = [n for n, gpus in nodes.items() if len(gpus) >= need]
    if fits:
        best = min(fits, key=lambda n: (n not in wanted, len(nodes[n]), n))
        return sorted(list(required) + nodes[best][:need], key=lambda g: g.index)
    picked = list(required)
    for n in sorted(nodes, key=lambda n: (n not in wanted, -len(nodes[n]), n)):
        picked += nodes[n][: size - len(picked)]
    return sorted(picked, key=lambda g: g.index) if len(picked) == size else None
