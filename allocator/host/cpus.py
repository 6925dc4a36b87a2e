"""The host's CPU topology from sysfs: NUMA nodes, their physical cores and memory.

``root`` is sysfs's mount point (config ``sysfs``), so tests describe any machine
with a few files: ``devices/system/node/nodeN/{cpulist,meminfo}`` and
``devices/system/cpu/cpuN/topology/thread_siblings_list``.  A kernel without
NUMA nodes is one node 0 holding every CPU, and no known memory.
"""

from __future__ import annotations

import re
from pathlib import Path

from allocator.core.machine.cpus import Node, Topology, parse_list

_MEMTOTAL = re.compile(r"MemTotal:\s+(\d+)\s*kB")


class TopologyError(Exception):
    """sysfs could not be read; CPU and memory requests cannot be placed."""


def read(root: str = "/sys") -> Topology:
    base = Path(root, "devices/system")
    try:
        node_dirs = sorted(base.glob("node/node[0-9]*"), key=lambda p: int(p.name[4:]))
        if node_dirs:
            nodes = [
                (int(d.name[4:]), parse_list((d / "cpulist").read_text()), _memory(d))
                for d in node_dirs
            ]
        else:
            cpus = sorted(int(p.name[3:]) for p in base.glob("cpu/cpu[0-9]*"))
            nodes = [(0, cpus, 0)]
        return Topology(tuple(Node(n, _cores(base, cpus), memory) for n, cpus, memory in nodes))
    except (OSError, ValueError) as e:
        raise TopologyError(f"cannot read the CPU topology under {base}: {e}") from None


def _memory(node_dir: Path) -> int:
    m = _MEMTOTAL.search((node_dir / "meminfo").read_text())
    return int(m[1]) * 1024 if m else 0


def _cores(base: Path, cpus: list[int]) -> tuple[tuple[int, ...], ...]:
    """The node's CPUs grouped into physical cores by their SMT siblings, in CPU order."""
    cores: dict[tuple[int, ...], None] = {}
    online = set(cpus)
    for cpu in cpus:
        siblings = base / f"cpu/cpu{cpu}/topology/thread_siblings_list"
        group = parse_list(siblings.read_text()) if siblings.exists() else [cpu]
        cores[tuple(c for c in group if c in online) or (cpu,)] = None
    return tuple(sorted(cores, key=min))
