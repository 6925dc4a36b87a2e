"""Fake sysfs trees describing a machine's NUMA nodes, cores and memory, for CPU leases."""

from pathlib import Path

from allocator.core.machine.cpus import format_list

GIB = 1 << 30


def two_socket(root: Path, cores: int = 8, memory_gib: int = 64) -> Path:
    """2 nodes x ``cores`` physical cores x 2 threads, numbered like Intel servers:
    node 0 has CPUs 0..cores-1 and their siblings 2*cores.., node 1 the next ones."""
    total = 2 * cores
    nodes = {
        n: [c for c in range(n * cores, (n + 1) * cores)]
        + [c + total for c in range(n * cores, (n + 1) * cores)]
        for n in (0, 1)
    }
    siblings = {c: [c % total, c % total + total] for c in range(2 * total)}
    return write(root, nodes, siblings, memory_gib)


def write(
    root: Path, nodes: dict[int, list[int]], siblings: dict[int, list[int]], memory_gib: int
) -> Path:
    for n, cpus in nodes.items():
        d = root / f"devices/system/node/node{n}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "cpulist").write_text(format_list(cpus) + "\n")
        (d / "meminfo").write_text(
            f"Node {n} MemTotal:       {memory_gib * GIB // 1024} kB\nNode {n} MemFree:  1 kB\n"
        )
    for c, group in siblings.items():
        t = root / f"devices/system/cpu/cpu{c}/topology"
        t.mkdir(parents=True, exist_ok=True)
        (t / "thread_siblings_list").write_text(format_list(group) + "\n")
    return root
