"""Typos refused, pools checked, the policy reloaded promptly, privileged leasing the host.

One stack on a real dockerd: 4 GPUs, a pool on GPUs 0-1, and
``policy.privileged: lease-all``.  The in-process twins are in test_policy_checks.py.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
import pytest
import yaml

from allocator.service.gather import POLICY_CHECK_EVERY
from tests.support import engine
from tests.support.engine import gpu_alloc
from tests.support.policy_edits import log_sizes, set_policy, wait_for_log

IMAGE = engine.BUSYBOX_TAG
POLICY = {"privileged": "lease-all", "pools": {"a": {"gpus": [0, 1]}}}


def make_stack() -> engine.Stack:
    return engine.Stack(gpus=4, policy=POLICY)


def shim(stack: engine.Stack, *args: str) -> subprocess.CompletedProcess:
    return engine.docker_cli(stack.shim_sock, *args)


def real(stack: engine.Stack, *args: str) -> subprocess.CompletedProcess:
    return engine.docker_cli(stack.engine_sock, *args)


def status(stack: engine.Stack) -> dict:
    out = gpu_alloc(stack.config_path, "status", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture
def policy_file(stack: engine.Stack) -> Iterator[Path]:
    """The stack's config file, put back as it was (and seen by the watchers) after the test."""
    original = stack.config_path.read_text()
    yield stack.config_path
    stack.config_path.write_text(original)
    time.sleep(POLICY_CHECK_EVERY + 1)


# ------------------------------------------------------------------ labels


@pytest.mark.parametrize(
    ("key", "meant"),
    [
        ("io.gpu-alloc.requst.model", "io.gpu-alloc.request.model"),
        ("io.gpu-alloc.request.min_memory", "io.gpu-alloc.request.min-memory"),
        ("IO.GPU-ALLOC.pool", "io.gpu-alloc.pool"),
    ],
)
def test_a_mistyped_label_is_refused_by_name_on_both_sockets(stack, key, meant):
    said = f"label {key} is not a gpu-alloc label (did you mean {meant}?)"
    api = engine.engine_api(stack.shim_sock)
    with pytest.raises(docker.errors.APIError) as refused:
        api.create_container(IMAGE, "true", labels={key: "x"}, host_config=api.create_host_config(
            device_requests=[docker.types.DeviceRequest(count=1, capabilities=[["gpu"]])]
        ))  # fmt: skip
    assert refused.value.status_code == 400
    assert said in str(refused.value)
    on_real = real(stack, "create", "--label", f"{key}=x", IMAGE, "true")
    assert on_real.returncode != 0
    assert said in on_real.stderr and "authorization denied" in on_real.stderr
    assert engine.engine_api(stack.engine_sock).containers(all=True) == []
    assert status(stack)["free"] == 4


def test_known_labels_still_pick_gpus(stack):
    asks = ("--label", "io.gpu-alloc.pool=a", "--label", "io.gpu-alloc.request.model=simulated")
    made = shim(stack, "run", "-d", "--name", "known", "--gpus", "1", *asks, IMAGE, "sleep", "60")
    assert made.returncode == 0, made.stderr + stack.logs()
    (holder,) = status(stack)["holders"]
    assert holder["pool"] == "a" and holder["name"] == "known"


# ------------------------------------------------------------------ the policy file


def test_an_edit_is_reloaded_within_seconds_without_a_create(stack, policy_file):
    since = log_sizes(stack)
    set_policy(stack, limits={"default": {"gpus": 3}})
    wait_for_log(stack, f"policy reloaded from {policy_file}", since)


def test_a_pool_naming_a_missing_gpu_is_refused_at_reload_and_the_old_policy_stays(
    stack, policy_file
):
    since = log_sizes(stack)
    set_policy(stack, pools={"a": {"gpus": [0, 1]}, "b": {"gpus": [3, 12]}})
    said = wait_for_log(stack, "policy not reloaded, the one in force stays", since)
    assert all("key 'policy.pools.b.gpus': GPU 12 is not on this host" in s for s in said.values())
    out = shim(stack, "create", "--gpus", "1", "--label", "io.gpu-alloc.pool=b", IMAGE, "true")
    assert "there is no GPU pool 'b' (pools: a)" in out.stderr  # the old policy
    doctor = gpu_alloc(policy_file, "doctor")
    assert "[FAIL] policy pools: policy.pools.b.gpus: GPU 12 is not on this host" in doctor.stdout


def test_a_pool_naming_a_missing_gpu_stops_the_services_at_start(stack, tmp_path):
    data = yaml.safe_load(stack.config_path.read_text())
    data["policy"]["pools"] = {"big": {"gpus": [0, 1, 2, 3, 4, 5, 6, 7]}}
    data["shim"]["socket"] = str(tmp_path / "other.sock")  # never the stack's own
    data["plugin"]["socket"] = str(tmp_path / "other-plugin.sock")
    bad = tmp_path / "config.yaml"
    bad.write_text(yaml.safe_dump(data))
    for role in ("shim", "plugin"):
        out = gpu_alloc(bad, role)
        assert out.returncode == 2, out.stderr
        assert "config error" in out.stderr
        assert "key 'policy.pools.big.gpus': GPU 4, 5, 6, 7 is not on this host" in out.stderr
        assert not (tmp_path / "other.sock").exists()


# ------------------------------------------------------------------ privileged


def test_lease_all_gives_a_privileged_container_every_gpu_and_nobody_else_any(stack):
    # Created, not run: these test machines cannot give a container every capability.
    made = shim(stack, "create", "--name", "dind", "--privileged", IMAGE, "sleep", "60")
    assert made.returncode == 0, made.stderr + stack.logs()
    snap = status(stack)
    (holder,) = snap["holders"]
    assert holder["name"] == "dind" and holder["gpus"] == [0, 1, 2, 3] and snap["free"] == 0
    late = shim(stack, "create", "--gpus", "1", IMAGE, "true")
    assert late.returncode != 0 and "'dind' of root" in late.stderr
    also = shim(stack, "create", "--privileged", IMAGE, "true")
    assert also.returncode != 0 and "'dind' of root" in also.stderr
    started = real(stack, "start", "dind")  # judged at start: its lease holds the host
    assert "gpu-alloc" not in started.stderr, started.stderr
    assert real(stack, "rm", "-f", "dind").returncode == 0
    assert status(stack)["free"] == 4


def test_lease_all_is_all_or_nothing_and_may_wait_in_line(stack):
    one = shim(stack, "run", "-d", "--name", "one", "--gpus", "1", IMAGE, "sleep", "60")
    assert one.returncode == 0, one.stderr
    busy = shim(stack, "create", "--privileged", IMAGE, "true")
    assert busy.returncode != 0 and "'one' of root" in busy.stderr
    assert status(stack)["free"] == 3  # no part of the host was leased
    with ThreadPoolExecutor(1) as pool:
        later = ("create", "--name", "later", "--privileged", "--label", "io.gpu-alloc.wait=60s")
        waiting = pool.submit(shim, stack, *later, IMAGE, "true")
        time.sleep(2)
        assert not waiting.done()  # in line
        assert shim(stack, "rm", "-f", "one").returncode == 0
        out = waiting.result(timeout=60)
    assert out.returncode == 0, out.stderr + stack.logs()
    assert status(stack)["holders"][0]["gpus"] == [0, 1, 2, 3]


def test_privileged_on_the_real_socket_still_needs_a_lease(stack):
    out = real(stack, "create", "--privileged", IMAGE, "true")
    assert out.returncode != 0
    assert "a privileged container sees every device on the host" in out.stderr
