"""The host's GPU source, chosen once from the config: the one place that names the kinds.

=========  =========================================  ==================================
``gpus:``  source                                     reads
=========  =========================================  ==================================
nvml       `NvmlSource` (devices/nvml.py)             the NVIDIA driver through NVML
a path     `SimulatedSource` (devices/simulated.py)   a YAML file (tests, demos)
=========  =========================================  ==================================

MIG slices are no kind of their own: each source lists a MIG-mode GPU's slices in its
inventory.  Shared GPUs (MPS, time-slicing) are whole GPUs the policy's ``sharing:``
section lends out (allocator/core/rules/sharing.py); a source that reads them some other way
(a vGPU or replica list, as the Kubernetes device plugin has) is one more row here.
"""

from __future__ import annotations

from allocator.host.devices.base import DeviceSource, EventSource
from allocator.host.devices.nvml import NvmlSource
from allocator.host.devices.simulated import SimulatedSource

__all__ = ["NVML", "DeviceSource", "EventSource", "source_for"]
NVML = "nvml"  # the config's word for the driver (allocator/host/config.py's default)


def source_for(gpus: str) -> DeviceSource:
    """The source the config's ``gpus:`` names: ``nvml``, or a simulated file's path."""
    if gpus == NVML:
        return NvmlSource()
    return SimulatedSource(gpus)
