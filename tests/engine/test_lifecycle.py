"""A container's whole life through the shim keeps or frees its lease, never both.

create, start, stop, restart and rename keep the GPU (a stopped container gets
the same UUID back on ``docker start``); ``rm``, ``rm -f`` and ``--rm`` free it
for the next create, even though none of them passes gpu-alloc with the
container's GPUs.  An image committed from a leased container carries the
lease's NVIDIA_VISIBLE_DEVICES in its ENV, and must still get no GPU.  Removals
while the shim is down, and a dockerd restart with ``--restart always``
containers, must neither leak a GPU nor grant one twice.

One stack (4 simulated GPUs) for the module; every test ends with the
invariants of tests/support/faults.py and every GPU free.
"""

from __future__ import annotations

import time

from tests.support import engine
from tests.support.faults import (
    IMAGE,
    FaultStack,
    assert_all_free,
    assert_invariants,
    held,
    real,
    remove_all,
    shim,
    status,
    visible_devices,
)

UUIDS = [engine.sim_gpu_uuid(k) for k in range(4)]
COMMITTED = "gpu-alloc-test/committed:latest"
VISIBLE = "NVIDIA_VISIBLE_DEVICES"


def make_stack() -> engine.Stack:
    return FaultStack(gpus=4)


def ok(result) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def run_gpu(stack: FaultStack, name: str, gpus: str = "1", *extra: str) -> tuple[str, str]:
    """`docker run -d --gpus N` through the shim; (container id, NVIDIA_VISIBLE_DEVICES)."""
    args = ("run", "-d", "--name", name, "--gpus", gpus, *extra, IMAGE, "sleep", "300")
    cid = ok(shim(stack, *args))
    return cid, visible_devices(stack, cid) or ""


def test_create_start_stop_restart_and_rename_keep_the_same_gpu(stack):
    cid = ok(shim(stack, "create", "--name", "life", "--gpus", "1", IMAGE, "sleep", "300"))
    gpu = visible_devices(stack, cid)
    assert gpu in UUIDS
    assert held(stack) == {gpu: cid}  # created, never started: already leased
    ok(shim(stack, "start", "life"))
    assert ok(shim(stack, "exec", "life", "printenv", "NVIDIA_VISIBLE_DEVICES")) == gpu
    ok(shim(stack, "restart", "-t", "0", "life"))
    assert ok(shim(stack, "exec", "life", "printenv", "NVIDIA_VISIBLE_DEVICES")) == gpu
    ok(shim(stack, "stop", "-t", "0", "life"))
    assert held(stack) == {gpu: cid}  # a stopped container keeps its GPU
    # Renamed while stopped, as Compose does (dockerd 20.10 with --bridge none cannot
    # rename a running container: "sandbox ... not found").
    ok(shim(stack, "rename", "life", "renamed"))
    assert held(stack) == {gpu: cid}
    ok(shim(stack, "start", "renamed"))
    assert ok(shim(stack, "exec", "renamed", "printenv", "NVIDIA_VISIBLE_DEVICES")) == gpu
    assert held(stack) == {gpu: cid}
    # The kept GPU is really kept: the three others go to the next create, then none.
    _, rest = run_gpu(stack, "rest", "3")
    assert sorted(rest.split(",")) == sorted(set(UUIDS) - {gpu})
    refused = shim(stack, "run", "--rm", "--gpus", "1", IMAGE, "true")
    assert refused.returncode != 0 and "0 of 4 free" in refused.stderr
    assert_invariants(stack)
    assert_all_free(stack)


def test_rm_and_rm_f_free_the_gpu_for_the_next_create(stack):
    gpus = dict(run_gpu(stack, f"full{k}")[::-1] for k in range(4))  # uuid -> cid
    assert sorted(gpus) == UUIDS
    stopped = gpus[UUIDS[1]]
    ok(shim(stack, "stop", "-t", "0", stopped))
    refused = shim(stack, "run", "--rm", "--gpus", "1", IMAGE, "true")
    assert refused.returncode != 0 and "0 of 4 free" in refused.stderr  # stopped still holds
    ok(shim(stack, "rm", stopped))
    # No status in between: the create itself must find the GPU that `docker rm` freed.
    _, got = run_gpu(stack, "next1")
    assert got == UUIDS[1]
    ok(shim(stack, "rm", "-f", gpus[UUIDS[2]]))
    _, got = run_gpu(stack, "next2")
    assert got == UUIDS[2]
    assert_invariants(stack)
    assert_all_free(stack)


def test_rm_auto_removal_frees_the_gpus(stack):
    for _ in range(2):  # the second needs every GPU the first one's --rm gave back
        out = shim(stack, "run", "--rm", "--gpus", "all", IMAGE, "printenv", VISIBLE)
        assert sorted(ok(out).split(",")) == UUIDS
    cid = ok(shim(stack, "run", "-d", "--rm", "--gpus", "4", IMAGE, "sleep", "1"))
    # Gone by itself, with no API call passing gpu-alloc ("removed": `docker wait` returns
    # at exit, a moment before the daemon's auto-removal).
    engine.engine_api(stack.engine_sock).wait(cid, timeout=30, condition="removed")
    _, got = run_gpu(stack, "after", "4")
    assert sorted(got.split(",")) == UUIDS
    assert_invariants(stack)
    assert_all_free(stack)


def test_an_image_committed_from_a_leased_container_gets_no_gpu(stack):
    src, gpu = run_gpu(stack, "source")
    ok(shim(stack, "commit", "source", COMMITTED))
    try:
        image_env = engine.engine_api(stack.engine_sock).inspect_image(COMMITTED)["Config"]["Env"]
        assert f"NVIDIA_VISIBLE_DEVICES={gpu}" in image_env  # the lease's UUID, baked in
        plain = ok(shim(stack, "run", "-d", "--name", "plain", COMMITTED, "sleep", "300"))
        assert visible_devices(stack, plain) == "void"
        info = engine.engine_api(stack.engine_sock).inspect_container(plain)
        assert not info["HostConfig"]["DeviceRequests"]
        snap = status(stack)
        assert plain not in {le["container"] for le in snap["leases"]}
        assert plain not in {c["container"] for c in snap["claims"]}
        assert snap["free"] == 3 and held(stack) == {gpu: src}
        # Asking for a GPU from the committed image gets a fresh one, not the source's.
        _, other = run_gpu(stack, "asks", "1")
        assert other in UUIDS and other != gpu
        assert_invariants(stack)
    finally:
        remove_all(stack)
        real(stack, "rmi", COMMITTED)
    assert_all_free(stack)


def test_containers_removed_while_the_shim_is_down_are_reclaimed_at_its_start(stack):
    a, _ = run_gpu(stack, "gone-a", "2")
    args = ("run", "-d", "--rm", "--gpus", "2", IMAGE, "sleep", "2")
    b = ok(shim(stack, *args))  # will remove itself: no API call at all
    stack.kill_shim()
    try:
        ok(real(stack, "rm", "-f", a))  # passes the plugin, not the shim
        engine.engine_api(stack.engine_sock).wait(b, timeout=30, condition="removed")
        ledger = status(stack, reconcile=False)
        assert b in {le["container"] for le in ledger["leases"]}  # nobody could know yet
    finally:
        stack.start_shim()
    # The new shim reconciled at start, before anyone asked for status or a GPU.
    assert status(stack, reconcile=False)["leases"] == []
    _, got = run_gpu(stack, "all-four", "4")
    assert sorted(got.split(",")) == UUIDS
    assert_invariants(stack)
    assert_all_free(stack)


def test_restart_always_containers_keep_their_lease_across_a_dockerd_restart(stack):
    a, gpu_a = run_gpu(stack, "always-a", "1", "--restart", "always")
    b, gpu_b = run_gpu(stack, "always-b", "1", "--restart", "always")
    c = ok(shim(stack, "create", "--name", "stopped", "--gpus", "1", IMAGE, "sleep", "300"))
    gpu_c = visible_devices(stack, c)
    before = held(stack)
    assert before == {gpu_a: a, gpu_b: b, gpu_c: c}
    stack.restart_dockerd()
    api = engine.engine_api(stack.engine_sock)
    deadline = time.monotonic() + 30
    while not all(api.inspect_container(x)["State"]["Running"] for x in (a, b)):
        assert time.monotonic() < deadline, "restart-always containers did not come back"
        time.sleep(0.3)
    # Restarted by the daemon itself (no API call, no plugin): same GPUs, same leases.
    assert visible_devices(stack, a) == gpu_a and visible_devices(stack, b) == gpu_b
    assert held(stack) == before
    assert ok(shim(stack, "exec", "always-a", "printenv", "NVIDIA_VISIBLE_DEVICES")) == gpu_a
    _, last = run_gpu(stack, "last", "1")
    assert last not in before and last in UUIDS
    refused = shim(stack, "run", "--rm", "--gpus", "1", IMAGE, "true")
    assert refused.returncode != 0 and "0 of 4 free" in refused.stderr
    assert_invariants(stack)
    assert_all_free(stack)
