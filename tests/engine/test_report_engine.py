"""GPU time on a real Engine: `gpu-alloc report` over scripted runs, and fair share by history.

Two non-root people run containers through the shim (it knows them by SO_PEERCRED)
on simulated GPUs whose utilisation the simulated-GPU file sets; the shim samples
it every half second (``idle_after: 2``).  The report must give the GPU-hours the
script implies; with ``policy.fair_share`` the one with less recent use is served
first, whoever came first.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from allocator.core.leases import events
from allocator.host.audit import AuditLog
from allocator.service.views import wire
from tests.engine.test_observe_engine import set_usage
from tests.engine.test_waiting_engine import until, waiting_create
from tests.support import clients, engine, host_users

IMAGE = engine.BUSYBOX_TAG
ANN, BEN = "ga28ann", "ga28ben"
UTIL = {0: 0.5, 1: 1.0, 2: 1.0}


def make_stack() -> engine.Stack:
    return engine.Stack(gpus=3, policy={"idle_after": 2, "fair_share": {"half_life": "1h"}})


@pytest.fixture(scope="module", autouse=True)
def users(stack: engine.Stack) -> Iterator[None]:
    with host_users.present(ANN, BEN):
        host_users.open_shim(stack)
        os.chmod(stack.state_dir, 0o700)  # root's, as installed: others ask the shim
        for index, util in UTIL.items():
            set_usage(stack, engine.sim_gpu_uuid(index), {"utilization": util})
        yield


def docker(stack: engine.Stack, *args: str, user: str | None = None):
    got = clients.docker_cli(stack.shim_sock, *args, user=user)
    assert got.returncode == 0, got.stderr + stack.logs()
    return got


def hold(stack: engine.Stack, user: str, gpus: str, seconds: float) -> tuple[float, float]:
    """A container of ``user`` on ``gpus`` for about ``seconds``; the least and the most
    its lease can have lasted (run returned .. rm started, run started .. rm returned)."""
    before = time.time()
    name = f"{user}-{time.monotonic_ns()}"
    docker(stack, "run", "-d", "--name", name, "--gpus", gpus, IMAGE, "sleep", "60", user=user)
    started = time.time()
    time.sleep(seconds)
    stopping = time.time()
    docker(stack, "rm", "-f", name, user=user)
    return stopping - started, time.time() - before


def cli(stack: engine.Stack, *args: str) -> Any:
    got = engine.gpu_alloc(stack, *args, "--json")
    assert got.returncode == 0, got.stderr
    return json.loads(got.stdout)


def test_the_report_gives_the_gpu_hours_the_runs_imply(stack: engine.Stack) -> None:
    ann = hold(stack, ANN, "device=0", 4)  # 1 GPU at 50 %
    ben = hold(stack, BEN, '"device=1,2"', 3)  # 2 GPUs at 100 %
    rows = {r["user"]: r for r in cli(stack, "report", "--since", "10m")["rows"]}
    for user, (least, most), gpus in ((ANN, ann, 1), (BEN, ben, 2)):
        got = rows[user]
        assert gpus * least <= got["gpu_seconds_held"] <= gpus * most, got
        util = UTIL[0] if user == ANN else 1.0
        # sampling error: the utilisation is sampled every half second
        assert got["gpu_seconds_used"] == pytest.approx(util * got["gpu_seconds_held"], abs=1.0)
        assert got["gpu_seconds_idle"] == pytest.approx(0.0, abs=1.0)
        assert got["grants"] == 1
    by_gpu = {r["gpu"]: r for r in cli(stack, "report", "--since", "10m", "--by", "gpu")["rows"]}
    assert by_gpu["1"]["gpu_seconds_held"] == pytest.approx(rows[BEN]["gpu_seconds_held"] / 2)

    # A docker-group user is given their own rows by the shim, nobody else's.
    target = wire.report_target(time.time() - 600, None, "user")
    curl = subprocess.run(
        ["curl", "-sf", "--unix-socket", stack.shim_sock, f"http://localhost{target}"],
        capture_output=True, text=True, timeout=60, user=ANN,
    )  # fmt: skip
    assert curl.returncode == 0, curl.stderr + stack.logs()
    mine = json.loads(curl.stdout)["rows"]
    assert [r["user"] for r in mine] == [ANN]
    assert mine[0]["gpu_seconds_held"] == rows[ANN]["gpu_seconds_held"]


def test_fair_share_serves_the_owner_with_less_recent_use_first(stack: engine.Stack) -> None:
    # ann used a great deal, but many half-lives ago; ben used a little, just now
    day = 86400.0
    audit = AuditLog(str(stack.state_dir))
    uuid = engine.sim_gpu_uuid(0)
    audit.write(events.record("grant", time.time() - 3 * day, gpus=[uuid], lease="old", owner=ANN))
    audit.write(events.record("release", time.time() - 2 * day, gpus=[uuid], lease="old",
                              owner=ANN))  # fmt: skip
    hold(stack, BEN, "2", 2)
    for i in range(3):
        docker(stack, "create", "--name", f"held-{i}", "--gpus", "1", IMAGE, "true")
    first = waiting_create(stack, BEN, "w-ben")  # ben arrives first
    until("ben in line", lambda: [r["owner"] for r in queue(stack)] == [BEN])
    second = waiting_create(stack, ANN, "w-ann")
    until("ann in line", lambda: len(queue(stack)) == 2)
    assert [r["owner"] for r in queue(stack)] == [ANN, BEN]

    status = cli(stack, "status", "--no-reconcile")
    shares = {o["owner"]: o for o in status["fair_share"]["owners"]}
    assert shares[ANN]["usage_gpu_hours"] < shares[BEN]["usage_gpu_hours"]
    assert status["fair_share"]["half_life_s"] == 3600.0
    explained = engine.gpu_alloc(stack, "explain", "--user", ANN)
    assert "fair share (half-life 1h" in explained.stdout and ANN in explained.stdout

    docker(stack, "rm", "-f", "held-0")
    _, err = second.communicate(timeout=10)
    assert second.returncode == 0, err
    assert first.poll() is None  # ben still waits
    docker(stack, "rm", "-f", "held-1")
    _, err = first.communicate(timeout=10)
    assert first.returncode == 0, err


def test_a_malformed_duration_is_a_clean_error(stack: engine.Stack) -> None:
    got = engine.gpu_alloc(stack, "report", "--since", "3 fortnights")
    assert got.returncode == 2 and got.stdout == ""
    assert got.stderr.startswith("gpu-alloc report: --since '3 fortnights': expected a duration")
    assert "Traceback" not in got.stderr


def queue(stack: engine.Stack) -> list[dict]:
    return cli(stack, "status", "--no-reconcile")["queue"]
