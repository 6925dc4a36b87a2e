"""Mistakes an operator or a user makes are said, not ignored; privileged mode by policy.

In process, without dockerd: the shim's interceptor and the plugin's app over one
ledger (`World`), and the pure checks behind them.  tests/engine/test_policy_checks_engine.py
runs the same cases on a real dockerd.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
import yaml

from allocator.core.api import labels
from allocator.core.machine.inventory import GPU, Inventory
from allocator.core.rules import policy
from allocator.host import config as configmod
from allocator.host.config import ConfigError
from allocator.ops import cli, doctor
from allocator.service.views import explain
from tests.root.test_enforcement import CREATE_URI, DEVDIR, World, make_nodes
from tests.support import engine
from tests.support.enforcement_cases import body, request

UUIDS = [engine.sim_gpu_uuid(k) for k in range(4)]
TYPOS = {
    "io.gpu-alloc.requst.model": "io.gpu-alloc.request.model",
    "io.gpu-alloc.request.min_memory": "io.gpu-alloc.request.min-memory",
    "IO.GPU-ALLOC.pool": "io.gpu-alloc.pool",  # label keys are case-sensitive
}


@pytest.fixture
def world(tmp_path: Path) -> World:
    make_nodes(DEVDIR)
    return World(tmp_path)


@pytest.fixture
def lease_all(tmp_path: Path) -> World:
    make_nodes(DEVDIR)
    return World(tmp_path, policy={"privileged": "lease-all"})


def message(response) -> str:
    return json.loads(response.body)["message"]


# ------------------------------------------------------------------ labels


@pytest.mark.parametrize("key", TYPOS)
def test_a_mistyped_gpu_alloc_label_is_refused_by_name_on_both_sockets(world: World, key: str):
    create = body(Labels={key: "A100"}, HostConfig={"DeviceRequests": [request(1)]})
    shim = world.via_shim(create)
    assert shim.status == 400
    assert f"label {key} is not a gpu-alloc label (did you mean {TYPOS[key]}?)" in message(shim)
    assert "io.gpu-alloc.request.model, io.gpu-alloc.request.min-memory" in message(shim)
    assert world.forwarded == []  # refused before any lease
    assert world.alloc.ledger.read().leases == {}
    real = world.authz("POST", CREATE_URI, body(Labels={key: "x"}))  # no GPU asked, even
    assert real["Allow"] is False
    assert f"label {key} is not a gpu-alloc label" in real["Msg"]


def test_known_labels_and_other_prefixes_pass(world: World):
    asks = {labels.MODEL: "simulated", labels.MIN_MEMORY: "40g", labels.WAIT: "1s"}
    gpu = world.via_shim(body(Labels=asks, HostConfig={"DeviceRequests": [request(1)]}))
    assert gpu.status == 201, gpu.body
    assert labels.unknown({"io.gpu-alloc-other.x": "1", "com.example": "2"}) is None
    own = {labels.LEASE: "l-1", labels.OWNER: "0:root", labels.PLACED: "", labels.POOL: "p"}
    assert labels.unknown(own) is None  # gpu-alloc's own labels, as the shim forwards them
    assert world.authz("POST", CREATE_URI, body(Labels=own))["Allow"] is True  # as before


# ------------------------------------------------------------------ pools

GPUS = Inventory(tuple(GPU(u, k) for k, u in enumerate(UUIDS)))


def test_a_pool_naming_a_gpu_the_host_lacks_is_a_config_error():
    rules = policy.Rules(pools={"ok": policy.Pool((0, 1)), "big": policy.Pool((3, 12, 9))})
    key, why = policy.missing_pool_gpus(rules, GPUS)
    assert key == "policy.pools.big.gpus"
    assert why.startswith("GPU 9, 12 is not on this host, whose GPUs are 0, 1, 2, 3")
    assert policy.missing_pool_gpus(policy.Rules(pools={"ok": policy.Pool((0, 3))}), GPUS) is None


def write_policy(root: Path, **keys: object) -> None:
    path = root / "config.yaml"
    data = yaml.safe_load(path.read_text())
    data["policy"] = keys
    path.write_text(yaml.safe_dump(data))


def test_a_reload_with_a_bad_pool_keeps_the_policy_in_force(world, tmp_path, caplog):
    write_policy(tmp_path, pools={"a": {"gpus": [0, 1]}})
    world.alloc.gather.refresh_policy()
    assert set(world.alloc.gather.rules.pools) == {"a"}
    write_policy(tmp_path, pools={"a": {"gpus": [0, 1]}, "b": {"gpus": [12]}})
    with caplog.at_level(logging.ERROR):
        world.alloc.gather.refresh_policy()
    assert set(world.alloc.gather.rules.pools) == {"a"}
    assert "policy not reloaded, the one in force stays" in caplog.text
    assert "key 'policy.pools.b.gpus': GPU 12 is not on this host" in caplog.text
    line = doctor.check_pools(configmod.load(str(tmp_path / "config.yaml")))
    assert line.status == doctor.FAIL and "policy.pools.b.gpus" in line.what
    assert "keep the policy they had" in line.what


def test_a_config_caught_empty_mid_write_keeps_the_policy_in_force(world, tmp_path, caplog):
    """An in-place write truncates, then writes: read between the two, the file is empty."""
    write_policy(tmp_path, limits={"default": {"gpus": 2}})
    world.alloc.gather.refresh_policy()
    assert world.alloc.gather.rules.default_limit == 2
    (tmp_path / "config.yaml").write_text("")
    with caplog.at_level(logging.ERROR):
        world.alloc.gather.refresh_policy()
    assert world.alloc.gather.rules.default_limit == 2
    assert "config.yaml is empty" in caplog.text


def test_a_bad_pool_stops_the_service_at_start(tmp_path):
    World(tmp_path)  # its config, with 4 simulated GPUs
    write_policy(tmp_path, pools={"b": {"gpus": [4]}})
    with pytest.raises(ConfigError, match=r"key 'policy.pools.b.gpus': GPU 4 is not on"):
        cli.check_pools(configmod.load(str(tmp_path / "config.yaml")))


def test_an_edit_is_in_force_within_seconds_with_no_request(world, tmp_path):
    work = world.alloc.background
    world.alloc.gather.watch_policy(work, every=0.1)
    work.start()
    try:
        write_policy(tmp_path, limits={"default": {"gpus": 1}})
        deadline = time.monotonic() + 5
        while world.alloc.gather.rules_in_force.default_limit != 1:
            assert time.monotonic() < deadline, "the edit was not picked up"
            time.sleep(0.05)
    finally:
        assert work.stop() == []


# ------------------------------------------------------------------ privileged

PRIVILEGED = body(HostConfig={"Privileged": True})


def test_privileged_is_refused_by_default_on_both_sockets(world: World):
    shim = world.via_shim(PRIVILEGED)
    assert shim.status == 403
    assert "a privileged container sees every device" in message(shim)
    assert world.alloc.ledger.read().leases == {}


def test_lease_all_leases_every_gpu_to_a_privileged_create(lease_all: World):
    made = lease_all.via_shim(PRIVILEGED)
    assert made.status == 201, made.body
    (lease,) = lease_all.alloc.ledger.read().leases.values()
    assert sorted(lease.gpus) == sorted(UUIDS)
    sent = json.loads(lease_all.forwarded[-1].body)
    assert f"NVIDIA_VISIBLE_DEVICES={','.join(lease.gpus)}" in sent["Env"]
    later = lease_all.via_shim(body(HostConfig={"DeviceRequests": [request(1)]}))
    assert later.status == 409  # nothing else leases while it holds the host


def test_lease_all_is_all_or_nothing(lease_all: World):
    one = lease_all.via_shim(body(HostConfig={"DeviceRequests": [request(1)]}))
    assert one.status == 201
    refused = lease_all.via_shim(PRIVILEGED)
    assert refused.status == 409
    assert len(lease_all.alloc.ledger.read().leases) == 1  # no part of the host leased


def test_the_real_socket_still_refuses_privileged_under_lease_all(lease_all: World):
    answer = lease_all.authz("POST", CREATE_URI, PRIVILEGED)
    assert answer["Allow"] is False
    assert "a privileged container sees every device" in answer["Msg"]


def test_policy_privileged_takes_refuse_or_lease_all(tmp_path):
    assert configmod.parse("{}").policy.rules.privileged == "refuse"
    assert configmod.parse("policy: {privileged: lease-all}").policy.rules.privileged == "lease-all"
    with pytest.raises(ConfigError, match=r"policy\.privileged': must be one of refuse, lease-all"):
        configmod.parse("policy: {privileged: allow}")


def test_explain_refuses_a_mistyped_label_as_the_shim_would(world: World):
    answer = explain.explain(world.alloc, "root", "1", ["io.gpu-alloc.requst.model=A100"])
    assert answer["code"] == explain.INVALID
    assert "label io.gpu-alloc.requst.model is not a gpu-alloc label" in answer["message"]
