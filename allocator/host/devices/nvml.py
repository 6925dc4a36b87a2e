"""The NVIDIA driver as the GPU source: NVML's inventory, use and health events.

The reading itself is allocator/host/nvml.py; this module adds the event subscription
and the source's face.  ``nvml`` is pynvml or a stand-in with its names (tests).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from allocator.core.machine.health import DOUBLE_BIT, SINGLE_BIT, XID, GpuEvent
from allocator.core.machine.inventory import Inventory
from allocator.core.machine.usage import Usage
from allocator.host import nvml as reader

log = logging.getLogger("gpu-alloc.health")
MAX_AGE = 10.0  # seconds an inventory read from NVML is kept


def _pynvml() -> Any:
    import pynvml

    return pynvml


class NvmlSource:
    def __init__(self, nvml: Any = None, clock: Callable[[], float] = time.monotonic):
        self.nvml = nvml  # None: pynvml, imported when first asked
        self.clock = clock

    def describe(self) -> str:
        return "NVML"

    def advice(self) -> str:
        return "load the NVIDIA driver (nvidia-smi must work)"

    def stamp(self) -> object:
        """NVML is asked again every `MAX_AGE` seconds: nothing says when GPUs change."""
        return int(self.clock() // MAX_AGE)

    def inventory(self) -> Inventory:
        return reader.read(self.nvml)

    def usage(self) -> dict[str, Usage]:
        return reader.usage(self.nvml)

    def events(self) -> NvmlEvents:
        return NvmlEvents(self.nvml)


class NvmlEvents:
    """NVML's event set over every GPU: critical Xid, double-bit and single-bit ECC
    events (``nvmlDeviceRegisterEvents``), waited for with ``nvmlEventSetWait_v2``,
    one period at a time."""

    def __init__(self, nvml: Any = None, clock: Callable[[], float] = time.time):
        nvml = nvml if nvml is not None else _pynvml()
        self.nvml = nvml
        self.clock = clock
        nvml.nvmlInit()
        self.set = nvml.nvmlEventSetCreate()
        wanted = (
            nvml.nvmlEventTypeXidCriticalError
            | nvml.nvmlEventTypeDoubleBitEccError
            | nvml.nvmlEventTypeSingleBitEccError
        )
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            try:
                mask = wanted & int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
                if mask:
                    nvml.nvmlDeviceRegisterEvents(handle, mask, self.set)
            except nvml.NVMLError as e:
                log.warning("GPU %d: cannot watch its NVML events: %s", i, e)

    def wait(self, seconds: float) -> list[GpuEvent]:
        nv = self.nvml
        try:
            data = nv.nvmlEventSetWait_v2(self.set, int(seconds * 1000))
        except nv.NVMLError as e:
            if getattr(e, "value", None) != nv.NVML_ERROR_TIMEOUT:
                log.warning("NVML event wait failed: %s", e)
                time.sleep(seconds)
            return []
        uuid = nv.nvmlDeviceGetUUID(data.device)
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        kind = {
            nv.nvmlEventTypeXidCriticalError: XID,
            nv.nvmlEventTypeDoubleBitEccError: DOUBLE_BIT,
            nv.nvmlEventTypeSingleBitEccError: SINGLE_BIT,
        }.get(data.eventType)
        if kind is None:
            return []
        return [GpuEvent(uuid, kind, self.clock(), int(data.eventData) if kind == XID else None)]

    def answers(self, uuids: Iterable[str]) -> set[str]:
        ok = set()
        for uuid in uuids:
            try:
                self.nvml.nvmlDeviceGetHandleByUUID(uuid)
                ok.add(uuid)
            except self.nvml.NVMLError:
                pass
        return ok
