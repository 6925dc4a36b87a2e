"""Shared GPUs on a real dockerd: shares pack, MPS daemons come and go, refusals hold.

Simulated GPUs 0 and 1 are four MPS shares each (policy.sharing), GPU 2 (pool ``ts``)
two timeslice shares; GPU 3 is whole only.
The ``nvidia-cuda-mps-control`` stand-in (tests/support/mps_control.py: a daemon that
takes the commands NVIDIA documents and refuses others) records every call it is given
(the GPU it was run for, its arguments, and the commands read on stdin) in ``mps-calls.log``.
"""

from __future__ import annotations

import json
import time

import pytest

from allocator.core.rules.sharing import CLIENT_PIPE
from allocator.host.ledger import Ledger
from tests.support import engine, mps_control
from tests.support.policy_edits import set_policy

IMAGE = engine.BUSYBOX_TAG
GPU = [engine.sim_gpu_uuid(k) for k in range(4)]
POLICY = {
    "pools": {"ts": {"gpus": [2]}},
    "sharing": [{"gpus": [0, 1], "shares": 4}, {"pool": "ts", "shares": 2, "mode": "timeslice"}],
}
SHARE = ("--gpus", "1", "--label", "io.gpu-alloc.share=1/4")


def make_stack() -> engine.Stack:
    stack = engine.Stack(gpus=4, policy=POLICY)
    fake = mps_control.install(stack.dir / "nvidia-cuda-mps-control", stack.dir / "mps-calls.log")
    stack.extra = {"mps": {"dir": str(stack.dir / "mps"), "control": str(fake)}}
    return stack


@pytest.fixture(autouse=True, scope="module")
def _daemons_quit(stack):
    """The stand-in's daemons are processes: none outlives the module's stack."""
    yield
    mps_control.quit_all(stack.dir / "mps")


def shim(stack: engine.Stack, *args: str):
    return engine.docker_cli(stack.shim_sock, *args)


def real(stack: engine.Stack, *args: str):
    return engine.docker_cli(stack.engine_sock, *args)


def calls(stack: engine.Stack) -> list[str]:
    log = stack.dir / "mps-calls.log"
    return log.read_text().splitlines() if log.exists() else []


def shares(stack: engine.Stack) -> list[tuple[tuple[str, ...], int, int]]:
    leases = Ledger(stack.state_dir).read().leases.values()
    return sorted((le.gpus, le.share_slots, le.share_of) for le in leases if le.share_of)


def wait_for(what, timeout: float = 15.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = what()
        if got:
            return got
        time.sleep(0.2)
    return what()


def test_four_quarters_share_one_gpu_and_its_one_daemon_until_the_last_ends(stack):
    for k in range(4):
        run = shim(stack, "run", "-d", "--name", f"q{k}", *SHARE, IMAGE, "sleep", "300")
        assert run.returncode == 0, run.stderr + stack.logs()
    assert shares(stack) == [((GPU[0],), 1, 4)] * 4
    started = [c for c in calls(stack) if c.endswith("args=-d")]
    assert started == [f"call gpu={GPU[0]} pipe={stack.dir}/mps/{GPU[0]}/pipe args=-d"]
    # 81920 MiB / 4 and 100 % / 4, set by the daemon's own index 0
    assert f"cmd gpu={GPU[0]} set_default_device_pinned_mem_limit 0 20480M" in calls(stack)
    assert f"cmd gpu={GPU[0]} set_default_active_thread_percentage 25" in calls(stack)
    info = engine.engine_api(stack.engine_sock).inspect_container("q0")
    assert f"CUDA_MPS_PIPE_DIRECTORY={CLIENT_PIPE}" in info["Config"]["Env"]
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M" in info["Config"]["Env"]
    assert f"{stack.dir}/mps/{GPU[0]}/pipe:{CLIENT_PIPE}" in info["HostConfig"]["Binds"]
    assert f"{stack.dir}/mps/{GPU[0]}/shm:/dev/shm" in info["HostConfig"]["Binds"]
    assert info["HostConfig"]["DeviceRequests"][0]["DeviceIDs"] == [GPU[0]]
    assert info["Config"]["Labels"]["io.gpu-alloc.share"] == "1/4"

    status = engine.gpu_alloc(stack, "status").stdout
    assert "GPU 0 shared: 4 of 4 out; 4 MPS shares of 20480 MiB and 25% each" in status
    assert "share 1/4: q3 of root" in status
    ask = ("explain", "--user", "root", "--label", "io.gpu-alloc.share=1/4")
    explained = engine.gpu_alloc(stack, *ask).stdout
    assert "would be granted now: GPU 1" in explained, explained
    assert "as 1/4 of a GPU, one of its 4 MPS shares" in explained

    fifth = shim(stack, "run", "-d", "--name", "q4", *SHARE, IMAGE, "sleep", "300")
    assert fifth.returncode == 0, fifth.stderr
    assert ((GPU[1],), 1, 4) in shares(stack)

    whole = shim(stack, "run", "-d", "--name", "whole", "--gpus", "2", IMAGE, "sleep", "300")
    assert whole.returncode == 0, whole.stderr
    leased = Ledger(stack.state_dir).read().leases.values()
    assert {u for le in leased if not le.share_of for u in le.gpus} == {GPU[2], GPU[3]}
    more = shim(stack, "run", "-d", "--gpus", "1", IMAGE, "sleep", "300")
    assert more.returncode != 0  # GPUs 0 and 1 have shares out: never leased whole
    assert "0 of 4 free on this host" in more.stderr, more.stderr

    status = json.loads(engine.gpu_alloc(stack, "status", "--json").stdout)
    assert sum(1 for le in status["leases"] if le.get("share_of") == 4) == 5

    assert shim(stack, "rm", "-f", "q0", "q1", "q2").returncode == 0
    time.sleep(3)
    assert not any(c.endswith("quit") for c in calls(stack))  # q3 still holds a share
    assert shim(stack, "rm", "-f", "q3").returncode == 0
    assert wait_for(lambda: f"cmd gpu={GPU[0]} quit" in calls(stack)), calls(stack)
    assert f"cmd gpu={GPU[1]} quit" not in calls(stack)


def test_share_refusals_hold_on_both_sockets(stack):
    own_env = shim(stack, "run", "--rm", *SHARE, "-e", "CUDA_MPS_PIPE_DIRECTORY=/x", IMAGE, "true")
    assert own_env.returncode != 0 and "CUDA_MPS_PIPE_DIRECTORY" in own_env.stderr
    ipc = shim(stack, "run", "--rm", *SHARE, "--ipc", "host", IMAGE, "true")
    assert ipc.returncode != 0 and "--ipc host" in ipc.stderr
    two = shim(stack, "run", "--rm", "--gpus", "2", "--label", "io.gpu-alloc.share=1/4", IMAGE)
    assert two.returncode != 0 and "--gpus 1" in two.stderr
    third = shim(stack, "run", "--rm", "--gpus", "1", "--label", "io.gpu-alloc.share=1/3", IMAGE)
    assert third.returncode != 0 and "not a whole number of its 4 shares" in third.stderr

    held = shim(stack, "run", "-d", "--name", "held", *SHARE, IMAGE, "sleep", "300")
    assert held.returncode == 0, held.stderr
    pipe = f"{stack.dir}/mps/{GPU[0]}/pipe"
    # The real socket: a bind of a shared GPU's pipe directory, or the GPU itself, with
    # no share lease; and --ipc host beside the share's binds.
    for args in (
        ("-v", f"{pipe}:{CLIENT_PIPE}"),
        ("-v", f"{stack.dir}/mps:/mps"),
        ("--gpus", f"device={GPU[0]}"),
        ("--ipc", "host", "-v", f"{pipe}:{CLIENT_PIPE}"),
    ):
        made = real(stack, "run", "--rm", *args, IMAGE, "true")
        assert made.returncode != 0, args
        assert "authorization denied by plugin" in made.stderr, made.stderr
    # Through the shim, a client's own bind of a pipe directory asks for that GPU, and
    # a share is one GPU asked with --gpus 1 alone.
    sneaky = shim(stack, "run", "--rm", *SHARE, "-v", f"{pipe}:/p", IMAGE, "true")
    assert sneaky.returncode != 0
    assert shim(stack, "rm", "-f", "held").returncode == 0


def test_joining_a_shares_namespaces_is_reaching_its_gpu(stack):
    """Through /proc/<pid>/root a joined PID namespace reaches the share's MPS pipe; a
    joined IPC namespace its /dev/shm; --volumes-from its binds."""
    held = shim(stack, "run", "-d", "--name", "held", *SHARE, IMAGE, "sleep", "300")
    assert held.returncode == 0, held.stderr
    plain = real(stack, "run", "-d", "--name", "plain", IMAGE, "sleep", "300")
    assert plain.returncode == 0, plain.stderr
    try:
        for args in (("--pid", "container:held"), ("--ipc", "container:held"),
                     ("--network", "container:held"), ("--volumes-from", "held")):  # fmt: skip
            made = real(stack, "create", *args, IMAGE, "true")
            assert made.returncode != 0, args
            assert "authorization denied by plugin" in made.stderr, made.stderr
            assert GPU[0] in made.stderr or "MPS" in made.stderr, made.stderr
        beside = real(stack, "create", "--network", "container:plain", IMAGE, "true")
        assert beside.returncode == 0, beside.stderr
    finally:
        real(stack, "rm", "-f", "held", "plain")


def test_a_join_is_judged_on_every_container_its_reference_could_name_by_then(stack):
    """dockerd reads a reference as a full id, a name, then an id prefix, when it acts: a
    join whose reference names a plain container now but begins the share's id is judged
    on both (a rename of the plain one would leave it the share's), and one whose name no
    container has is refused (dockerd would take whatever is given that name by then)."""
    held = shim(stack, "run", "-d", "--name", "held", *SHARE, IMAGE, "sleep", "300")
    assert held.returncode == 0, held.stderr
    prefix = held.stdout.strip()[:12]
    plain = real(stack, "run", "-d", "--name", prefix, IMAGE, "sleep", "300")
    assert plain.returncode == 0, plain.stderr
    try:
        for args in (("--pid", f"container:{prefix}"), ("--volumes-from", prefix)):
            made = real(stack, "create", *args, IMAGE, "true")
            assert made.returncode != 0 and "authorization denied by plugin" in made.stderr, args
            assert GPU[0] in made.stderr or "MPS" in made.stderr, made.stderr
        for args in (("--network", "container:later"), ("--volumes-from", "later")):
            made = real(stack, "create", *args, IMAGE, "true")
            assert made.returncode != 0, made.stdout
            assert "no container is 'later' now" in made.stderr, made.stderr
    finally:
        real(stack, "rm", "-f", "held", prefix)


def test_shares_count_as_fractions_in_limits(stack):
    original = stack.config_path.read_text()
    set_policy(stack, limits={"default": {"gpus": 1}}, exempt=[])
    try:
        for k in range(4):
            run = shim(stack, "run", "-d", "--name", f"l{k}", *SHARE, IMAGE, "sleep", "300")
            assert run.returncode == 0, run.stderr
        over = shim(stack, "run", "-d", "--name", "l4", *SHARE, IMAGE, "sleep", "300")
        assert over.returncode != 0
        assert "holds 1 of 1 GPU allowed" in over.stderr, over.stderr
        assert shim(stack, "rm", "-f", "l0").returncode == 0
        again = shim(stack, "run", "-d", "--name", "l4", *SHARE, IMAGE, "sleep", "300")
        assert again.returncode == 0, again.stderr  # a quarter freed makes room for one
    finally:
        stack.config_path.write_text(original)


def test_mps_serves_one_user_at_a_time_so_another_users_share_goes_elsewhere(stack):
    assert (
        shim(stack, "run", "-d", "--name", "rooted", *SHARE, IMAGE, "sleep", "300").returncode == 0
    )
    other = shim(
        stack, "run", "-d", "--name", "other", "--user", "1000", *SHARE, IMAGE, "sleep", "300"
    )
    assert other.returncode == 0, other.stderr
    by_user = {le.share_user: le.gpus for le in Ledger(stack.state_dir).read().leases.values()}
    assert by_user == {"0": (GPU[0],), "1000": (GPU[1],)}
    third = shim(stack, "run", "--rm", "--user", "1001", *SHARE, IMAGE, "true")
    assert third.returncode != 0
    assert "MPS serves one user at a time" in third.stderr, third.stderr
    assert shim(stack, "rm", "-f", "rooted", "other").returncode == 0


def test_timeslice_shares_get_no_daemon_no_caps_and_say_so(stack):
    pool = ("--label", "io.gpu-alloc.pool=ts")
    for k in range(2):
        run = shim(stack, "run", "-d", "--name", f"t{k}", *SHARE[:3], "io.gpu-alloc.share=1/2",
                   *pool, IMAGE, "sleep", "300")  # fmt: skip
        assert run.returncode == 0, run.stderr
    assert shares(stack) == [((GPU[2],), 1, 2)] * 2
    info = engine.engine_api(stack.engine_sock).inspect_container("t0")
    assert not [e for e in info["Config"]["Env"] if e.startswith("CUDA_MPS_")]
    assert not info["HostConfig"]["Binds"]
    assert not [c for c in calls(stack) if GPU[2] in c]
    shown = engine.gpu_alloc(stack, "status")
    status = shown.stdout + shown.stderr
    assert (
        "GPU 2 shared: 2 of 2 out; 2 timeslice shares (no memory or compute caps, no isolation)"
        in status
    )
    assert shim(stack, "rm", "-f", "t0", "t1").returncode == 0


def test_a_reset_keeps_running_shares_and_their_daemons(stack):
    """`gpu-alloc repair --reset` while shares run: each is its GPU's share again, and a
    GPU's MPS daemon is told to quit only once its last share ends."""
    for name, *user in (("kept",), ("ends", "--user", "1000")):
        run = shim(stack, "run", "-d", "--name", name, *user, *SHARE, IMAGE, "sleep", "300")
        assert run.returncode == 0, run.stderr
    users = {le.gpus: le.share_user for le in Ledger(stack.state_dir).read().leases.values()}
    assert users == {(GPU[0],): "0", (GPU[1],): "1000"}
    before, seen = shares(stack), len(calls(stack))
    reset = engine.gpu_alloc(stack, "repair", "--reset")
    assert reset.returncode == 0, reset.stderr
    assert "adopted 2 container(s)" in reset.stdout, reset.stdout
    assert shares(stack) == before
    after = {le.gpus: le.share_user for le in Ledger(stack.state_dir).read().leases.values()}
    assert after == users
    # The look that quits GPU 1's daemon, its share gone, saw GPU 0's share still out.
    assert shim(stack, "rm", "-f", "ends").returncode == 0
    assert wait_for(lambda: f"cmd gpu={GPU[1]} quit" in calls(stack)[seen:]), calls(stack)
    assert f"cmd gpu={GPU[0]} quit" not in calls(stack)[seen:]
    assert shim(stack, "rm", "-f", "kept").returncode == 0
    assert wait_for(lambda: f"cmd gpu={GPU[0]} quit" in calls(stack)[seen:]), calls(stack)


COMPOSE = f"""
version: "3.8"
services:
  notebook:
    image: {IMAGE}
    command: ["sleep", "300"]
    network_mode: none
    labels:
      io.gpu-alloc.share: "1/4"
    deploy:
      resources:
        reservations:
          devices:
            - driver: nvidia
              count: 1
              capabilities: [gpu]
"""


def test_compose_replicas_ask_for_shares_with_the_same_label(stack, tmp_path):
    (tmp_path / "docker-compose.yml").write_text(COMPOSE)
    up = engine.docker_compose(
        stack.shim_sock, tmp_path, "up", "-d", "--scale", "notebook=3", project_name="gashare"
    )
    try:
        assert up.returncode == 0, up.stderr + stack.logs()
        assert shares(stack) == [((GPU[0],), 1, 4)] * 3
    finally:
        engine.docker_compose(stack.shim_sock, tmp_path, "down", "-t", "1", project_name="gashare")
    assert wait_for(lambda: not shares(stack))
