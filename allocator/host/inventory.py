"""Reading the GPUs of this host: from NVML on a real host, from a YAML file in tests and demos.

A simulated-GPU file is a list of GPUs, or a mapping ``{gpus: [...],
cuda_driver_version: "12.4"}`` to simulate the driver's CUDA version too.
A GPU entry may carry simulated health events (``xid: 79``, ``xids: [79]``,
``double_bit_ecc: 1``, ``single_bit_ecc: 3``) for the health watcher.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from allocator.core.inventory import GPU, Inventory, InventoryError

__all__ = ["GPU", "Inventory", "InventoryError", "load", "load_file"]
# Simulated health events on a GPU entry; allocator/host/watcher.py reads them.
EVENT_KEYS = frozenset({"xid", "xids", "double_bit_ecc", "single_bit_ecc"})


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
    allowed = set(GPU.__dataclass_fields__) | EVENT_KEYS
    for n, entry in enumerate(data):
        if not isinstance(entry, dict) or "uuid" not in entry or "index" not in entry:
            raise InventoryError(f"{path}: entry {n}: needs 'uuid' and 'index'")
        unknown = set(entry) - allowed
        if unknown:
            raise InventoryError(f"{path}: entry {n}: unknown keys {sorted(unknown)}")
        if not isinstance(entry["uuid"], str) or not isinstance(entry["index"], int):
            raise InventoryError(f"{path}: entry {n}: uuid must be a string, index an integer")
        gpus.append(GPU(**{k: v for k, v in entry.items() if k not in EVENT_KEYS}))
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
