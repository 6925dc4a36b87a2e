"""Waiting in line through a real dockerd: three people, two GPUs, `docker rm -f` frees them.

The docker CLI runs as three non-root users (the shim learns who asks from
SO_PEERCRED) with ``--label io.gpu-alloc.wait=2m``; the policy gives them
different priorities, so the order they are served in is the policy's, not
their arrival's.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest

from allocator.host.audit import AuditLog
from allocator.host.ledger import Ledger
from tests.support import clients, engine, host_users

IMAGE = engine.BUSYBOX_TAG
LOW, MID, HIGH = "ga15low", "ga15mid", "ga15high"
POLICY = {"priority": {"users": {LOW: 0, MID: 5, HIGH: 10}}}
WAIT = "io.gpu-alloc.wait"


def make_stack() -> engine.Stack:
    return engine.Stack(gpus=2, policy=POLICY)


@pytest.fixture(scope="module", autouse=True)
def users(stack: engine.Stack) -> Iterator[None]:
    with host_users.present(LOW, MID, HIGH):
        host_users.open_shim(stack)
        yield


def docker(stack: engine.Stack, *args: str, user: str | None = None):
    return clients.docker_cli(stack.shim_sock, *args, user=user)


def waiting_create(stack: engine.Stack, user: str, name: str, wait: str = "2m", gpus: str = "1"):
    """``docker create`` in the background, as ``user``; the CLI waits as long as it takes."""
    env = clients._client_env(stack.shim_sock, None)
    shutil.chown(env["DOCKER_CONFIG"], user)
    env["HOME"] = env["DOCKER_CONFIG"]
    argv = [clients.docker_bin(), "-H", env["DOCKER_HOST"], "create", "--name", name,
            "--gpus", gpus, "--label", f"{WAIT}={wait}", IMAGE, "true"]  # fmt: skip
    return subprocess.Popen(
        argv, env=env, user=user, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def queue(stack: engine.Stack) -> list[dict]:
    out = subprocess.run(
        [*engine.gpu_alloc_command(), "--config", str(stack.config_path), "status", "--json",
         "--no-reconcile"], capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)["queue"]


def until(what: str, check, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def hold_every_gpu(stack: engine.Stack) -> list[str]:
    names = ["held-0", "held-1"]
    for name in names:
        got = docker(stack, "create", "--name", name, "--gpus", "1", IMAGE, "true")
        assert got.returncode == 0, got.stderr
    return names


def test_waiters_are_served_by_priority_as_gpus_are_freed(stack: engine.Stack) -> None:
    held = hold_every_gpu(stack)
    procs = {}
    for user in (LOW, MID, HIGH):  # arrival order is the reverse of the priority order
        procs[user] = waiting_create(stack, user, f"w-{user}")
        until(f"{user} in the queue", lambda u=user: u in [r["owner"] for r in queue(stack)])
    assert [r["owner"] for r in queue(stack)] == [HIGH, MID, LOW]
    served = []
    for victim in (*held, f"w-{HIGH}"):
        assert docker(stack, "rm", "-f", victim).returncode == 0
        freed = time.monotonic()
        until("a grant", lambda: any(p.poll() is not None for u, p in procs.items()
                                     if u not in served), timeout=5)  # fmt: skip
        took = time.monotonic() - freed
        user = next(u for u, p in procs.items() if u not in served and p.poll() is not None)
        assert procs[user].returncode == 0, procs[user].stderr.read()
        assert took < 1.0, f"{user} granted {took:.2f}s after the release"
        served.append(user)
    assert served == [HIGH, MID, LOW]
    for name in (f"w-{MID}", f"w-{LOW}"):
        docker(stack, "rm", "-f", name)


def test_a_killed_waiter_leaves_no_pending_lease_and_no_place_in_line(stack) -> None:
    held = hold_every_gpu(stack)
    proc = waiting_create(stack, LOW, "w-killed")
    until("the waiter in the queue", lambda: len(queue(stack)) == 1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    until("the queue to empty", lambda: queue(stack) == [])
    leases = Ledger(stack.state_dir).read().leases.values()
    assert all(le.container for le in leases), "a pending lease was left behind"
    assert docker(stack, "rm", "-f", held[0]).returncode == 0
    time.sleep(0.5)  # the freed GPU stays free: nobody is left in line for it
    assert len(Ledger(stack.state_dir).read().leases) == 1
    docker(stack, "rm", "-f", held[1])


def test_a_waiter_past_its_time_is_refused_saying_how_long_it_waited(stack) -> None:
    held = hold_every_gpu(stack)
    started = time.monotonic()
    proc = waiting_create(stack, MID, "w-late", wait="2s")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0 and time.monotonic() - started >= 2
    assert "not enough free GPUs" in err and "waited 2s in line" in err, err
    # one refusal in the audit trail, once its time ran out, under its owner's name
    (line,) = [e for e in AuditLog(stack.state_dir).read() if e["name"] == "w-late"]
    assert (line["event"], line["owner"]) == ("refusal", MID)
    assert "waited 2s in line" in line["reason"]
    assert line["waited_s"] == 2.0  # gpu-alloc report counts it as a wait
    for name in held:
        docker(stack, "rm", "-f", name)


def test_more_gpus_than_the_host_has_are_refused_at_once(stack) -> None:
    started = time.monotonic()
    proc = waiting_create(stack, LOW, "w-huge", gpus="3")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0 and "has only 2" in err, err
    assert time.monotonic() - started < 5


def free_index(stack: engine.Stack) -> int:
    """The index of the one GPU no lease holds."""
    leased = {g for le in Ledger(stack.state_dir).read().leases.values() for g in le.gpus}
    (index,) = [i for i in range(2) if engine.sim_gpu_uuid(i) not in leased]
    return index


@pytest.mark.parametrize("asks", ["2", "all"])
def test_gpus_kept_for_a_waiter_go_to_it_not_to_creates_behind_it(stack, asks) -> None:
    """A waiter short of GPUs keeps the free one it could use: plain `docker run --gpus 1`
    or `--gpus device=N` behind it in line may not take it, and it gets it once a second
    GPU is freed."""
    docker(stack, "create", "--name", "held", "--gpus", "1", IMAGE, "true")
    spare = free_index(stack)
    proc = waiting_create(stack, MID, "w-big", gpus=asks)
    until("the waiter in the queue", lambda: [r["owner"] for r in queue(stack)] == [MID])
    wanted = "all GPUs" if asks == "all" else "2 GPUs"
    for gpus in ("1", "1", f"device={spare}"):  # a stream of small creates, then by name
        late = docker(stack, "create", "--gpus", gpus, IMAGE, "true", user=LOW)
        assert late.returncode != 0, late.stdout
        assert f"kept for {MID}'s create 'w-big' waiting in line for {wanted}" in late.stderr
        assert "wait in line too (--label io.gpu-alloc.wait=30m" in late.stderr
    assert free_index(stack) == spare  # still free, for the waiter
    assert docker(stack, "rm", "-f", "held").returncode == 0
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    (lease,) = Ledger(stack.state_dir).read().leases.values()
    assert (lease.owner, len(lease.gpus)) == (MID, 2)
    docker(stack, "rm", "-f", "w-big")
