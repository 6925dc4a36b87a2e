"""What every GPU source offers the service: the `DeviceSource` protocol.

Modelled on the Kubernetes device plugin's ``ResourceManager``: one object per host
answers for its devices, whatever reads them.  The service asks it for the inventory
(whole GPUs and their MIG slices: a slice is a device of its own, listed in
``Inventory.migs`` with its parent), for live use, for health events, and for the
words ``gpu-alloc doctor`` says about it.  Which source a host has is chosen once,
from the config's ``gpus:`` key, by `allocator.host.devices.source_for`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from allocator.core.machine.health import GpuEvent
from allocator.core.machine.inventory import Inventory
from allocator.core.machine.usage import Usage


class EventSource(Protocol):
    """Health events (Xid, ECC) as they come, and which GPUs still answer."""

    def wait(self, seconds: float) -> list[GpuEvent]: ...

    def answers(self, uuids: Iterable[str]) -> set[str]: ...


class DeviceSource(Protocol):
    def describe(self) -> str:
        """Where the GPUs are read from, for doctor's lines ("NVML", a file's path)."""
        ...

    def advice(self) -> str:
        """What to do when the inventory cannot be read."""
        ...

    def stamp(self) -> object:
        """Moves whenever the inventory may have changed (the caller keeps it till then)."""
        ...

    def inventory(self) -> Inventory:
        """The GPUs and their MIG slices now; `InventoryError` when unreadable."""
        ...

    def usage(self) -> dict[str, Usage]:
        """UUID -> its use now; a GPU the source says nothing about is missing."""
        ...

    def events(self) -> EventSource:
        """A new subscription to the GPUs' health events (the health watcher's)."""
        ...
