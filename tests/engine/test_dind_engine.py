"""Docker-in-Docker for the owner the policy grants it (``policy.powers.privileged``), on a
real dockerd: their privileged container, made through the shim, leases every GPU and runs
a dockerd of its own that runs a container; anyone else's is refused naming the key, and
so is the same create on dockerd's own socket; the grant taken away, the container's
next start is refused.

The container runs it all itself (tests/support/dind_image.py): `docker exec` into a
container of a dockerd run from a chroot on this machine does not enter the container.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import clients, engine, engine_root, host_users
from tests.support.dind_image import DIND_TAG, import_dind
from tests.support.faults import status
from tests.support.policy_edits import RELOADED_WITHIN, log_sizes, set_policy, wait_for_log

GPUS = 2
CI_RUNNER, OTHER = engine_root.host_user("ga41d-ci"), engine_root.host_user("ga41d-eve")
KEY = "policy.powers: {privileged:"


GRANT = {"privileged": {"users": [CI_RUNNER]}}


def make_stack() -> engine.Stack:
    return engine.Stack(gpus=GPUS, policy={"exempt": [], "powers": GRANT})


@pytest.fixture(scope="module")
def owners(stack: engine.Stack) -> Iterator[None]:
    import_dind(stack.engine_sock)
    with host_users.present(CI_RUNNER, OTHER):
        host_users.open_shim(stack)
        yield


def shim(stack: engine.Stack, *args: str, user: str = CI_RUNNER):
    return clients.docker_cli(stack.shim_sock, *args, user=user, timeout=300)


def bounding_set_is_short() -> bool:
    """This machine withholds a capability from every process (its bounding set), so a
    runc that gives a privileged container every capability the kernel has cannot start
    it (the host's runc 1.1.5: "unable to apply caps"); later runcs give what there is."""
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    status_lines = Path("/proc/self/status").read_text().splitlines()
    bounding = next(int(line.split()[1], 16) for line in status_lines if line.startswith("CapBnd"))
    return bounding != (1 << (last + 1)) - 1


def test_the_granted_owner_runs_docker_in_docker_holding_every_gpu(stack, owners):
    ran = shim(stack, "run", "--privileged", "--name", "dind", DIND_TAG)
    (lease,) = status(stack)["leases"]  # admitted: its lease holds the host
    assert lease["owner"] == CI_RUNNER and len(lease["gpus"]) == GPUS
    other = shim(stack, "run", "--rm", "--gpus", "1", engine.BUSYBOX_TAG, "true", user=OTHER)
    assert other.returncode != 0 and "holds" in other.stderr, other.stderr
    if "unable to apply caps" in ran.stderr and bounding_set_is_short():
        pytest.skip("this machine's bounding set lacks a capability this Engine's runc gives")
    assert ran.returncode == 0 and ran.stdout.strip() == "nested", ran.stdout + ran.stderr


def test_privileged_stays_refused_for_others_and_on_dockerds_socket(stack, owners):
    other = shim(stack, "create", "--privileged", DIND_TAG, user=OTHER)
    assert other.returncode != 0 and KEY in other.stderr, other.stderr
    real = clients.docker_cli(stack.engine_sock, "create", "--privileged", DIND_TAG)
    assert real.returncode != 0 and "gpu-alloc refused" in real.stderr, real.stderr
    assert not engine.engine_api(stack.engine_sock).containers(all=True)


@pytest.fixture
def revoked(stack: engine.Stack) -> Iterator[None]:
    """The grant moved to someone else while the test runs, then given back."""
    since = log_sizes(stack)
    set_policy(stack, powers={"privileged": {"users": [OTHER]}})
    wait_for_log(stack, "policy reloaded", since)
    yield
    since = log_sizes(stack)
    set_policy(stack, powers=GRANT)
    wait_for_log(stack, "policy reloaded", since)


def test_a_privileged_container_whose_owner_lost_the_grant_does_not_start_again(
    stack, owners, request
):
    """Nor does dockerd start it by itself: its restart policy is turned off."""
    made = shim(stack, "create", "--privileged", "--restart", "always", "--name", "kept", DIND_TAG)
    assert made.returncode == 0, made.stderr
    request.getfixturevalue("revoked")
    for sock in (stack.shim_sock, stack.engine_sock):
        start = clients.docker_cli(sock, "start", "kept")
        assert start.returncode != 0, start.stdout
        assert f"no longer lets {CI_RUNNER} run privileged" in start.stderr, start.stderr
    api = engine.engine_api(stack.engine_sock)
    deadline = time.monotonic() + RELOADED_WITHIN
    while (policy := api.inspect_container("kept")["HostConfig"]["RestartPolicy"]["Name"]) != "no":
        assert time.monotonic() < deadline, f"restart policy still {policy!r}"
        time.sleep(0.2)
