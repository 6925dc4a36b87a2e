"""CPU cores and memory leased with the GPUs, on the GPUs' NUMA node: pure decisions.

A create asks with labels (`Resources`): N physical cores, each with its SMT
siblings, and an amount of memory admitted against one node's size.  Cores are
taken from the GPUs' node first; ``strict`` refuses when that node is short,
``prefer`` (the default) spills to the other nodes, nearest number first.  A core
with any sibling reserved (``policy.reserved_cpus``) or leased is never given.
Memory is admitted on one node, which becomes the container's ``CpusetMems``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from allocator.core.api import numbers
from allocator.core.api.labels import (
    PLACED,
    REQUEST_CPUS,
    REQUEST_MEMORY,
    REQUEST_TOPOLOGY,
    lease_of,
)

CORES = numbers.whole("a whole number of physical cores, such as 8", high=1 << 16)
TOPOLOGIES = ("prefer", "strict")  # the values of REQUEST_TOPOLOGY

CONFLICTING = {
    # HostConfig field -> what a create must not set itself when it asks for it.
    "CpusetCpus": "cpus",
    "CpusetMems": "memory",
    "Memory": "memory",
}


@dataclass(frozen=True)
class Node:
    id: int
    cores: tuple[tuple[int, ...], ...]  # each physical core: its CPUs (SMT siblings)
    memory: int  # bytes


@dataclass(frozen=True)
class Topology:
    nodes: tuple[Node, ...]


@dataclass(frozen=True)
class Resources:
    """What a create asks for besides GPUs."""

    cpus: int = 0  # physical cores
    memory: int = 0  # bytes
    strict: bool = False

    @property
    def any(self) -> bool:
        return self.cpus > 0 or self.memory > 0


NOTHING = Resources()


def resources(asked: Mapping[str, Any] | None) -> Resources | str:
    """CPU cores and memory a create asks for by label, or why the labels are wrong."""
    given = asked or {}
    try:
        cpus = int(numbers.read(str(given.get(REQUEST_CPUS, "0")), CORES))
    except numbers.BadNumber as e:
        shown = str(given.get(REQUEST_CPUS)).strip()[:40]
        return f"{REQUEST_CPUS}={shown}: expected {CORES.expected}" + (
            "" if e.syntax else f" ({e})"
        )
    memory = 0
    if REQUEST_MEMORY in given:
        try:
            memory = parse_size(str(given[REQUEST_MEMORY]))
        except ValueError as e:
            return f"{REQUEST_MEMORY}: {e}"
    topology = str(given.get(REQUEST_TOPOLOGY, "prefer")).strip()
    if topology not in TOPOLOGIES:
        return f"{REQUEST_TOPOLOGY}={topology}: expected {' or '.join(TOPOLOGIES)}"
    return Resources(cpus, memory, topology == "strict")


@dataclass(frozen=True)
class Placed:
    cpus: tuple[int, ...]
    mems: tuple[int, ...]
    memory: int


def place(
    topology: Topology,
    want: Resources,
    gpu_nodes: Sequence[int],
    taken: Iterable[int],
    used_memory: Mapping[int, int],
    reserved: Iterable[int] = (),
) -> Placed | str:
    """Cores and memory for ``want``, or why not (plain words for the refusal)."""
    blocked = set(taken) | set(reserved)
    near = [n for n in topology.nodes if n.id in gpu_nodes]
    others = sorted((n for n in topology.nodes if n.id not in gpu_nodes), key=lambda n: n.id)
    order = near + ([] if want.strict else others)
    where = _where(near, want.strict)
    free = {n.id: [c for c in n.cores if not blocked & set(c)] for n in topology.nodes}
    cores: list[tuple[int, ...]] = []
    for n in order:
        cores += free[n.id][: want.cpus - len(cores)]
    if len(cores) < want.cpus:
        have = ", ".join(f"node {n.id}: {len(free[n.id])}" for n in order) or "no NUMA nodes"
        return (
            f"not enough free CPU cores: asked for {want.cpus} physical cores {where}, "
            f"free ({have}). Ask for fewer cores"
            + ("" if not want.strict else ", or use io.gpu-alloc.request.topology=prefer")
        )
    mems: tuple[int, ...] = ()
    if want.memory:
        home = next((n for n in order if n.memory - used_memory.get(n.id, 0) >= want.memory), None)
        if home is None:
            have = ", ".join(
                f"node {n.id}: {_size(n.memory - used_memory.get(n.id, 0))} of {_size(n.memory)}"
                for n in order
            )
            return (
                f"not enough free memory: asked for {_size(want.memory)} {where}, free "
                f"({have or 'no NUMA nodes'}). Ask for less memory"
            )
        mems = (home.id,)
    return Placed(tuple(sorted(c for core in cores for c in core)), mems, want.memory)


def _where(near: Sequence[Node], strict: bool) -> str:
    nodes = ", ".join(str(n.id) for n in near) or "none known"
    return f"on the GPUs' NUMA node ({nodes})" if strict else f"near the GPUs (node {nodes} first)"


def gpu_nodes(nodes: Iterable[int | None]) -> list[int]:
    """The NUMA nodes of the leased GPUs, the most GPUs first; unknown nodes dropped."""
    counts: dict[int, int] = {}
    for n in nodes:
        if n is not None:
            counts[n] = counts.get(n, 0) + 1
    return sorted(counts, key=lambda n: (-counts[n], n))


def conflicts(want: Resources, host_config: Mapping[str, Any] | None) -> str | None:
    """A create that sets the fields the lease would set: refused, not overridden."""
    asked = {"cpus": want.cpus > 0, "memory": want.memory > 0}
    clash = [f for f, what in CONFLICTING.items() if asked[what] and (host_config or {}).get(f)]
    if not clash:
        return None
    return (
        f"gpu-alloc refused the container create: it sets {', '.join(clash)} and asks "
        "gpu-alloc to lease CPU cores or memory (io.gpu-alloc.request.*), which set them; "
        "drop one or the other"
    )


def owned_fields(cpus: Sequence[int], memory: int) -> tuple[str, ...]:
    """The HostConfig fields a lease set, which ``docker update`` may not change."""
    return (("CpusetCpus", "CpusetMems") if cpus else ()) + (
        ("Memory", "CpusetMems") if memory else ()
    )


# --- Linux's list format ("0-3,8-11") and sizes ----------------------------------------------

_RANGE = re.compile(r"([0-9]{1,5})(?:-([0-9]{1,5}))?", re.ASCII)  # fullmatch: no final newline


def parse_list(text: str) -> list[int]:
    """The kernel's cpulist format; `ValueError` on anything else."""
    out: list[int] = []
    for part in filter(None, text.strip().split(",")):
        m = _RANGE.fullmatch(part.strip())
        if not m or (m[2] and int(m[2]) < int(m[1])):
            raise ValueError(f"'{text.strip()}' is not a CPU list such as 0-3,8")
        out += range(int(m[1]), int(m[2] or m[1]) + 1)
    return sorted(set(out))


def format_list(cpus: Iterable[int]) -> str:
    """``0-3,8`` for [0, 1, 2, 3, 8]: what ``CpusetCpus`` takes."""
    ranges: list[list[int]] = []
    for c in sorted(set(cpus)):
        if ranges and ranges[-1][1] == c - 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in ranges)


def parse_size(text: str) -> int:
    """Bytes from ``512m``, ``4g``, ``4GiB``: docker's own ``--memory`` format (go-units);
    `numbers.BadNumber` (a ValueError) on anything else."""
    return int(numbers.read(text, numbers.SIZE))


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}".replace(".0 ", " ")
    return f"{n} B"


def placed_of(info: Mapping[str, Any]) -> dict[str, Any]:
    """The cores and memory a container (its inspect) was leased, by `PLACED`: a `Claim`'s
    ``cpus``, ``mems`` and ``memory``.  Only on a container the shim made for a lease (it
    sets `PLACED` on every one, over any image's label of that name); an unreadable value
    counts as none."""
    given = ((info.get("Config") or {}).get("Labels")) or {}
    if not lease_of(given):
        return {}
    what = set(str(given.get(PLACED) or "").split(","))
    hc = info.get("HostConfig") or {}
    out: dict[str, Any] = {}
    if "cpus" in what and (cpus := _cpu_list(hc.get("CpusetCpus"))):
        out["cpus"] = cpus
    mems = _cpu_list(hc.get("CpusetMems"))
    memory = hc.get("Memory")
    if "memory" in what and isinstance(memory, int) and memory > 0 and mems:
        out["memory"], out["mems"] = memory, mems
    return out


def _cpu_list(value: Any) -> tuple[int, ...]:
    try:
        return tuple(parse_list(str(value or "")))
    except ValueError:
        return ()
