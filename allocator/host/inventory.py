"""The GPUs of this host: from NVML on a real host, from a YAML file in tests and demos.

UUIDs are the identity everywhere in gpu-alloc: indices change when a GPU
disappears or ``CUDA_DEVICE_ORDER`` differs, UUIDs do not.  Users may still name
a GPU by index, by full UUID or by a unique UUID prefix (as nvidia-docker v1's
``NV_GPU`` did); `Inventory.resolve` turns each into one GPU or an error.

A simulated-GPU file is a list of GPUs, or a mapping ``{gpus: [...],
cuda_driver_version: "12.4"}`` to simulate the driver's CUDA version too.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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


def load(source: str) -> Inventory:
    """``nvml`` reads the driver; anything else is the path of a simulated-GPU file."""
    if source == "nvml":
        from allocator.host import nvml

        return nvml.read()
    return load_file(source)


def load_file(path: str) -> Inventory:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise InventoryError(f"{path}: cannot read simulated GPUs: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise InventoryError(f"{path}: not valid YAML: {e}") from None
    version = None
    if isinstance(data, dict) and set(data) <= {"gpus", "cuda_driver_version"}:
        version = _cuda_version(path, data.get("cuda_driver_version"))
        data = data.get("gpus")
    if not isinstance(data, list):
        raise InventoryError(f"{path}: expected a list of GPUs ({{uuid, index}} each)")
    gpus = []
    allowed = {f for f in GPU.__dataclass_fields__ if f != "busy"} | {"busy"}
    for n, entry in enumerate(data):
        if not isinstance(entry, dict) or "uuid" not in entry or "index" not in entry:
            raise InventoryError(f"{path}: entry {n}: needs 'uuid' and 'index'")
        unknown = set(entry) - allowed
        if unknown:
            raise InventoryError(f"{path}: entry {n}: unknown keys {sorted(unknown)}")
        if not isinstance(entry["uuid"], str) or not isinstance(entry["index"], int):
            raise InventoryError(f"{path}: entry {n}: uuid must be a string, index an integer")
        gpus.append(GPU(**entry))
    try:
        return Inventory(tuple(sorted(gpus, key=lambda g: g.index)), version)
    except InventoryError as e:
        raise InventoryError(f"{path}: {e}") from None


def _cuda_version(path: str, value: Any) -> tuple[int, int] | None:
    """``cuda_driver_version: "12.4"``: the CUDA version a simulated driver supports."""
    if value is None:
        return None
    major, dot, minor = str(value).partition(".")
    if not (major.isdigit() and dot and minor.isdigit()):
        raise InventoryError(f'{path}: cuda_driver_version must look like "12.4"')
    return int(major), int(minor)
