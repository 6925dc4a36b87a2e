"""Inventory from the NVIDIA driver through NVML (nvidia-ml-py's ``pynvml``).

The module is passed in so tests can hand over a stand-in with the same
function names; on a host ``pynvml`` itself is used.  A GPU that runs host
compute processes is reported ``busy``: a job outside Docker is using it, so
placement skips it, as the reference design does.

Links between GPUs (for the best-effort placement) are read as go-gpuallocator
reads them: the PCIe level of each pair from ``nvmlDeviceGetTopologyCommonAncestor``,
and each active NVLink's far end from ``nvmlDeviceGetNvLinkRemotePciInfo``.  A far
end that is no GPU is an NVSwitch: two GPUs on the switches are joined by as many
links as the less-connected of them has.  Links only rank choices, so a driver
that cannot report them leaves the GPUs without links rather than unusable.
A GPU whose current MIG mode is on lists its slices: ``nvmlDeviceGetMaxMigDeviceCount``
bounds ``nvmlDeviceGetMigDeviceHandleByIndex`` (an empty index answers NOT_FOUND), and
each slice's profile is the tail of its NVML name (``NVIDIA H100 80GB HBM3 MIG 1g.10gb``).
The one setting gpu-alloc changes is a shared GPU's compute mode, EXCLUSIVE_PROCESS while
its MPS daemon runs (`NvmlModes`, allocator/host/mps.py); never MIG mode or another.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from itertools import combinations
from pathlib import Path
from typing import Any

from allocator.core.machine.inventory import GPU, Inventory, InventoryError
from allocator.core.timing.usage import Process, Usage

log = logging.getLogger("gpu-alloc")
# nvmlGpuTopologyLevel_t -> the inventory's PCIe level names.
TOPOLOGY_LEVELS = {
    0: "same-board",  # NVML_TOPOLOGY_INTERNAL
    10: "single-switch",  # NVML_TOPOLOGY_SINGLE
    20: "multi-switch",  # NVML_TOPOLOGY_MULTIPLE
    30: "host-bridge",  # NVML_TOPOLOGY_HOSTBRIDGE
    40: "same-cpu",  # NVML_TOPOLOGY_NODE
    50: "cross-cpu",  # NVML_TOPOLOGY_SYSTEM
}
NVLINK_MAX_LINKS = 36  # pynvml's NVML_NVLINK_MAX_LINKS; links past a GPU's last are errors
FEATURE_ENABLED = 1  # NVML_FEATURE_ENABLED
# nvmlComputeMode_t, by the names nvidia-smi -c takes.
COMPUTE_MODES = {0: "DEFAULT", 1: "EXCLUSIVE_THREAD", 2: "PROHIBITED", 3: "EXCLUSIVE_PROCESS"}
DEFAULT, EXCLUSIVE_PROCESS = 0, 3


def read(nvml: Any = None, sysfs: str = "/sys") -> Inventory:
    if nvml is None:
        try:
            import pynvml
        except ImportError as e:  # pragma: no cover - nvidia-ml-py is a dependency
            raise InventoryError(f"NVML: nvidia-ml-py is not installed: {e}") from None
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except Exception as e:
        raise InventoryError(
            f"NVML: cannot initialise the NVIDIA driver ({e}); is the driver loaded? "
            "Set 'gpus:' to a simulated-GPU file to run without one"
        ) from None
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        gpus = tuple(_gpu(nvml, i, h, sysfs) for i, h in enumerate(handles))
        gpus = _with_links(nvml, handles, gpus)
        migs = [
            m for g, h in zip(gpus, handles, strict=True) if g.mig_mode for m in _slices(nvml, h, g)
        ]
        version = _cuda_version(nvml)
    except Exception as e:
        raise InventoryError(f"NVML: reading the GPUs failed: {e}") from None
    finally:
        nvml.nvmlShutdown()
    return Inventory(tuple(gpus), cuda_driver_version=version, migs=tuple(migs))


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _gpu(nvml: Any, index: int, handle: Any, sysfs: str) -> GPU:
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


def _with_links(nvml: Any, handles: list[Any], gpus: tuple[GPU, ...]) -> tuple[GPU, ...]:
    try:
        pcie: dict[int, dict[int, str]] = {i: {} for i in range(len(gpus))}
        for a, b in combinations(range(len(gpus)), 2):
            level = TOPOLOGY_LEVELS.get(
                int(nvml.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b]))
            )
            if level:
                pcie[a][b] = pcie[b][a] = level
        nvlinks = _nvlinks(nvml, handles, gpus)
    except Exception as e:
        log.warning("NVML: GPU links unreadable (%s); placement ignores them", e)
        return gpus
    return tuple(
        replace(g, pcie=tuple(sorted(pcie[i].items())), nvlinks=tuple(sorted(nvlinks[i].items())))
        for i, g in enumerate(gpus)
    )


def _nvlinks(nvml: Any, handles: list[Any], gpus: tuple[GPU, ...]) -> dict[int, dict[int, int]]:
    """index -> {peer index: NVLinks}, switch links counted between every two GPUs on them."""
    by_bus = {_short(g.pci_bus_id): g.index for g in gpus}
    links: dict[int, dict[int, int]] = {g.index: {} for g in gpus}
    switched: dict[int, int] = {}
    for g, handle in zip(gpus, handles, strict=True):
        for link in range(NVLINK_MAX_LINKS):
            try:
                active = nvml.nvmlDeviceGetNvLinkState(handle, link) == FEATURE_ENABLED
            except Exception:
                break  # no NVLink on this GPU, or past its last link
            if not active:
                continue
            remote = _short(_text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
            peer = by_bus.get(remote)
            if peer is None:
                switched[g.index] = switched.get(g.index, 0) + 1
            elif peer != g.index:
                links[g.index][peer] = links[g.index].get(peer, 0) + 1
    for a, b in combinations(sorted(switched), 2):
        both = min(switched[a], switched[b])
        links[a][b] = links[a].get(b, 0) + both
        links[b][a] = links[b].get(a, 0) + both
    return links


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


def _short(bus_id: str) -> str:
    """NVML's bus id has an 8-digit domain; sysfs names the device with 4."""
    short = bus_id.lower()
    if len(short.split(":")[0]) == 8:
        short = short[4:]
    return short


def _numa_node(bus_id: str, sysfs: str) -> int | None:
    short = _short(bus_id)
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


def usage(nvml: Any = None) -> dict[str, Usage]:
    """UUID -> utilisation, memory, temperature, power and compute processes, now.

    A reading the GPU does not support (power on some boards, say) is left out
    rather than failing the whole view.
    """
    if nvml is None:
        import pynvml

        nvml = pynvml
    try:
        nvml.nvmlInit()
    except Exception as e:
        raise InventoryError(f"NVML: cannot initialise the NVIDIA driver ({e})") from None
    try:
        found = {}
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            memory = _try(nvml.nvmlDeviceGetMemoryInfo, h)
            util = _try(nvml.nvmlDeviceGetUtilizationRates, h)
            power = _try(nvml.nvmlDeviceGetPowerUsage, h)  # milliwatts
            procs = _try(nvml.nvmlDeviceGetComputeRunningProcesses, h)
            found[_text(nvml.nvmlDeviceGetUUID(h))] = Usage(
                utilization=None if util is None else util.gpu / 100,
                memory_used_bytes=None if memory is None else int(memory.used),
                memory_total_bytes=None if memory is None else int(memory.total),
                temperature_c=_try(nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU),
                power_w=None if power is None else power / 1000,
                processes=tuple(Process(int(p.pid), _memory(p.usedGpuMemory)) for p in procs or ()),
                processes_read=procs is not None,
            )
        return found
    except Exception as e:
        raise InventoryError(f"NVML: reading GPU use failed: {e}") from None
    finally:
        nvml.nvmlShutdown()


def _try(call: Any, *args: Any) -> Any:
    try:
        return call(*args)
    except Exception:
        return None


def _memory(value: Any) -> int | None:
    """NVML reports an unavailable per-process figure as a huge sentinel (or None)."""
    return int(value) if isinstance(value, int) and 0 <= value < 1 << 62 else None


class NvmlModes:
    """A GPU's compute mode, read and set through NVML (``nvml``: pynvml, or a stand-in
    with its names).  Setting one takes root; NVML's error says so otherwise."""

    def __init__(self, nvml: Any = None):
        self.nvml = nvml

    def get(self, uuid: str) -> int:
        with _session(self.nvml) as n:
            return int(n.nvmlDeviceGetComputeMode(n.nvmlDeviceGetHandleByUUID(uuid)))

    def set(self, uuid: str, mode: int) -> int:
        """Set ``uuid``'s compute mode to ``mode``; the mode it had."""
        with _session(self.nvml) as n:
            handle = n.nvmlDeviceGetHandleByUUID(uuid)
            before = int(n.nvmlDeviceGetComputeMode(handle))
            if before != mode:
                n.nvmlDeviceSetComputeMode(handle, mode)
            return before


@contextmanager
def _session(nvml: Any) -> Iterator[Any]:
    if nvml is None:
        import pynvml

        nvml = pynvml
    nvml.nvmlInit()
    try:
        yield nvml
    finally:
        nvml.nvmlShutdown()
