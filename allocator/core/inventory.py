"""The GPUs of this host, as data: what placement, access and status decide against.

UUIDs are the identity everywhere in gpu-alloc: indices change when a GPU
disappears or ``CUDA_DEVICE_ORDER`` differs, UUIDs do not.  Users may still name
a GPU by index, by full UUID or by a unique UUID prefix (as nvidia-docker v1's
``NV_GPU`` did); `Inventory.resolve` turns each into one GPU or an error.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


class InventoryError(Exception):
    """The GPU list could not be read; nothing may be allocated."""


@dataclass(frozen=True)
class GPU:
    uuid: str
    index: int
    name: str = "Simulated GPU"
    memory_mib: int = 0
    pci_bus_id: str = ""
    minor: int | None = None
    numa_node: int | None = None
    busy: bool = False  # host compute processes are running on it
    # Links to other GPUs, by peer index (tuples of pairs so the GPU stays hashable):
    # NVLinks joining the two, and the PCIe path's level (a `PCIE_LEVELS` name).
    nvlinks: tuple[tuple[int, int], ...] = ()
    pcie: tuple[tuple[int, str], ...] = ()
    pcie_switch: str | None = None  # GPUs under one PCIe switch (simulated files)

    def nvlinks_to(self, peer: int) -> int:
        return dict(self.nvlinks).get(peer, 0)

    def pcie_to(self, peer: GPU) -> str | None:
        """The PCIe level to ``peer``: as read, else from a shared switch or NUMA node."""
        level = dict(self.pcie).get(peer.index) or dict(peer.pcie).get(self.index)
        if level:
            return level
        if self.pcie_switch is not None and self.pcie_switch == peer.pcie_switch:
            return "single-switch"
        if self.numa_node is None or peer.numa_node is None:
            return None
        return "same-cpu" if self.numa_node == peer.numa_node else "cross-cpu"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["nvlinks"] = {str(k): v for k, v in self.nvlinks}
        d["pcie"] = {str(k): v for k, v in self.pcie}
        return d


# NVML's PCIe topology levels, closest first, named as the simulated-GPU file names them.
PCIE_LEVELS = (
    "same-board",
    "single-switch",
    "multi-switch",
    "host-bridge",
    "same-cpu",
    "cross-cpu",
)


@dataclass(frozen=True)
class Inventory:
    gpus: tuple[GPU, ...]
    cuda_driver_version: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        uuids = [g.uuid for g in self.gpus]
        indices = [g.index for g in self.gpus]
        if len(set(uuids)) != len(uuids):
            raise InventoryError("two GPUs share a UUID")
        if len(set(indices)) != len(indices):
            raise InventoryError("two GPUs share an index")

    @property
    def uuids(self) -> frozenset[str]:
        return frozenset(g.uuid for g in self.gpus)

    def by_minor(self, minor: int) -> GPU | None:
        return next((g for g in self.gpus if g.minor == minor), None)

    def resolve(self, ident: str) -> GPU:
        """One GPU for an index, a UUID, or a unique UUID prefix; `LookupError` otherwise."""
        ident = ident.strip()
        if ident.isdigit():
            found = [g for g in self.gpus if g.index == int(ident)]
        else:
            found = [g for g in self.gpus if g.uuid == ident]
            if not found and ident.upper().startswith("GPU-") and len(ident) >= 8:
                found = [g for g in self.gpus if g.uuid.startswith(ident)]
        if len(found) != 1:
            why = "matches several GPUs" if found else "is not a GPU on this host"
            known = ", ".join(f"{g.index}={g.uuid}" for g in self.gpus) or "none"
            raise LookupError(f"GPU '{ident}' {why} (GPUs: {known})")
        return found[0]
