"""Time limits, idle reclaim and the checkpoint signal before either on a real dockerd, with
simulated GPU use.

One stack: root is not exempt, a GPU container may run an hour, one whose GPUs sit
unused for 2 s is stopped, and a stopped one loses its lease after 3 s.  Every GPU
is busy (50 %) unless a test says otherwise, so only the container a test idles is
reclaimed.  Containers get ``--stop-timeout 1``: busybox's sleep as PID 1 ignores
SIGTERM, so the Engine's stop kills it after that grace period.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from allocator.core.leases import events
from tests.support import engine
from tests.support.faults import IMAGE, gpu_alloc, shim, status, visible_devices
from tests.support.policy_edits import set_policy

POLICY = {
    "exempt": [],
    "time_limit": {"default": "1h"},
    "reclaim_idle_after": "2s",
    "release_stopped_after": "3s",
}
BUSY = {"utilization": 0.5, "processes": [{"pid": 4242, "used_memory_mib": 1000}]}
IDLE = {"utilization": 0.0}


def make_stack() -> engine.Stack:
    return engine.Stack(gpus=4, policy=POLICY)


def set_usage(stack: engine.Stack, usage: dict[str, Any], only: str | None = None) -> None:
    """What NVML would report, in the simulated GPU file: for GPU ``only``, else all."""
    entries = yaml.safe_load(stack.gpus_file.read_text())
    for e in entries:
        if only in (None, e["uuid"]):
            e["usage"] = usage
    stack.gpus_file.write_text(yaml.safe_dump(entries))


@pytest.fixture(autouse=True)
def busy_gpus(stack: engine.Stack) -> Iterator[None]:
    original = stack.config_path.read_text()
    set_usage(stack, BUSY)
    yield
    stack.config_path.write_text(original)
    os.utime(stack.config_path)


def run(stack: engine.Stack, name: str, *labels: str, restart: str = "no") -> str:
    args = ["--restart", restart, *(a for label in labels for a in ("--label", label))]
    out = shim(stack, "run", "-d", "--name", name, "--stop-timeout", "1", "--gpus", "1",
               *args, IMAGE, "sleep", "300")  # fmt: skip
    assert out.returncode == 0, out.stderr + stack.logs()
    return out.stdout.strip()


def running(stack: engine.Stack, cid: str) -> bool:
    return engine.engine_api(stack.engine_sock).inspect_container(cid)["State"]["Running"]


def stopped_within(stack: engine.Stack, cid: str, seconds: float) -> float | None:
    """Seconds until ``cid`` stopped; None if it still ran after ``seconds``."""
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        if not running(stack, cid):
            return time.monotonic() - began
        time.sleep(0.2)
    return None


def ran_for(state: dict[str, Any]) -> float:
    """Seconds between a stopped container's StartedAt and FinishedAt, as dockerd says."""
    started, finished = (events.parse_time(state[k][:26].rstrip("Z") + "+00:00")
                         for k in ("StartedAt", "FinishedAt"))  # fmt: skip
    return finished - started


def audited(stack: engine.Stack, event: str) -> list[dict[str, Any]]:
    lines = (stack.state_dir / "audit.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == event]


def audited_once(stack: engine.Stack, event: str, cid: str) -> dict[str, Any]:
    """The one ``event`` line about ``cid``: the timekeeper writes it once the stop returned,
    which can be a moment after the container is seen stopped."""
    deadline = time.monotonic() + 10
    while True:
        found = [e for e in audited(stack, event) if e["container"] == cid]
        if found or time.monotonic() > deadline:
            (line,) = found
            return line
        time.sleep(0.1)


def test_a_container_past_its_time_limit_is_stopped_may_not_start_and_loses_its_lease(stack):
    cid = run(stack, "timed", "io.gpu-alloc.time=3s", restart="always")
    (holder,) = status(stack)["holders"]
    assert holder["time_limit_s"] == 3 and 0 <= holder["time_left_s"] <= 3
    assert stopped_within(stack, cid, 30) is not None, stack.logs()
    ran = engine.engine_api(stack.engine_sock).inspect_container(cid)["State"]
    assert ran_for(ran) >= 3 - 0.1  # not before its time, by dockerd's own clock
    line = audited_once(stack, "time-limit", cid)
    assert "ran past its time limit of 3s" in line["reason"]
    assert "restart policy always was turned off" in line["reason"]  # dockerd's own start
    info = engine.engine_api(stack.engine_sock).inspect_container(cid)
    assert info["HostConfig"]["RestartPolicy"]["Name"] in ("", "no")
    assert line["gpus"] == [visible_devices(stack, cid)]
    again = shim(stack, "start", "timed")
    assert again.returncode != 0 and "ran its time limit of 3s" in again.stderr
    assert "docker rm" in again.stderr
    real = engine.docker_cli(stack.engine_sock, "start", "timed")
    assert "ran its time limit" in real.stderr  # the plugin refuses it too
    deadline = time.monotonic() + 30  # then policy.release_stopped_after, as any stopped one
    while status(stack)["free"] != 4:
        assert time.monotonic() < deadline, stack.logs()
        time.sleep(0.5)
    assert shim(stack, "rm", "timed").returncode == 0


def test_the_clock_starts_at_the_first_start_even_after_a_restart_before_the_first_look(stack):
    """The timekeeper looks every few seconds; a restart in between moves StartedAt, not
    the clock: dockerd's own start events say when the container first ran."""
    cid = run(stack, "restarted", "io.gpu-alloc.time=30m")
    api = engine.engine_api(stack.engine_sock)
    first = engine_time(api.inspect_container(cid)["State"]["StartedAt"])
    api.restart(cid, timeout=0)
    second = engine_time(api.inspect_container(cid)["State"]["StartedAt"])
    assert second > first
    deadline = time.monotonic() + 30
    while (started := lease_of(stack, cid).get("started")) is None:
        assert time.monotonic() < deadline, stack.logs()
        time.sleep(0.5)
    # The first start's event, which dockerd stamps a moment after its StartedAt (more
    # than 10 ms on a loaded machine), never the restart's.
    assert first - 0.01 <= started < second
    assert shim(stack, "rm", "-f", "restarted").returncode == 0


def engine_time(text: str) -> float:
    from allocator.host.engine import go_time

    stamp = go_time(text)
    assert stamp is not None, text
    return stamp


def lease_of(stack: engine.Stack, cid: str) -> dict[str, Any]:
    [lease] = [le for le in status(stack, reconcile=False)["leases"] if le["container"] == cid]
    return lease


def test_a_container_ignoring_its_stop_signal_is_killed_within_30_s_whatever_its_stop_timeout(
    stack,
):
    """dockerd waits for a container's own StopTimeout after the stop signal, forever when
    it is negative; busybox's sleep as PID 1 ignores SIGTERM."""
    out = shim(stack, "run", "-d", "--name", "stubborn", "--stop-timeout", "-1", "--gpus", "1",
               "--label", "io.gpu-alloc.time=2s", IMAGE, "sleep", "300")  # fmt: skip
    assert out.returncode == 0, out.stderr
    cid = out.stdout.strip()
    took = stopped_within(stack, cid, 60)
    assert took is not None, stack.logs()
    line = audited_once(stack, "time-limit", cid)
    assert "at most 30s" in line["reason"]
    assert shim(stack, "rm", "stubborn").returncode == 0


def test_a_request_for_more_time_than_its_limit_is_refused_naming_the_rule(stack):
    out = shim(stack, "run", "--rm", "--gpus", "1", "--label", "io.gpu-alloc.time=10h",
               IMAGE, "true")  # fmt: skip
    assert out.returncode != 0
    assert "(policy.time_limit.default)" in out.stderr and "10h" in out.stderr
    assert "ask for 1h or less" in out.stderr
    assert status(stack)["free"] == 4


def test_a_malformed_time_label_is_refused_with_the_accepted_forms(stack):
    out = shim(stack, "run", "--rm", "--gpus", "1", "--label", "io.gpu-alloc.time=soon",
               IMAGE, "true")  # fmt: skip
    assert out.returncode != 0
    assert "label io.gpu-alloc.time" in out.stderr and "'soon' is not a duration" in out.stderr
    assert "with s, m, h or d" in out.stderr
    assert status(stack)["free"] == 4


def test_a_container_whose_gpus_sit_unused_is_stopped_and_keeps_its_lease(stack):
    cid = run(stack, "sleepy")
    set_usage(stack, IDLE, only=visible_devices(stack, cid))
    assert stopped_within(stack, cid, 30) is not None, stack.logs()
    line = audited_once(stack, "idle-reclaim", cid)
    assert "policy.reclaim_idle_after" in line["reason"]
    # stopped, its GPU still leased until release_stopped_after (3 s), not released with it
    deadline = time.monotonic() + 30
    while not [e for e in audited(stack, "release") if e["container"] == cid]:
        assert time.monotonic() < deadline, stack.logs()
        status(stack)  # reconciles: releases what is due
        time.sleep(0.5)
    released = audited_once(stack, "release", cid)
    assert "policy.release_stopped_after" in released["reason"]
    held = events.parse_time(released["time"]) - events.parse_time(line["time"])
    assert held >= 3 - 0.1, (line, released)
    assert shim(stack, "rm", "sleepy").returncode == 0


def test_a_gpu_whose_use_cannot_be_read_is_shown_unknown_and_never_reclaimed(stack):
    """30 GB used and 250 W, but no utilisation figure (as NVML on some boards): not idle."""
    cid = run(stack, "unread")
    uuid = visible_devices(stack, cid)
    set_usage(stack, {"memory_used_mib": 30000, "power_w": 250}, only=uuid)
    assert stopped_within(stack, cid, 8) is None, stack.logs()  # reclaim_idle_after is 2 s
    assert all(e["container"] != cid for e in audited(stack, "idle-reclaim"))
    snap = status(stack)
    [gpu] = [g for g in snap["gpus"] if g["uuid"] == uuid]
    assert (gpu["use"], gpu["idle_since"]) == ("unknown", None)
    [holder] = [h for h in snap["holders"] if h["container"] == cid]
    assert (holder["use"], holder["idle"]) == ("unknown", False)
    table = gpu_alloc(stack, "status")
    assert "use unknown" in table.stdout and "(idle)" not in table.stdout
    rows = json.loads(gpu_alloc(stack, "gpus", "--json").stdout)["gpus"]
    [row] = [r for r in rows if r["uuid"] == uuid]
    assert (row["use"], row["idle"]) == ("unknown", False)
    assert "use unknown" in gpu_alloc(stack, "gpus").stdout
    assert shim(stack, "rm", "-f", "unread").returncode == 0


def test_a_busy_container_and_an_exempt_owners_idle_one_keep_running(stack):
    busy = run(stack, "busy")
    assert stopped_within(stack, busy, 5) is None
    set_policy(stack, exempt=["root"])
    time.sleep(2.5)  # the shim looks at the policy file every 2 s
    set_usage(stack, IDLE)
    assert stopped_within(stack, busy, 5) is None
    assert audited(stack, "idle-reclaim") == [] or all(
        e["container"] != busy for e in audited(stack, "idle-reclaim")
    )
    assert shim(stack, "rm", "-f", "busy").returncode == 0


# PID 1 traps the checkpoint signal (USR1) and its own stop signal (USR2), saying each in
# its log; it exits on USR2, so an exit code 0 says the stop was its own, not a SIGKILL.
TRAPPING = (
    'trap "echo got USR1" USR1; trap "echo got USR2; exit 0" USR2; echo ready; '
    "while :; do sleep 0.1; done"
)


def run_trapping(stack: engine.Stack, name: str, *labels: str) -> str:
    args = [a for label in labels for a in ("--label", label)]
    out = shim(stack, "run", "-d", "--name", name, "--stop-signal", "USR2", "--stop-timeout",
               "5", "--gpus", "1", *args, IMAGE, "sh", "-c", TRAPPING)  # fmt: skip
    assert out.returncode == 0, out.stderr + stack.logs()
    return out.stdout.strip()


def said(stack: engine.Stack, cid: str) -> list[str]:
    """What the trapping container's shell said, in order (its log)."""
    out = engine.docker_cli(stack.engine_sock, "logs", cid)
    return [line for line in out.stdout.splitlines() if line]


def said_within(stack: engine.Stack, cid: str, line: str, seconds: float) -> list[str]:
    deadline = time.monotonic() + seconds
    while line not in (lines := said(stack, cid)):
        assert time.monotonic() < deadline, (lines, stack.logs())
        time.sleep(0.2)
    return lines


def test_the_checkpoint_signal_comes_before_the_time_limit_then_its_own_stop_signal(stack):
    cid = run_trapping(stack, "checkpointed", "io.gpu-alloc.time=10s",
                       "io.gpu-alloc.signal=USR1@3s")  # fmt: skip
    assert stopped_within(stack, cid, 60) is not None, stack.logs()
    assert said(stack, cid) == ["ready", "got USR1", "got USR2"]
    ran = engine.engine_api(stack.engine_sock).inspect_container(cid)["State"]
    assert ran["ExitCode"] == 0  # its own stop signal ended it, within its stop timeout
    assert ran_for(ran) >= 10 - 0.1  # the signal did not stop it early, by dockerd's clock
    signal = audited_once(stack, "signal", cid)
    assert "sent SIGUSR1 3s before its time limit" in signal["reason"]
    stop = audited_once(stack, "time-limit", cid)
    assert events.parse_time(signal["time"]) < events.parse_time(stop["time"])
    assert shim(stack, "rm", "checkpointed").returncode == 0


def test_an_idle_container_is_signalled_before_reclaim_and_again_for_each_idle_stretch(stack):
    """A lead longer than reclaim_idle_after (2 s): the signal comes as soon as it is idle,
    and the stop only once its whole lead has passed, time enough to look and to use the
    GPU again."""
    cid = run_trapping(stack, "idler", "io.gpu-alloc.signal=USR1@8s")
    uuid = visible_devices(stack, cid)
    set_usage(stack, IDLE, only=uuid)
    said_within(stack, cid, "got USR1", 30)
    deadline = time.monotonic() + 30
    while not (holder := lease_holder(stack, cid))["signalled_at"]:
        assert time.monotonic() < deadline, stack.logs()
        time.sleep(0.3)
    assert (holder["signal"], holder["signal_lead_s"]) == ("SIGUSR1", 8)
    assert "signalled: idler was sent SIGUSR1 at" in gpu_alloc(stack, "status").stdout
    set_usage(stack, BUSY, only=uuid)  # it saved its work and goes on: not reclaimed
    assert stopped_within(stack, cid, 12) is None, stack.logs()
    set_usage(stack, IDLE, only=uuid)  # idle again: a new signal, then the stop
    assert stopped_within(stack, cid, 60) is not None, stack.logs()
    assert said(stack, cid) == ["ready", "got USR1", "got USR1", "got USR2"]
    assert [e["container"] for e in audited(stack, "signal")].count(cid) == 2
    assert "before its idle reclaim" in audited(stack, "signal")[-1]["reason"]
    assert audited_once(stack, "idle-reclaim", cid)
    assert shim(stack, "rm", "idler").returncode == 0


def lease_holder(stack: engine.Stack, cid: str) -> dict[str, Any]:
    [holder] = [h for h in status(stack, reconcile=False)["holders"] if h["container"] == cid]
    return holder
