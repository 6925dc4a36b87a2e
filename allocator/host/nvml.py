"""Inventory from the NVIDIA driver through NVML (nvidia-ml-py's ``pynvml``).

The module is passed in so tests can hand over a stand-in with the same
function names; on a host ``pynvml`` itself is used.  A GPU that runs host
compute processes is reported ``busy``: a job outside Docker is using it, so
placement skips it, as the reference design does.

A GPU whose current MIG mode is on lists its slices: ``nvmlDeviceGetMaxMigDeviceCount``
bounds ``nvmlDeviceGetMigDeviceHandleByIndex`` (an empty index answers NOT_FOUND), and
each slice's profile is the tail of its NVML name (``NVIDIA H100 80GB HBM3 MIG 1g.10gb``).
Only reads: gpu-alloc never changes MIG mode or any other GPU setting.
"""

from __future__ import annotations

from dataclasses import replace
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
        gpus, migs = [], []
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            gpu = _gpu(nvml, handle, i, sysfs)
            gpus.append(gpu)
            if gpu.mig_mode:
                migs += _slices(nvml, handle, gpu)
        version = _cuda_version(nvml)
    except Exception as e:
        raise InventoryError(f"NVML: reading the GPUs failed: {e}") from None
    finally:
        nvml.nvmlShutdown()
    return Inventory(tuple(gpus), cuda_driver_version=version, migs=tuple(migs))


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _gpu(nvml: Any, handle: Any, index: int, sysfs: str) -> GPU:
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
        mig_mode=_mig_mode(nvml, handle),
    )


def _mig_mode(nvml: Any, handle: Any) -> bool:
    """The current (not the pending) mode; GPUs without MIG answer NOT_SUPPORTED."""
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except nvml.NVMLError:
        return False
    return int(current) == nvml.NVML_DEVICE_MIG_ENABLE


def _slices(nvml: Any, handle: Any, gpu: GPU) -> list[GPU]:
    out = []
    for k in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, k)
        except nvml.NVMLError:
            continue  # no slice at this index
        name = _text(nvml.nvmlDeviceGetName(mig))
        try:
            busy = bool(nvml.nvmlDeviceGetComputeRunningProcesses(mig))
        except nvml.NVMLError:
            busy = False
        out.append(
            replace(
                gpu,
                uuid=_text(nvml.nvmlDeviceGetUUID(mig)),
                name=name,
                memory_mib=int(nvml.nvmlDeviceGetMemoryInfo(mig).total) // (1024 * 1024),
                busy=busy,
                mig_mode=False,
                parent=gpu.uuid,
                profile=name.rpartition("MIG ")[2] if "MIG " in name else "",
                mig_index=k,
            )
        )
    return out


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
