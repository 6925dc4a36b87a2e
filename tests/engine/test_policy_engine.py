"""The policy at run time: reloaded without a restart, and stopped containers freed.

One stack: root is not exempt here (so the CLI as root is limited), one GPU each,
and a GPU container stopped for 3 seconds loses its lease.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from tests.support import engine
from tests.support.policy_edits import set_policy

IMAGE = engine.BUSYBOX_TAG
POLICY = {"limits": {"default": {"gpus": 1}}, "exempt": [], "release_stopped_after": "3s"}


def make_stack() -> engine.Stack:
    return engine.Stack(gpus=4, policy=POLICY)


def shim(stack: engine.Stack, *args: str) -> subprocess.CompletedProcess:
    return engine.docker_cli(stack.shim_sock, *args)


def run_gpu(stack: engine.Stack, name: str) -> subprocess.CompletedProcess:
    return shim(stack, "run", "-d", "--name", name, "--gpus", "1", IMAGE, "sleep", "60")


def status(stack: engine.Stack) -> dict:
    out = subprocess.run(
        [*engine.gpu_alloc_command(), "--config", str(stack.config_path), "status", "--json"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)


def test_a_policy_change_is_picked_up_and_a_broken_one_keeps_the_old(stack):
    original = stack.config_path.read_text()
    try:
        assert run_gpu(stack, "one").returncode == 0
        second = run_gpu(stack, "two")
        assert "root holds 1 of 1 GPU allowed (policy.limits.default)" in second.stderr
        set_policy(stack, limits={"default": {"gpus": 2}})
        assert run_gpu(stack, "two").returncode == 0  # no restart
        set_policy(stack, limits={"default": {"gpus": "three"}})
        third = run_gpu(stack, "three")
        assert "root holds 2 of 2 GPUs allowed" in third.stderr  # the old policy stays
        log = (stack.dir / "shim.log").read_text()
        assert "policy not reloaded, the one in force stays" in log
        assert "key 'policy.limits.default.gpus'" in log
        set_policy(stack, limits={"default": {"gpus": 3}})
        stack.shim.send_signal(signal.SIGHUP)  # the signal re-reads too, and keeps serving
        assert run_gpu(stack, "three").returncode == 0
    finally:
        stack.config_path.write_text(original)
        os.utime(stack.config_path)


def test_a_container_stopped_too_long_loses_its_gpus_and_may_not_start(stack):
    made = shim(stack, "create", "--name", "idle", "--gpus", "1", IMAGE, "true")
    assert made.returncode == 0, made.stderr
    deadline = time.monotonic() + 30
    while status(stack)["free"] != 4:
        assert time.monotonic() < deadline, stack.logs()
        time.sleep(0.5)
    started = shim(stack, "start", "idle")
    assert started.returncode != 0
    assert "stopped longer than policy.release_stopped_after (3s)" in started.stderr
    assert "docker rm" in started.stderr
    real = engine.docker_cli(stack.engine_sock, "start", "idle")
    assert "policy.release_stopped_after" in real.stderr  # the plugin refuses it too
    assert all(g["free"] for g in status(stack)["gpus"])  # not adopted back
    assert shim(stack, "rm", "idle").returncode == 0
    status(stack)
    state = json.loads((stack.state_dir / "state.json").read_text())
    assert state["expired"] == {}


def test_a_compose_recreate_at_the_limit_takes_over_its_own_gpu(stack, tmp_path):
    from tests.engine.test_compose import write_project

    write_project(tmp_path)
    up = engine.docker_compose(stack.shim_sock, tmp_path, "up", "-d", project_name="gapol")
    assert up.returncode == 0, up.stderr + stack.logs()
    write_project(tmp_path, command="301")  # changed: Compose recreates at 1 of 1 GPU
    again = engine.docker_compose(stack.shim_sock, tmp_path, "up", "-d", project_name="gapol")
    assert again.returncode == 0, again.stderr + stack.logs()
    assert "Recreating" in again.stderr
    assert status(stack)["free"] == 3
    down = engine.docker_compose(stack.shim_sock, tmp_path, "down", project_name="gapol")
    assert down.returncode == 0, down.stderr


def test_a_reset_ledger_keeps_each_adopted_containers_pool(stack):
    original = stack.config_path.read_text()
    try:
        set_policy(stack, pools={"small": {"gpus": [0, 1]}, "big": {"gpus": [2, 3]}})
        out = shim(stack, "run", "-d", "--name", "pooled", "--gpus", "1", "--label",
                   "io.gpu-alloc.pool=big", IMAGE, "sleep", "60")  # fmt: skip
        assert out.returncode == 0, out.stderr
        reset = subprocess.run(
            [*engine.gpu_alloc_command(), "--config", str(stack.config_path), "repair", "--reset"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert reset.returncode == 0 and "adopted 1 container" in reset.stdout, reset.stderr
        (holder,) = status(stack)["holders"]
        assert holder["lease"] is None and holder["pool"] == "big"
    finally:
        shim(stack, "rm", "-f", "pooled")
        stack.config_path.write_text(original)


def test_a_live_edit_of_the_placement_is_in_force_within_seconds(stack):
    """GPU 0 held, two more asked: best-effort keeps a NUMA node whole (2, 3), first-fit
    takes the lowest (1, 2).  The shim's log says when its look at the file saw the edit."""
    original = stack.config_path.read_text()
    log = stack.dir / "shim.log"
    try:
        set_policy(stack, limits={"default": {"gpus": 4}})
        held = shim(
            stack, "run", "-d", "--name", "zero", "--gpus", "device=0", IMAGE, "sleep", "60"
        )
        assert held.returncode == 0, held.stderr
        seen = log.read_text().count("policy.placement")
        set_policy(stack, placement="first-fit")  # no signal: the shim looks by itself
        deadline = time.monotonic() + 60
        while log.read_text().count("policy.placement") == seen:
            assert time.monotonic() < deadline, stack.logs()
            time.sleep(0.2)
        pair = shim(stack, "run", "-d", "--name", "pair", "--gpus", "2", IMAGE, "sleep", "60")
        assert pair.returncode == 0, pair.stderr
        gpus = {h["name"]: h["gpus"] for h in status(stack)["holders"]}
        assert gpus["pair"] == [1, 2]
    finally:
        stack.config_path.write_text(original)
        os.utime(stack.config_path)
