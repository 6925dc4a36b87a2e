"""The simulated-GPU file: a host's GPUs as YAML, for tests and demos (NVML reads a real
host's: allocator/host/nvml.py; allocator/host/devices/ chooses between them).

A simulated-GPU file is a list of GPUs, or a mapping ``{gpus: [...],
cuda_driver_version: "12.4"}`` to simulate the driver's CUDA version too.
Links between GPUs are described per GPU, by peer index: ``nvlinks: {1: 12}``
(NVLinks to GPU 1), ``pcie: {1: single-switch}`` (the PCIe level, one of
`PCIE_LEVELS`), or ``pcie_switch: sw0`` (GPUs naming one switch share it).

A GPU entry may carry simulated health events (``xid: 79``, ``xids: [79]``,
``double_bit_ecc: 1``, ``single_bit_ecc: 3``) for the health watcher, and MIG
slices: ``migs: [{uuid: MIG-..., profile: 1g.10gb, memory_mib: 9984}]`` puts
the GPU in MIG mode with those slices.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from allocator.core.machine.inventory import GPU, PCIE_LEVELS, Inventory, InventoryError

__all__ = ["GPU", "Inventory", "InventoryError", "load_file"]
# Simulated health events on a GPU entry; allocator/host/devices/simulated.py reads them.
EVENT_KEYS = frozenset({"xid", "xids", "double_bit_ecc", "single_bit_ecc"})
SLICE_ONLY = frozenset({"parent", "mig_index", "profile"})  # set by the GPU's migs list
SLICE_KEYS = frozenset({"uuid", "profile", "memory_mib", "busy"})


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
    gpus, migs = [], []
    # usage: see allocator/host/devices/simulated.py
    allowed = (set(GPU.__dataclass_fields__) - SLICE_ONLY) | EVENT_KEYS | {"migs", "usage"}
    for n, entry in enumerate(data):
        if not isinstance(entry, dict) or "uuid" not in entry or "index" not in entry:
            raise InventoryError(f"{path}: entry {n}: needs 'uuid' and 'index'")
        unknown = set(entry) - allowed
        if unknown:
            raise InventoryError(f"{path}: entry {n}: unknown keys {sorted(unknown)}")
        if not isinstance(entry["uuid"], str) or not isinstance(entry["index"], int):
            raise InventoryError(f"{path}: entry {n}: uuid must be a string, index an integer")
        fields = {k: v for k, v in entry.items() if k not in EVENT_KEYS | {"migs", "usage"}}
        fields.update(_links(f"{path}: entry {n}", entry))
        mig: dict[str, Any] = {"mig_mode": True} if entry.get("migs") else {}
        gpu = GPU(**fields, **mig)
        gpus.append(gpu)
        migs += _slices(path, n, gpu, entry.get("migs") or [])
    try:
        return Inventory(tuple(sorted(gpus, key=lambda g: g.index)), version, tuple(migs))
    except InventoryError as e:
        raise InventoryError(f"{path}: {e}") from None


def _slices(path: str, n: int, gpu: GPU, entries: Any) -> list[GPU]:
    """A GPU's MIG slices: their own UUID, profile and memory; the rest is the GPU's."""
    if not isinstance(entries, list):
        raise InventoryError(f"{path}: entry {n}: migs must be a list of MIG slices")
    out = []
    for k, m in enumerate(entries):
        if not isinstance(m, dict) or not str(m.get("uuid", "")).startswith("MIG-"):
            raise InventoryError(f"{path}: entry {n}: migs[{k}] needs a 'uuid' starting MIG-")
        unknown = set(m) - SLICE_KEYS
        if unknown:
            raise InventoryError(f"{path}: entry {n}: migs[{k}]: unknown keys {sorted(unknown)}")
        out.append(
            replace(gpu, mig_mode=False, parent=gpu.uuid, mig_index=k, name=f"{gpu.name} MIG", **m)
        )
    return out


def _cuda_version(path: str, value: Any) -> tuple[int, int] | None:
    """``cuda_driver_version: "12.4"``: the CUDA version a simulated driver supports."""
    if value is None:
        return None
    major, dot, minor = str(value).partition(".")
    if not (major.isdigit() and dot and minor.isdigit()):
        raise InventoryError(f'{path}: cuda_driver_version must look like "12.4"')
    return int(major), int(minor)


def _links(where: str, entry: dict[str, Any]) -> dict[str, Any]:
    """``nvlinks`` and ``pcie`` mappings by peer index, as the GPU's tuples of pairs."""
    out: dict[str, Any] = {}
    for key, ok, want in (
        ("nvlinks", lambda v: isinstance(v, int) and v > 0, "a positive link count"),
        ("pcie", lambda v: v in PCIE_LEVELS, "one of " + ", ".join(PCIE_LEVELS)),
    ):
        given = entry.get(key) or {}
        if not isinstance(given, dict):
            raise InventoryError(f"{where}: {key} must map a peer GPU's index to {want}")
        for peer, value in given.items():
            if not isinstance(peer, int) or isinstance(value, bool) or not ok(value):
                raise InventoryError(f"{where}: {key}: {peer!r}: {value!r} is not {want}")
        out[key] = tuple(sorted(given.items()))
    if entry.get("pcie_switch") is not None:
        out["pcie_switch"] = str(entry["pcie_switch"])
    return out
