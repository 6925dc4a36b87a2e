"""The GPUs of this host, as data: what placement, access and status decide against.

UUIDs are the identity everywhere in gpu-alloc: indices change when a GPU
disappears or ``CUDA_DEVICE_ORDER`` differs, UUIDs do not.  Users may still name
a GPU by index, by full UUID or by a unique UUID prefix (as nvidia-docker v1's
``NV_GPU`` did); `Inventory.resolve` turns each into one GPU or an error.

MIG
---
A GPU in MIG mode (``mig_mode``) is split into slices, listed in
`Inventory.migs`: each slice is a `GPU` whose ``parent`` is its GPU's UUID,
with its own ``MIG-`` UUID, ``profile`` (``1g.10gb``) and memory, and its
parent's index, minor and NUMA node.  A slice is named by its UUID or as the
toolkit does, ``GPU:SLICE`` (``0:1``).  `units` says which of GPUs and slices
are leased under each ``policy.mig``, as the Kubernetes device plugin's
strategies: ``none`` whole GPUs without MIG mode; ``single`` and ``mixed`` also
slices (``mixed`` asks for them by profile).

Shares
------
A GPU that ``policy.sharing`` shares is listed as its share slots too (`Inventory.slots`,
set by `Inventory.shared`), as the Kubernetes device plugin lists a shared GPU's
replicas: each slot a unit named ``<uuid>::<n>``.  A share lease takes slots of one GPU
(docs/sharing.md); the GPU's UUID is what its container is given.  A GPU and its slots
exclude each other (`Inventory.family`), as a GPU and its MIG slices do.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from typing import Any

from allocator.core.api.numbers import INDEX, maybe


class MigPolicy(StrEnum):
    """``policy.mig``: which of GPUs and slices are leased (`Inventory.units`), named
    as the NVIDIA Kubernetes device plugin's strategies.  A `StrEnum`, so the config,
    the status JSON and the messages spell each as the operator wrote it."""

    NONE = "none"
    SINGLE = "single"
    MIXED = "mixed"


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
    mig_mode: bool = False  # split into MIG slices; never leased whole then
    parent: str = ""  # for a MIG slice: its GPU's UUID
    profile: str = ""  # for a MIG slice: e.g. "1g.10gb"
    mig_index: int | None = None  # for a MIG slice: its index on its GPU

    @property
    def is_slice(self) -> bool:
        return bool(self.parent)

    def label(self) -> str:
        """How messages name it: ``GPU 0`` or ``MIG 0:1 (1g.10gb)``."""
        if self.is_slice:
            return f"MIG {self.index}:{self.mig_index} ({self.profile})"
        return f"GPU {self.index}"

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


@dataclass(frozen=True)
class Slot:
    """Share ``index`` of ``of`` on ``gpu``: the unit a share takes, as a slice is a MIG
    profile's."""

    gpu: GPU
    index: int
    of: int

    @property
    def uuid(self) -> str:
        return slot_uuid(self.gpu.uuid, self.index)


def slot_uuid(gpu: str, index: int) -> str:
    """The unit name of share ``index`` of the GPU ``gpu``: leases record the GPU and a
    count, so a share's slots are derived from them by this name."""
    return f"{gpu}::{index}"


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
    migs: tuple[GPU, ...] = ()  # MIG slices of the GPUs in MIG mode
    slots: tuple[Slot, ...] = ()  # share slots of the shared GPUs (`shared`)

    def __post_init__(self) -> None:
        uuids = [g.uuid for g in (*self.gpus, *self.migs)]
        indices = [g.index for g in self.gpus]
        if len(set(uuids)) != len(uuids):
            raise InventoryError("two GPUs share a UUID")
        if len(set(indices)) != len(indices):
            raise InventoryError("two GPUs share an index")
        in_mig_mode = {g.uuid for g in self.gpus if g.mig_mode}
        for m in self.migs:
            if m.parent not in in_mig_mode:
                raise InventoryError(f"MIG slice {m.uuid}: its GPU {m.parent} is not in MIG mode")
        whole = {g.uuid for g in self.gpus if not g.mig_mode}
        for slot in self.slots:
            if slot.gpu.uuid not in whole:
                raise InventoryError(f"share slot {slot.uuid}: its GPU is not leased whole")

    @functools.cached_property
    def uuids(self) -> frozenset[str]:
        """Every GPU and MIG slice: what an unpinned grant holds."""
        return frozenset(g.uuid for g in (*self.gpus, *self.migs))

    def slices_of(self, uuid: str) -> tuple[GPU, ...]:
        return tuple(m for m in self.migs if m.parent == uuid)

    def shared(self, shares: Mapping[str, int]) -> Inventory:
        """This inventory with each GPU in ``shares`` (UUID -> its count) listed as that
        many slots; a GPU in MIG mode is never shared."""
        slots = tuple(
            Slot(g, n, shares[g.uuid])
            for g in self.gpus
            if g.uuid in shares and not g.mig_mode
            for n in range(shares[g.uuid])
        )
        return replace(self, slots=slots)

    def slots_of(self, uuid: str) -> tuple[Slot, ...]:
        """The share slots of the GPU ``uuid``: none when it is leased whole only."""
        return tuple(s for s in self.slots if s.gpu.uuid == uuid)

    @functools.cached_property
    def _families(self) -> dict[str, frozenset[str]]:
        parts = [
            *((m.parent, m.uuid) for m in self.migs),
            *((s.gpu.uuid, s.uuid) for s in self.slots),
        ]
        fam = {
            g.uuid: frozenset({g.uuid, *(part for whole, part in parts if whole == g.uuid)})
            for g in self.gpus
        }
        fam.update({part: frozenset({part, whole}) for whole, part in parts})
        return fam

    def family(self, uuid: str) -> frozenset[str]:
        """What a grant of ``uuid`` excludes: a GPU excludes its MIG slices and share slots,
        each of them its GPU (slots of one GPU do not exclude each other)."""
        return self._families.get(uuid, frozenset({uuid}))

    def units(self, mig: MigPolicy) -> tuple[GPU, ...]:
        """What may be leased under ``policy.mig``."""
        whole = tuple(g for g in self.gpus if not g.mig_mode)
        return whole if mig is MigPolicy.NONE else whole + self.migs

    def by_minor(self, minor: int) -> GPU | None:
        return next((g for g in self.gpus if g.minor == minor), None)

    def resolve(self, ident: str) -> GPU:
        """One GPU for an index, a UUID, or a unique UUID prefix; `LookupError` otherwise."""
        ident = ident.strip()
        gpu, colon, mig = ident.partition(":")
        index, pair = maybe(ident, INDEX), (maybe(gpu, INDEX), maybe(mig, INDEX))
        if index is not None:
            found = [g for g in self.gpus if g.index == index]
        elif colon and None not in pair:
            found = [m for m in self.migs if (m.index, m.mig_index) == pair]
        else:
            every = (*self.gpus, *self.migs)
            found = [g for g in every if g.uuid == ident]
            if not found and ident.upper().startswith(("GPU-", "MIG-")) and len(ident) > 4:
                found = [g for g in every if g.uuid.startswith(ident)]  # any length, if unique
        if len(found) != 1:
            why = "matches several GPUs" if found else "is not a GPU on this host"
            tag = next(
                (g.uuid[:4] for g in (*self.gpus, *self.migs) if g.uuid[4:].startswith(ident)), ""
            )
            if ident and not found and tag:
                why += f"; a UUID prefix keeps its {tag} part: {tag}{ident}"
            known = ", ".join(f"{g.index}={g.uuid}" for g in self.gpus) or "none"
            known += "".join(f", {m.index}:{m.mig_index}={m.uuid}" for m in self.migs)
            raise LookupError(f"GPU '{ident}' {why} (GPUs: {known})")
        return found[0]
