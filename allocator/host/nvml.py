"""Inventory from the NVIDIA driver through NVML (nvidia-ml-py's ``pynvml``).

The module is passed in so tests can hand over a stand-in with the same
function names; on a host ``pynvml`` itself is used.  A GPU that runs host
compute processes is reported ``busy``: a job outside Docker is using it, so
placement skips it, as the reference design does.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from allocator.core.inventory import GPU, Inventory, InventoryError


def read(nvml: ModuleType | Any | None = None, sysfs: str = "/sys") -> Inventory:
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError as e:  # pragma: no cover - nvidia-ml-py is a dependency
            raise InventoryError(f"NVML: nvidia-ml-py is not installed: {e}") from None
    try:
        nvml.nvmlInit()
    except Exception as e:
        raise InventoryError(
            f"NVML: cannot initialise the NVIDIA driver ({e}); is the driver loaded? "
            "Set 'gpus:' to a simulated-GPU file to run without one"
        ) from None
    try:
        gpus = tuple(_gpu(nvml, i, sysfs) for i in range(nvml.nvmlDeviceGetCount()))
        version = _cuda_version(nvml)
    except Exception as e:
        raise InventoryError(f"NVML: reading the GPUs failed: {e}") from None
    finally:
        nvml.nvmlShutdown()
    return Inventory(gpus, cuda_driver_version=version)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _gpu(nvml: Any, index: int, sysfs: str) -> GPU:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    bus_id = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
    return GPU(
        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
        index=index,
        name=_text(nvml.nvmlDeviceGetName(handle)),
        memory_mib=int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // (1024 * 1024),
        pci_bus_id=bus_id,
        minor=int(nvml.nvmlDeviceGetMinorNumber(handle)),
        numa_node=_numa_node(bus_id, sysfs),
        busy=bool(nvml.nvmlDeviceGetComputeRunningProcesses(handle)),
    )


def _numa_node(bus_id: str, sysfs: str) -> int | None:
    """NVML's bus id has an 8-digit domain; sysfs names the device with 4."""
    short = bus_id.lower()
    if len(short.split(":")[0]) == 8:
        short = short[4:]
    try:
        node = int(Path(sysfs, "bus/pci/devices", short, "numa_node").read_text())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def _cuda_version(nvml: Any) -> tuple[int, int] | None:
    try:
        v = int(nvml.nvmlSystemGetCudaDriverVersion())
    except Exception:
        return None
    return (v // 1000, (v % 1000) // 10)
