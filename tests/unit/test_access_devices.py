"""The device rows of the effective-access catalogue (allocator/core/access/access_devices.py): a
device by the node it is, a cgroup rule by its numbers, a CDI name by what it names."""

from __future__ import annotations

import pytest

from allocator.core.access import access_devices
from allocator.core.access.access_ctx import Ctx, View
from allocator.core.access.facts import EngineView, Node
from allocator.core.access.grants import Refusal
from allocator.core.machine.inventory import GPU, Inventory
from tests.support.table_host import TableHost

INVENTORY = Inventory(tuple(GPU(f"GPU-{k}", k, minor=k) for k in range(2)))
NODES = {
    "/dev/nvidia1": Node("chr", 195, 1),
    "/dev/nvidiactl": Node("chr", 195, 255),
    "/dev/null": Node("chr", 1, 3),
    "/dev/shm/gpu": Node("chr", 195, 0),
}


def ctx(strict: bool = False, **host_config: object) -> Ctx:
    view = View(env=(), env_complete=not strict, host_config=host_config)
    return Ctx(view, EngineView(), INVENTORY, TableHost(nodes=dict(NODES)), strict)


def judged(rows: Ctx) -> list[tuple[str, frozenset[str] | None]]:
    return [(g.field, g.gpus) for g in rows.grants]


def test_a_gpu_device_node_holds_its_gpu_and_a_control_node_every_gpu() -> None:
    rows = ctx(Devices=[{"PathOnHost": "/dev/nvidia1"}, {"PathOnHost": "/dev/nvidiactl"},
                        {"PathOnHost": "/dev/null"}])  # fmt: skip
    access_devices.devices(rows)
    assert judged(rows) == [
        ("HostConfig.Devices[0]", frozenset({"GPU-1"})),
        ("HostConfig.Devices[1]", None),
    ]


def test_a_device_outside_the_kernels_dev_is_refused_whatever_node_it_is() -> None:
    rows = ctx(Devices=[{"PathOnHost": "/dev/shm/gpu"}])
    access_devices.devices(rows)
    (grant,) = rows.grants
    assert grant.gpus is None and "is not on the host's devtmpfs" in grant.detail


def test_a_create_naming_a_missing_or_relative_device_is_refused() -> None:
    with pytest.raises(Refusal, match="does not exist on this host"):
        access_devices.devices(ctx(True, Devices=[{"PathOnHost": "/dev/nvidia7"}]))
    with pytest.raises(Refusal, match="is not an absolute path"):
        access_devices.devices(ctx(True, Devices=[{"PathOnHost": "dev/nvidia1"}]))


def test_cgroup_rules_are_judged_by_their_numbers() -> None:
    rows = ctx(DeviceCgroupRules=["c 0195:1 rwm", "c 195:* rwm", "b 195:1 rwm", "c 1:3 rwm"])
    access_devices.cgroup_rules(rows)
    assert judged(rows) == [
        ("HostConfig.DeviceCgroupRules[0]", frozenset({"GPU-1"})),
        ("HostConfig.DeviceCgroupRules[1]", None),
    ]


def test_cdi_names_of_nvidia_gpus_are_pinned_and_other_vendors_refused() -> None:
    rows = ctx()
    access_devices.cdi_names(rows, "f", ["nvidia.com/gpu=0", "nvidia.com/gpu=all"])
    assert judged(rows) == [("f", frozenset({"GPU-0"})), ("f", None)]
    with pytest.raises(Refusal, match=r"CDI device 'vendor\.com/fpga=0' is not one gpu-alloc"):
        access_devices.cdi_names(ctx(True), "f", ["vendor.com/fpga=0"])
