"""A create that joins another container's PID, IPC or network namespace reaches what
that container reaches (allocator/core/access/joined.py)."""

from __future__ import annotations

from typing import Any

import pytest

from allocator.core.access import access, joined
from allocator.core.access.facts import EngineView
from allocator.core.access.grants import Refusal
from allocator.core.api import refs
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
SHARE_ID, PLAIN_ID = "5ba2e" + "0" * 59, "5ba2f" + "0" * 59
CONTAINERS = {"share": {**SHARE, "Id": SHARE_ID}, "plain": {**PLAIN, "Id": PLAIN_ID},
              "joiner": {"Config": {}, "HostConfig": {"PidMode": "container:share"}}}  # fmt: skip


def could_name(ref: str) -> list[dict[str, Any]]:
    """As the Gatherer looks a reference up: by name, and as an id prefix."""
    named = [CONTAINERS[ref]] if ref in CONTAINERS else []
    return named + [c for c in CONTAINERS.values() if refs.may_name(ref, c.get("Id", ""))]


def create(**host_config: object):
    body = {"HostConfig": host_config}
    return access.of_create(body, VIEW, INVENTORY, HOST, could_name)


@pytest.mark.parametrize("mode", ["PidMode", "IpcMode", "NetworkMode"])
def test_joining_a_shares_namespace_reaches_its_gpu_and_needs_a_lease_of_it(mode) -> None:
    grants = create(**{mode: "container:share"}).grants
    assert grants and {g.field for g in grants} == {f"HostConfig.{mode}"}
    assert all(g.gpus == frozenset({"GPU-1"}) and g.leasable for g in grants)
    assert "container share" in grants[0].detail


def test_a_namespace_joined_through_a_joiner_reaches_the_first_containers_gpu() -> None:
    (grant, *_) = create(PidMode="container:joiner").grants
    assert grant.gpus == frozenset({"GPU-1"})


@pytest.mark.parametrize("mode", ["container:plain", ""])
def test_joining_what_reaches_no_gpu_reaches_none(mode) -> None:
    assert create(PidMode=mode, IpcMode=mode, NetworkMode=mode).none


@pytest.mark.parametrize("mode", ["PidMode", "IpcMode", "NetworkMode"])
def test_a_create_that_joins_a_name_no_container_has_is_refused(mode) -> None:
    """dockerd looks the name up again when it acts (a network join at every start): a
    container renamed to it in between would be joined unjudged."""
    with pytest.raises(Refusal, match=rf"HostConfig\.{mode}: .*no container is 'gone' now"):
        create(**{mode: "container:gone"})


def test_a_reference_that_reads_as_an_id_prefix_is_judged_on_each_container_it_may_name():
    """'5ba2' names no container but begins the share's id and the plain one's: once a
    container named 5ba2 is renamed, dockerd could read it as either (an ambiguous prefix
    is its error; one left unique is not)."""
    grants = create(PidMode="container:5ba2").grants
    assert grants and all(g.gpus == frozenset({"GPU-1"}) for g in grants)
    assert create(PidMode="container:5ba2f").none  # the plain one's alone


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


def test_an_existing_container_is_judged_on_the_namespaces_it_joined_where_they_are_asked():
    """A start's judgment asks them (a create raced past its own check is caught at its
    start); the stored reference is the full id dockerd resolved."""
    joiner = {"Config": {"Env": []}, "HostConfig": {"PidMode": f"container:{SHARE_ID}"}}
    assert access.of_container(joiner, VIEW, INVENTORY, HOST).none  # not asked: not judged
    grants = access.of_container(joiner, VIEW, INVENTORY, HOST, container_of=could_name).grants
    assert grants and grants[0].gpus == frozenset({"GPU-1"})


def test_a_chain_of_joins_that_loops_is_judged_once_round():
    """dockerd stores ``--network container:X`` by name where X did not exist yet, so two
    containers may name each other."""
    loop = {
        "a": {"Id": "a" * 64, "Config": {"Env": []}, "HostConfig": {"NetworkMode": "container:b"}},
        "b": {"Id": "b" * 64, "Config": {"Env": []}, "HostConfig": {"NetworkMode": "container:a"}},
    }
    look = lambda ref: [loop[ref]] if ref in loop else []  # noqa: E731
    assert access.of_container(loop["a"], VIEW, INVENTORY, HOST, container_of=look).none
