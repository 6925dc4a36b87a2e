"""The checks of writes other than a create (allocator/core/judging/route_checks.py): starts,
updates, execs, swarm services, volume creates, routes gpu-alloc does not know."""

from __future__ import annotations

import json

from allocator.core.access.facts import EngineView
from allocator.core.api.routes import classify
from allocator.core.judging.decisions import ALLOW, Deny, Facts, StartCheck, UpdateCheck
from allocator.core.judging.route_checks import CHECKS, needs_body
from allocator.core.machine.inventory import Inventory
from tests.support.table_host import TableHost

FACTS = Facts(Inventory(()), EngineView(), TableHost())


def judge(method: str, uri: str, body: object = None) -> object:
    route = classify(method, uri)
    raw = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    return CHECKS[route.check](route, method, uri, raw, FACTS)


def test_a_call_that_needs_its_body_is_refused_when_the_engine_passed_none() -> None:
    route = classify("POST", "/v1.41/containers/job/update")
    got = needs_body(route, "POST", "/v1.41/containers/job/update", None)
    assert isinstance(got, Deny) and "passed no request body" in got.msg
    assert needs_body(route, "POST", "/v1.41/containers/job/update", b"{}") is None


def test_a_start_is_checked_against_its_container_unless_it_could_replace_its_host_config() -> None:
    assert judge("POST", "/v1.41/containers/job/start") == StartCheck("job")
    assert judge("POST", "/v1.41/containers/job/restart") == StartCheck("job")
    with_body = judge("POST", "/v1.41/containers/job/start", {"Privileged": True})
    assert isinstance(with_body, Deny) and "start it without one" in with_body.msg
    old_api = judge("POST", "/v1.23/containers/job/start")
    assert isinstance(old_api, Deny) and "API 1.23" in old_api.msg


def test_an_update_may_not_touch_devices_and_leased_fields_go_to_the_ledger() -> None:
    devices = judge("POST", "/v1.41/containers/job/update", {"Devices": [{"PathOnHost": "/dev/x"}]})
    assert isinstance(devices, Deny) and "Devices would change" in devices.msg
    assert judge("POST", "/v1.41/containers/job/update", {"Memory": 1 << 30}) == UpdateCheck(
        "job", ("Memory",)
    )
    assert judge("POST", "/v1.41/containers/job/update", {"CpuShares": 512}) is ALLOW


def test_a_privileged_exec_is_refused() -> None:
    got = judge("POST", "/v1.41/containers/job/exec", {"Cmd": ["sh"], "Privileged": True})
    assert isinstance(got, Deny) and "without --privileged" in got.msg
    assert judge("POST", "/v1.41/containers/job/exec", {"Cmd": ["sh"]}) is ALLOW


def test_a_swarm_service_is_judged_on_its_spec_and_needs_the_void_pins() -> None:
    got = judge("POST", "/v1.41/services/create", {"Name": "s"})
    assert isinstance(got, Deny) and "NVIDIA_VISIBLE_DEVICES=void" in got.msg
    env = ["NVIDIA_VISIBLE_DEVICES=void", "DOCKER_RESOURCE_GPU=void"]
    pinned = {"Name": "s", "TaskTemplate": {"ContainerSpec": {"Image": "busybox", "Env": env}}}
    assert judge("POST", "/v1.41/services/create", pinned) is ALLOW


def test_a_local_volume_binding_dev_is_refused_and_a_plain_one_allowed() -> None:
    opts = {"type": "none", "o": "bind", "device": "/dev"}
    got = judge(
        "POST", "/v1.41/volumes/create", {"Name": "v", "Driver": "local", "DriverOpts": opts}
    )
    assert isinstance(got, Deny) and got.msg.startswith(
        "gpu-alloc refused the volume create: DriverOpts.device: a bind of /dev exposes /dev"
    )
    assert judge("POST", "/v1.41/volumes/create", {"Name": "v"}) is ALLOW
