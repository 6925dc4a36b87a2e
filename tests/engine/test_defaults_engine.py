"""A GPU container that fails to start on a limit gpu-alloc added says gpu-alloc added it.

``policy.gpu_defaults`` fills in what a GPU create left unset; the container carries
``io.gpu-alloc.defaults`` naming what was added.  Here the operator's ``nofile``
ulimit is above the kernel's ``fs.nr_open``, so runc cannot apply it.
"""

from __future__ import annotations

import json

from allocator.core.api import labels
from allocator.core.judging import defaults
from tests.support import engine

IMAGE = engine.BUSYBOX_TAG
TOO_MANY = 1 << 30  # open files: above fs.nr_open, which runc's setrlimit cannot exceed


def make_stack() -> engine.Stack:
    return engine.Stack(gpus=2, policy={"gpu_defaults": {"ulimits": {"nofile": TOO_MANY}}})


def shim(stack: engine.Stack, *args: str):
    return engine.docker_cli(stack.shim_sock, *args)


def test_a_start_failing_on_an_added_ulimit_names_gpu_alloc_and_the_fix(stack) -> None:
    out = shim(stack, "run", "--name", "limited", "--gpus", "1", IMAGE, "true")
    try:
        assert out.returncode != 0
        assert "rlimit" in out.stderr, out.stderr  # runc's own words are kept
        assert f"gpu-alloc added ulimit nofile={TOO_MANY}:{TOO_MANY} to this GPU container" in (
            out.stderr
        )
        assert "set your own with --shm-size or --ulimit to override" in out.stderr
        found = shim(stack, "inspect", "--format", "{{json .Config.Labels}}", "limited").stdout
        assert json.loads(found)[labels.DEFAULTS] == f"ulimit nofile={TOO_MANY}:{TOO_MANY}"
    finally:
        shim(stack, "rm", "-f", "limited")


def test_a_ulimit_the_user_set_is_theirs_and_nothing_is_added(stack) -> None:
    out = shim(stack, "run", "--rm", "--gpus", "1", "--ulimit", "nofile=1024:1024", IMAGE,
               "sh", "-c", "ulimit -n")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1024"


def test_the_note_is_only_for_limits_gpu_alloc_added() -> None:
    given = {labels.LEASE: "l1", labels.DEFAULTS: "shm_size=2147483648"}
    assert "gpu-alloc added shm_size=2147483648" in defaults.start_note("invalid shm size", given)
    assert defaults.start_note("exec: true: not found", given) == ""
    assert defaults.start_note("error setting rlimit type 7", {labels.LEASE: "l1"}) == ""
    forged = {labels.DEFAULTS: "ulimit nofile=1:1"}  # no lease: not a container gpu-alloc made
    assert defaults.start_note("error setting rlimit type 7", forged) == ""


def test_added_names_only_what_the_defaults_filled_in() -> None:
    mine = {"HostConfig": {"Ulimits": [{"Name": "nofile", "Soft": 1, "Hard": 1}]}}
    memlock = {"Name": "memlock", "Soft": -1, "Hard": -1}
    filled = {
        "HostConfig": {"ShmSize": 2 << 30, "Ulimits": [*mine["HostConfig"]["Ulimits"], memlock]}
    }
    assert defaults.added(mine, filled) == "shm_size=2147483648,ulimit memlock=-1:-1"
    assert defaults.added(mine, mine) == ""
