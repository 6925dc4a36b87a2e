"""A create that joins another container's PID, IPC or network namespace reaches what
that container reaches (allocator/core/access/joined.py)."""

from __future__ import annotations

from typing import Any

import pytest

from allocator.core.access import access, joined
from allocator.core.access.facts import EngineView
from allocator.core.access.grants import Refusal
from allocator.core.machine.inventory import GPU, Inventory
from tests.support.table_host import TableHost

MPS_DIR = "/run/gpu-alloc/mps"
INVENTORY = Inventory(tuple(GPU(f"GPU-{i}", i, minor=i) for i in range(2)))
HOST = TableHost(protected=(*TableHost().protected, MPS_DIR), mps_dir=MPS_DIR)
VIEW = EngineView(version=(28, 5, 2))
# A share of GPU-1 as the shim made it: its GPU's device request and its MPS binds.
SHARE = {
    "Config": {"Env": ["NVIDIA_VISIBLE_DEVICES=GPU-1"]},
    "HostConfig": {
        "DeviceRequests": [{"Driver": "nvidia", "DeviceIDs": ["GPU-1"], "Capabilities": [["gpu"]]}]
    },
    "Mounts": [
        {"Type": "bind", "Source": f"{MPS_DIR}/GPU-1/pipe", "Destination": "/run/gpu-alloc-mps"}
    ],
}
PLAIN: dict[str, Any] = {"Config": {"Env": []}, "HostConfig": {}}
CONTAINERS = {"share": SHARE, "plain": PLAIN,
              "joiner": {"Config": {}, "HostConfig": {"PidMode": "container:share"}}}  # fmt: skip


def create(**host_config: object):
    body = {"HostConfig": host_config}
    return access.of_create(body, VIEW, INVENTORY, HOST, CONTAINERS.get)


@pytest.mark.parametrize("mode", ["PidMode", "IpcMode", "NetworkMode"])
def test_joining_a_shares_namespace_reaches_its_gpu_and_needs_a_lease_of_it(mode) -> None:
    grants = create(**{mode: "container:share"}).grants
    assert grants and {g.field for g in grants} == {f"HostConfig.{mode}"}
    assert all(g.gpus == frozenset({"GPU-1"}) and g.leasable for g in grants)
    assert "container share" in grants[0].detail


def test_a_namespace_joined_through_a_joiner_reaches_the_first_containers_gpu() -> None:
    (grant, *_) = create(PidMode="container:joiner").grants
    assert grant.gpus == frozenset({"GPU-1"})


@pytest.mark.parametrize("mode", ["container:plain", "container:gone", ""])
def test_joining_what_reaches_no_gpu_reaches_none(mode) -> None:
    assert create(PidMode=mode, IpcMode=mode, NetworkMode=mode).none


@pytest.mark.parametrize("mode", ["host", "private"])
def test_a_namespace_of_no_container_reaches_no_gpu(mode) -> None:
    """(``--pid host`` is a power over the host, refused as one: core/access/powers.py.)"""
    assert create(IpcMode=mode, NetworkMode=mode).none


def test_a_create_whose_joined_container_cannot_be_looked_up_is_refused() -> None:
    body = {"HostConfig": {"NetworkMode": "container:share"}}
    with pytest.raises(Refusal, match=r"HostConfig\.NetworkMode: what container 'share'"):
        access.of_create(body, VIEW, INVENTORY, HOST)


def test_only_a_container_mode_names_a_container() -> None:
    assert joined.target("container:abc") == "abc"
    assert joined.target("host") is None and joined.target("containerx") is None
