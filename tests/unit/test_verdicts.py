"""The verdict on a call before the Engine acts (allocator/core/judging/verdicts.py): a create
reaches a GPU only with the lease its header and label both name."""

from __future__ import annotations

import json

from allocator.core.access.facts import EngineView
from allocator.core.api import labels
from allocator.core.judging import verdicts as decide
from allocator.core.judging.ask import Ask
from allocator.core.judging.decisions import ALLOW, Facts, NeedsLease
from allocator.core.machine.inventory import GPU, Inventory
from tests.support.table_host import TableHost

UUIDS = [f"GPU-{k}0000000-0000-0000-0000-000000000000" for k in range(2)]
FACTS = Facts(Inventory(tuple(GPU(u, k) for k, u in enumerate(UUIDS))), EngineView(), TableHost())
URI = "/v1.41/containers/create?name=job"
HEADER = {labels.LEASE_HEADER: labels.lease_header("l1", "tok")}


def gpus(*ids: str, count: int = 0) -> dict:
    request = {"Driver": "", "Count": count, "DeviceIDs": list(ids) or None,
               "Capabilities": [["gpu"]]}  # fmt: skip
    return {"DeviceRequests": [request]}


def create(spec: dict, headers: dict | None = None, facts: Facts = FACTS) -> decide.Decision:
    route = decide.route_of("POST", URI)
    assert not isinstance(route, decide.Deny)
    return decide.authz_request(route, "POST", URI, json.dumps(spec).encode(), facts, headers)


def test_a_target_dockerd_would_read_otherwise_is_refused_naming_it() -> None:
    got = decide.route_of("POST", "/containers/%zzcreate")
    assert isinstance(got, decide.Deny)
    assert got.msg.startswith("gpu-alloc refused POST /containers/%zzcreate: ")


def test_a_read_is_cleared_by_the_route_alone_without_facts() -> None:
    route = decide.route_of("GET", "/v1.41/containers/json")
    assert not isinstance(route, decide.Deny) and decide.cleared(route)
    assert decide.authz_request(route, "GET", "/v1.41/containers/json", None, None) is ALLOW  # type: ignore[arg-type]


def test_a_create_without_gpus_is_allowed_and_with_a_lease_header_refused() -> None:
    assert create({"Image": "busybox"}) is ALLOW
    got = create({"Image": "busybox"}, HEADER)
    assert isinstance(got, decide.Deny) and "asks for no GPU" in got.msg


def test_a_gpu_create_without_a_lease_is_refused_with_the_way_to_get_one() -> None:
    got = create({"Image": "busybox", "HostConfig": gpus(count=1)})
    assert isinstance(got, decide.Deny)
    assert got.field == "HostConfig.DeviceRequests[0]"
    assert "without a gpu-alloc lease" in got.msg and "docker context create gpu-alloc" in got.msg


def test_the_shims_leased_create_needs_its_pending_lease_for_exactly_its_gpus() -> None:
    spec = {"Image": "busybox", "Env": [f"NVIDIA_VISIBLE_DEVICES={UUIDS[1]}"],
            "Labels": {labels.LEASE: "l1"}, "HostConfig": gpus(UUIDS[1])}  # fmt: skip
    assert create(spec, HEADER) == NeedsLease("l1", "tok", frozenset({UUIDS[1]}))
    unguarded = {**spec, "Env": []}
    got = create(unguarded, HEADER)
    assert isinstance(got, decide.Deny) and got.field == "Config.Env"


def test_a_leased_create_whose_swarm_variable_names_its_gpus_is_admitted_for_them() -> None:
    """The shim names the leased GPUs in DOCKER_RESOURCE_<kind> too (a toolkit with
    swarm-resource reads it instead): the plugin admits exactly the lease, no other."""
    env = [f"NVIDIA_VISIBLE_DEVICES={UUIDS[1]}", f"DOCKER_RESOURCE_GPU={UUIDS[1]}"]
    spec = {"Image": "busybox", "Env": env, "Labels": {labels.LEASE: "l1"},
            "HostConfig": gpus(UUIDS[1])}  # fmt: skip
    assert create(spec, HEADER) == NeedsLease("l1", "tok", frozenset({UUIDS[1]}))
    for other in (UUIDS[0], f"{UUIDS[0]},{UUIDS[1]}", "all", "1,void"):
        mismatch = {**spec, "Env": [env[0], f"DOCKER_RESOURCE_GPU={other}"]}
        got = create(mismatch, HEADER)
        assert isinstance(got, decide.Deny) and "DOCKER_RESOURCE_GPU" in got.msg, other
    unleased = create({**spec, "Labels": {}})
    assert isinstance(unleased, decide.Deny) and "without a gpu-alloc lease" in unleased.msg


def test_without_an_inventory_only_a_create_touching_no_gpu_passes() -> None:
    blind = Facts(None, EngineView(), TableHost(), inventory_error="NVML: driver gone")
    assert create({"Image": "busybox"}, facts=blind) is ALLOW
    got = create({"Image": "busybox", "HostConfig": gpus(count=1)}, facts=blind)
    assert (
        isinstance(got, decide.Deny)
        and "cannot read the GPU inventory: NVML: driver gone" in got.msg
    )


def test_the_shim_asks_for_the_gpus_a_create_requests_and_refuses_privileged_in_plain_words() -> (
    None
):
    assert decide.shim_ask({"HostConfig": gpus(count=2)}, FACTS) == Ask((), 2, False, ("gpu",))
    got = decide.shim_ask({"HostConfig": {"Privileged": True}}, FACTS)
    assert isinstance(got, decide.Deny) and got.field == "HostConfig.Privileged"
    assert got.msg.startswith("gpu-alloc refused the container create: a privileged container")
    assert got.msg.endswith(decide.SHIM_INSTEAD)
