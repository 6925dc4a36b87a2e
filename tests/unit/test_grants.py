"""What effective access comes to (allocator/core/access/grants.py): grants naming their field,
an unpinned grant holding every GPU."""

from __future__ import annotations

from allocator.core.access.grants import Access, Demand, Grant
from allocator.core.machine.inventory import GPU, Inventory

INVENTORY = Inventory(tuple(GPU(f"GPU-{k}", k) for k in range(3)))
LEASABLE = Grant("HostConfig.DeviceRequests[0]", "1 GPU", frozenset({"GPU-0"}), Demand(count=1))
DEVICE = Grant("HostConfig.Devices[0]", "/dev/nvidia1", frozenset({"GPU-1"}))
UNPINNED = Grant("HostConfig.Privileged", "every device", None)


def test_no_grant_is_no_access_and_holds_nothing() -> None:
    assert Access().none and Access().pinned
    assert Access().gpus(INVENTORY) == frozenset()


def test_pinned_grants_hold_their_gpus() -> None:
    access = Access((LEASABLE, DEVICE))
    assert access.pinned and not access.none
    assert access.gpus(INVENTORY) == {"GPU-0", "GPU-1"}


def test_a_grant_that_cannot_be_pinned_holds_every_gpu() -> None:
    access = Access((LEASABLE, UNPINNED))
    assert not access.pinned
    assert access.gpus(INVENTORY) == INVENTORY.uuids


def test_only_grants_with_a_demand_are_leasable_the_rest_are_refused() -> None:
    assert LEASABLE.leasable and not DEVICE.leasable
    assert Access((LEASABLE, DEVICE, UNPINNED)).refused() == (DEVICE, UNPINNED)
    assert DEVICE.describe() == "HostConfig.Devices[0]: /dev/nvidia1"
