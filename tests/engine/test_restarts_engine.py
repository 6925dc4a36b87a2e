"""Restart policies on a real dockerd: what the daemon starts by itself, asking nobody.

dockerd starts ``always`` containers, and ``on-failure`` ones that exited non-zero,
again when it starts, without any request reaching the plugin.  A container whose
lease ended while it existed (``release_stopped_after``, a Compose predecessor that
lent its GPUs) must therefore have no restart policy left, or a dockerd restart
runs it beside the container its GPU went to.

One GPU, so any second container gets the same GPU; stopped containers lose their
lease after 2 seconds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from allocator.host.ledger import Ledger
from tests.engine.test_enforcement_engine import raw
from tests.support import engine
from tests.support.faults import IMAGE, FaultStack, live_grants, real, shim, status, visible_devices


def make_stack() -> engine.Stack:
    stack = FaultStack(gpus=1)
    stack.policy = {"release_stopped_after": "2s"}
    return stack


def ok(result) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def restart_policy(stack: FaultStack, cid: str) -> str:
    info = engine.engine_api(stack.engine_sock).inspect_container(cid)
    return info["HostConfig"]["RestartPolicy"]["Name"] or "no"


def turned_off(stack: FaultStack) -> list[dict]:
    """The audit trail's ``restart-off`` lines."""
    lines = (stack.state_dir / "audit.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == "restart-off"]


def wait_free(stack: FaultStack) -> None:
    deadline = time.monotonic() + 30
    while status(stack)["free"] != 1:
        assert time.monotonic() < deadline, stack.logs()
        time.sleep(0.5)


def running_on_one_gpu(stack: FaultStack) -> list[str]:
    """The running containers that share a GPU with another running one."""
    running = {cid: gpus for cid, (gpus, up) in live_grants(stack).items() if up and gpus}
    return [a for a in running for b in running if a != b and running[a] & running[b]]


@pytest.mark.parametrize("policy", ["always", "on-failure"])
def test_an_expired_containers_policy_is_off_so_a_dockerd_restart_runs_one_per_gpu(stack, policy):
    """``docker stop -t 0`` kills it (exit 137): ``always`` and ``on-failure`` both have
    dockerd start it again at its next start."""
    first = ok(shim(stack, "run", "-d", "--name", "first", "--restart", policy,
                    "--gpus", "1", IMAGE, "sleep", "300"))  # fmt: skip
    gpu = visible_devices(stack, first)
    ok(shim(stack, "stop", "-t", "0", "first"))
    wait_free(stack)  # stopped longer than release_stopped_after: its lease expired
    assert restart_policy(stack, first) == "no"
    (line,) = [e for e in turned_off(stack) if e["container"] == first]
    assert line["gpus"] == [gpu] and f"restart policy {policy} turned off" in line["reason"]
    second = ok(shim(stack, "run", "-d", "--name", "second", "--restart", "always",
                     "--gpus", "1", IMAGE, "sleep", "300"))  # fmt: skip
    assert visible_devices(stack, second) == gpu
    stack.restart_dockerd()
    api = engine.engine_api(stack.engine_sock)
    deadline = time.monotonic() + 30
    while not api.inspect_container(second)["State"]["Running"]:
        assert time.monotonic() < deadline, "the restart-always container did not come back"
        time.sleep(0.3)
    time.sleep(2)  # dockerd starts every restart-policy container at once
    assert not api.inspect_container(first)["State"]["Running"]
    assert running_on_one_gpu(stack) == []


UPDATES = [("--restart", "always"), ("--restart", "unless-stopped"), ("--restart", "on-failure:3")]


@pytest.fixture
def unhurried_stack() -> Iterator[FaultStack]:
    """A stack whose stopped (or created, never started) containers keep their GPUs for an
    hour: a test whose checks between a create and its start take longer than
    ``make_stack``'s 2 s on a loaded machine."""
    stack = FaultStack(gpus=1)
    stack.policy = {"release_stopped_after": "1h"}
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


def test_a_compose_predecessor_may_not_get_a_restart_policy_back(unhurried_stack):
    """Compose v2's order on a full host (the replacement is made while the old one runs,
    and takes its GPU): the old one's ``restart: always`` goes off as it lends its GPU,
    and no update on either socket turns it back on."""
    stack = unhurried_stack
    api = engine.engine_api(stack.shim_sock)
    labels = {"com.docker.compose.project": "v2", "com.docker.compose.service": "trainer",
              "com.docker.compose.container-number": "1"}  # fmt: skip
    one = api.create_host_config(
        device_requests=[{"Count": 1, "Capabilities": [["gpu"]]}],
        restart_policy={"Name": "always"},
    )
    old = api.create_container(IMAGE, ["sleep", "300"], name="v2-trainer-1", labels=labels,
                               host_config=one)["Id"]  # fmt: skip
    api.start(old)
    new = api.create_container(
        IMAGE, ["sleep", "300"], name=f"{old[:12]}_v2-trainer-1", host_config=one,
        labels={**labels, "com.docker.compose.replace": old},
    )["Id"]  # fmt: skip
    assert visible_devices(stack, new) == visible_devices(stack, old)
    assert restart_policy(stack, old) == "no"
    assert [e["name"] for e in turned_off(stack) if e["container"] == old] == ["v2-trainer-1"]
    api.stop(old, timeout=0)
    for client in (shim, real):
        for args in UPDATES:
            refused = client(stack, "update", *args, "v2-trainer-1")
            assert refused.returncode != 0, args
            assert f"restart policy {args[1]} would have dockerd start" in refused.stderr
            assert "handed to the container replacing it" in refused.stderr
            assert "docker rm" in refused.stderr
    bodies = {
        b'{"RestartPolicy":{"Name":"always","MaximumRetryCount":0}}': "would have dockerd",
        b'{"RestartPolicy":{"Name":"on-failure","MaximumRetryCount":3}}': "on-failure:3",
        b'{"restartPolicy":{"name":"always"}}': "only by letter case",  # Go would read it
    }
    for sock in (stack.shim_sock, stack.engine_sock):
        for body, why in bodies.items():
            code, answer = raw(sock, "POST", f"/v1.41/containers/{old[:12]}/update", body)
            assert code == 403 and why in answer["message"], (body, answer)
    assert restart_policy(stack, old) == "no"
    ok(shim(stack, "update", "--restart", "no", "--cpu-shares", "512", old))  # no policy: fine
    api.remove_container(old)
    api.rename(new, "v2-trainer-1")
    api.start(new)
    ok(real(stack, "update", "--restart", "unless-stopped", new))  # its own live lease


def test_the_shim_turns_off_at_start_what_a_dockerd_restart_would_run_unleased(stack):
    """A lease that ended without the policy going off (the container expired under an
    older gpu-alloc) is found when the shim starts."""
    old = ok(shim(stack, "run", "-d", "--name", "old", "--restart", "always",
                  "--gpus", "1", IMAGE, "sleep", "300"))  # fmt: skip
    kept = ok(shim(stack, "run", "-d", "--name", "kept", "--restart", "always",
                   IMAGE, "sleep", "300"))  # fmt: skip
    stack.kill_shim()  # before it can expire the lease itself
    ok(real(stack, "stop", "-t", "0", "old"))
    ledger = Ledger(str(stack.state_dir), 5)
    with ledger.transaction() as state:
        lease = state.lease_of(old)
        assert lease is not None
        state.expire(lease.id, time.time())
    stack.start_shim()
    assert restart_policy(stack, old) == "no"
    assert restart_policy(stack, kept) == "always"  # no GPU: left alone
    (line,) = [e for e in turned_off(stack) if e["container"] == old]
    assert "restart policy always turned off" in line["reason"]
    assert "stopped longer than policy.release_stopped_after" in line["reason"]
    assert "restart policy always turned off" in (stack.dir / "shim.log").read_text()
