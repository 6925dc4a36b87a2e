"""Service writes the shim made, and what one made on dockerd's own socket may set
(allocator/core/judging/service_marks.py)."""

from __future__ import annotations

import json

import pytest

from allocator.core.access.facts import EngineView
from allocator.core.judging import service_marks as marks
from allocator.core.judging import verdicts as decide
from allocator.core.judging.decisions import Deny
from allocator.core.judging.service_marks import Signing
from allocator.host import swarm_config
from tests.support.table_host import TableHost

KEY = b"k" * 32
PINS = ["NVIDIA_VISIBLE_DEVICES=void", "DOCKER_RESOURCE_GPU=void"]


def gpu_service(**extra) -> dict:
    cs = {"Image": "cuda", "Env": PINS, **extra.pop("cs", {})}
    resources = {"Reservations": {"GenericResources": [
        {"DiscreteResourceSpec": {"Kind": "gpu", "Value": 1}}]}}  # fmt: skip
    return {"Name": "s", "TaskTemplate": {"ContainerSpec": cs, "Resources": resources}, **extra}


def judge(spec: dict, headers=None, engine_socket="refuse") -> decide.Decision:
    body = json.dumps(spec).encode()
    facts = decide.Facts(None, EngineView(), TableHost())
    route = decide.route_of("POST", "/v1.41/services/create")
    signing = Signing(KEY, engine_socket)
    return decide.authz_request(route, "POST", "/v1.41/services/create", body, facts,  # type: ignore[arg-type]
                                headers=headers, signing=signing)  # fmt: skip


def test_a_gpu_service_the_shim_marked_is_judged_on_its_spec_alone():
    body = json.dumps(gpu_service()).encode()
    headers = {"X-Gpu-Alloc-Service": marks.mark(KEY, body)}
    assert judge(gpu_service(), headers) == decide.ALLOW


@pytest.mark.parametrize(
    "headers",
    [
        None,
        {"X-Gpu-Alloc-Service": "0" * 64},
        {"X-Gpu-Alloc-Service": marks.mark(b"x" * 32, b"{}")},
    ],
)
def test_a_gpu_service_without_the_shims_mark_counts_for_no_one_and_is_refused(headers):
    found = judge(gpu_service(), headers)
    assert isinstance(found, Deny) and "counts for no owner" in found.msg
    assert "swarm.engine_socket_services: trusted" in found.msg


def test_trusted_root_services_go_on_and_plain_ones_always_do():
    assert judge(gpu_service(), engine_socket="trusted") == decide.ALLOW
    plain = {"Name": "p", "TaskTemplate": {"ContainerSpec": {"Image": "x", "Env": PINS}}}
    assert judge(plain) == decide.ALLOW


def test_a_mark_for_another_body_does_not_count():
    other = json.dumps(gpu_service(Labels={"a": "b"})).encode()
    assert not marks.marked({"x-gpu-alloc-service": marks.mark(KEY, other)}, KEY, b"{}")
    assert not marks.marked({"x-gpu-alloc-service": marks.mark(b"", b"{}")}, b"", b"{}")


LEVELS = {
    "service": {"Labels": {"io.gpu-alloc.owner": "1001:alice"}},
    "container": {"cs": {"Labels": {"io.gpu-alloc.lease": "x"}}},
    "volume": {"cs": {"Mounts": [{"Type": "volume", "Target": "/v",
                                  "VolumeOptions": {"Labels": {"io.gpu-alloc.owner": "x"}}}]}},
}  # fmt: skip


@pytest.mark.parametrize("level", LEVELS.values(), ids=LEVELS.keys())
@pytest.mark.parametrize("engine_socket", ["refuse", "trusted"])
def test_gpu_allocs_labels_at_any_level_are_refused_without_the_mark(level, engine_socket):
    found = judge(gpu_service(**level), engine_socket=engine_socket)
    assert isinstance(found, Deny) and "io.gpu-alloc." in found.msg, found
    assert "only gpu-alloc sets" in found.msg or "are gpu-alloc's own" in found.msg


@pytest.mark.parametrize("level", LEVELS.values(), ids=LEVELS.keys())
def test_the_shim_strips_gpu_allocs_labels_at_any_level(level):
    spec = gpu_service(**level)
    assert list(marks.labelled(spec))
    assert list(marks.labelled(marks.stripped(spec))) == []
    other = gpu_service(Labels={"team": "ml"})
    assert marks.stripped(other) == other


def test_a_key_spelled_in_another_case_is_refused_before_any_label_is_read():
    found = judge(gpu_service(labels={"io.gpu-alloc.owner": "0:root"}))
    assert isinstance(found, Deny) and "only by letter case" in found.msg


# ----------------------------------------- swarm.engine_socket_services: {charge: <owner>}


def judge_charged(spec: dict, uri: str = "/v1.41/services/create", headers=None):
    body = json.dumps(spec).encode()
    facts = decide.Facts(None, EngineView(), TableHost())
    signing = Signing(KEY, marks.CHARGE, "ops")
    return decide.authz_request(decide.route_of("POST", uri), "POST", uri, body, facts,  # type: ignore[arg-type]
                                headers=headers, signing=signing)  # fmt: skip


def test_a_gpu_service_on_dockerds_socket_is_charged_to_the_owner_the_policy_names():
    assert judge_charged(gpu_service()) == marks.ChargeCheck("ops", None, gpu_service())
    updated = judge_charged(gpu_service(), "/v1.41/services/s/update?version=3")
    assert isinstance(updated, marks.ChargeCheck) and updated.ref == "s"


def test_a_marked_service_and_one_without_gpus_are_not_charged():
    body = json.dumps(gpu_service()).encode()
    assert judge_charged(gpu_service(), headers={marks.HEADER: marks.mark(KEY, body)}) == (
        decide.ALLOW
    )
    plain = {"Name": "p", "TaskTemplate": {"ContainerSpec": {"Image": "x", "Env": PINS}}}
    assert judge_charged(plain) == decide.ALLOW


@pytest.mark.parametrize("level", LEVELS.values(), ids=LEVELS.keys())
def test_a_charged_service_still_may_not_carry_gpu_allocs_labels(level):
    found = judge_charged(gpu_service(**level))
    assert isinstance(found, Deny) and "io.gpu-alloc." in found.msg, found


@pytest.mark.parametrize(
    ("value", "mode", "owner"),
    [("refuse", "refuse", ""), ("trusted", "trusted", ""), ({"charge": "ops"}, "charge", "ops")],
)
def test_the_swarm_key_says_refuse_trusted_or_whom_to_charge(value, mode, owner):
    parsed = swarm_config.parse({"engine_socket_services": value})
    assert not isinstance(parsed, tuple)
    assert (parsed.engine_socket_services, parsed.engine_socket_owner) == (mode, owner)


@pytest.mark.parametrize("value", ["charge", {"charge": ""}, {"owner": "ops"}, {"charge": 1}])
def test_a_bad_swarm_key_is_refused_by_name(value):
    parsed = swarm_config.parse({"engine_socket_services": value})
    assert isinstance(parsed, tuple) and parsed[0] == "swarm.engine_socket_services"
    assert "{charge: <user>}" in parsed[1]
