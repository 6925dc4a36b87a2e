"""Faults: whatever crashes, nothing is leaked and nothing is granted twice.

The shim killed with SIGKILL while creates are in flight, plugin workers killed
(gunicorn restarts them), dockerd restarted mid-run, a lost create answer, a
corrupt or too-new state file, a full state filesystem, a pending lease whose
create never reached dockerd.  Each scenario ends with the invariants of
tests/support/faults.py and, once everything is removed, every GPU free.
"""

from __future__ import annotations

import concurrent.futures
import json
import random
import subprocess
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from allocator.core.judging.ask import Ask
from allocator.host import config as configmod
from allocator.host.ledger import Ledger
from allocator.service.placer import LeaseRequest
from allocator.service.wiring import Allocator
from tests.conftest import require_engine
from tests.support import engine
from tests.support.engine import gpu_alloc
from tests.support.faults import (
    IMAGE,
    FaultStack,
    assert_all_free,
    assert_invariants,
    real,
    remove_all,
    shim,
    status,
    visible_devices,
)

GPUS = 8
PENDING_TTL = 12.0  # short enough to wait for in a test, longer than a create under load
UUIDS = [engine.sim_gpu_uuid(k) for k in range(GPUS)]
VISIBLE = "NVIDIA_VISIBLE_DEVICES"
FILES = ("state.json", "lock")  # what the state dir holds at rest


def make_stack() -> engine.Stack:
    return FaultStack(gpus=GPUS, pending_ttl=PENDING_TTL, plugin_proxy=True)


@pytest.fixture(autouse=True)
def _heal(stack: FaultStack) -> Iterator[None]:
    """Undo a test's faults before the containers are removed."""
    yield
    if stack.proxy is not None:
        stack.proxy.fail_create_responses = False
    if stack.shim is None:
        stack.start_shim()


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def creates_under_fire(
    stack: FaultStack, fault: Callable[[], None], *, clients: int = 8
) -> list[subprocess.CompletedProcess]:
    """`clients` threads run GPU containers through the shim (removing about half of
    those they got) until `fault`, run alongside, is over; every create's result."""
    done = threading.Event()
    rng = random.Random()

    def client(k: int) -> list[subprocess.CompletedProcess]:
        results = []
        while not done.is_set():
            name = f"c{k}n{len(results)}"
            out = shim(stack, "run", "-d", "--name", name, "--gpus", "1", IMAGE, "sleep", "300")
            results.append(out)
            if out.returncode == 0 and rng.random() < 0.5:
                shim(stack, "rm", "-f", name)
        return results

    def chaos() -> None:
        try:
            fault()
        finally:
            done.set()

    with concurrent.futures.ThreadPoolExecutor(clients + 1) as pool:
        futures = [pool.submit(client, k) for k in range(clients)]
        pool.submit(chaos).result()
        return [r for f in futures for r in f.result()]


def recovered(stack: FaultStack) -> None:
    """With every process back, the invariants hold, and once everything is removed (and
    cut-off creates' pending leases have expired), one create gets every GPU."""
    assert_invariants(stack)
    remove_all(stack)
    assert_all_free(stack, wait=PENDING_TTL + 5)
    out = ok(shim(stack, "run", "--rm", "--gpus", str(GPUS), IMAGE, "printenv", VISIBLE))
    assert sorted(out.split(",")) == UUIDS


def granted(stack: FaultStack) -> list[str]:
    """The GPUs of every running-or-stopped container (duplicates kept)."""
    api = engine.engine_api(stack.engine_sock)
    return [
        u
        for c in api.containers(all=True)
        for u in (visible_devices(stack, c["Id"]) or "").split(",")
        if u not in ("", "void")
    ]


# ----------------------------------------------------------------- process faults


def wait_for_a_run(stack: FaultStack) -> None:
    """Until some container is running: on a loaded machine the first `docker run` may
    take longer than a fault's first second, and a fault before any create got through
    would show nothing."""
    api = engine.engine_api(stack.engine_sock)
    deadline = time.monotonic() + 60
    while not api.containers() and time.monotonic() < deadline:
        time.sleep(0.1)


def test_shim_killed_while_creates_are_in_flight(stack):
    rng = random.Random()

    def fault() -> None:
        wait_for_a_run(stack)  # some creates get through, some are cut
        for _ in range(3):
            time.sleep(rng.uniform(1.0, 2.0))
            stack.kill_shim()
            time.sleep(rng.uniform(0.0, 0.5))
            stack.start_shim()

    results = creates_under_fire(stack, fault)
    assert any(r.returncode == 0 for r in results)
    assert len(set(granted(stack))) == len(granted(stack))
    # Leases of creates the kill cut off before dockerd are held to their deadline, no more.
    recovered(stack)


def test_plugin_workers_killed_during_creates(stack):
    rng = random.Random()
    assert len(stack.plugin_workers()) == 2
    victims = []

    def fault() -> None:
        wait_for_a_run(stack)
        for _ in range(3):
            time.sleep(rng.uniform(0.1, 1.0))
            victims.append(stack.kill_plugin_worker(rng.choice(stack.plugin_workers())))
            stack.wait_plugin_workers()

    results = creates_under_fire(stack, fault)
    assert any(r.returncode == 0 for r in results)
    workers = stack.plugin_workers()
    assert len(workers) == 2 and not set(victims) & set(workers)  # replaced by the arbiter
    recovered(stack)


def test_dockerd_restarted_mid_run(stack):
    def fault() -> None:
        wait_for_a_run(stack)
        time.sleep(1.0)
        stack.restart_dockerd()

    results = creates_under_fire(stack, fault)
    assert any(r.returncode == 0 for r in results)
    recovered(stack)


def test_dockerd_restarted_with_nvidia_as_its_default_is_judged_so_at_once(stack):
    """No plugin worker waits out the view it read of the old dockerd: the new one made
    its socket again, and Plugin.Activate reached one worker only."""
    for _ in range(4):  # every worker has the old view at hand
        ok(real(stack, "create", "-e", f"{VISIBLE}=all", IMAGE, "true"))
    plain = stack.dockerd_args
    nvidia = ["--default-runtime", "nvidia"]  # the harness lists the runtime already
    stack.dockerd_args = [*plain, *nvidia]
    try:
        stack.restart_dockerd()
        for _ in range(4):
            out = real(stack, "create", "-e", f"{VISIBLE}=all", IMAGE, "true")
            assert out.returncode != 0, "an image's own env got every GPU"
            assert "the Engine's default" in out.stderr, out.stderr
    finally:
        stack.dockerd_args = plain
        stack.restart_dockerd()
    remove_all(stack)


def test_a_create_answered_with_an_error_after_dockerd_made_it_keeps_its_lease(stack):
    stack.proxy.fail_create_responses = True  # as if the plugin died before AuthZRes
    lost = shim(stack, "run", "-d", "--name", "lost", "--gpus", "all", IMAGE, "sleep", "300")
    stack.proxy.fail_create_responses = False
    assert lost.returncode != 0
    (made,) = engine.engine_api(stack.engine_sock).containers(all=True)  # it exists
    assert sorted(visible_devices(stack, made["Id"]).split(",")) == UUIDS
    # No status or reconcile in between: the next create must not get any of its GPUs.
    second = shim(stack, "run", "-d", "--name", "second", "--gpus", "1", IMAGE, "sleep", "300")
    assert second.returncode != 0, "a GPU of 'lost' was granted again"
    assert_invariants(stack)


def test_a_join_raced_onto_a_gpu_container_after_its_check_is_refused_at_its_start(stack):
    """Another client renames a GPU container onto the name a create joins, after the
    plugin judged the create on the plain container of that name and before dockerd looks
    it up: dockerd joins the GPU container and stores its full id, so the start, judged on
    that id, is refused on either socket."""
    victim = ok(shim(stack, "run", "-d", "--name", "victim", "--gpus", "1", IMAGE, "sleep", "300"))
    ok(real(stack, "run", "-d", "--name", "plain", IMAGE, "sleep", "300"))
    api = engine.engine_api(stack.engine_sock)

    def rename_onto_plain(req: dict) -> None:
        if req.get("RequestUri", "").endswith("/containers/create"):
            stack.proxy.between = None
            api.rename("plain", "plain-was")
            api.rename(victim, "plain")

    stack.proxy.between = rename_onto_plain
    try:
        joiner = ok(real(stack, "create", "--pid", "container:plain", IMAGE, "sleep", "300"))
    finally:
        stack.proxy.between = None
    assert api.inspect_container(joiner)["HostConfig"]["PidMode"] == f"container:{victim}"
    for via in (real, shim):
        started = via(stack, "start", joiner)
        assert started.returncode != 0, started.stdout
        assert "reaches GPUs without a gpu-alloc lease" in started.stderr, started.stderr
        assert f"joins the PID namespace of container {victim}" in started.stderr
    api.close()
    remove_all(stack)


# ----------------------------------------------------------------- state faults


@pytest.fixture
def keeper(stack: FaultStack) -> Iterator[tuple[str, str]]:
    """A GPU container made before the fault; (id, its UUID)."""
    cid = ok(shim(stack, "run", "-d", "--name", "keeper", "--gpus", "1", IMAGE, "sleep", "300"))
    state = stack.state_dir / "state.json"
    with Ledger(stack.state_dir).transaction():
        pass  # fold the bind journal in: the bytes saved below are then the whole state
    saved = state.read_bytes()
    yield cid, visible_devices(stack, cid) or ""
    state.write_bytes(saved)  # whatever the test did to it
    for aside in stack.state_dir.glob("state.corrupt-*"):
        aside.unlink()


def no_gpu_containers_still_work(stack: FaultStack) -> None:
    """create + start + wait of a container without GPUs, through both sockets.

    No --rm: a start refused by gpu-alloc leaves an auto-remove container that the CLI
    would wait for forever."""
    for via in (shim, real):
        name = f"plain-{via.__name__}"
        out = via(stack, "run", "--name", name, IMAGE, "echo", "fine", timeout=60)
        real(stack, "rm", "-f", name)
        assert out.returncode == 0 and out.stdout.strip() == "fine", f"{via.__name__}: {out}"


@pytest.mark.parametrize("content", [b"{{ not json", b'{"version": 99}'], ids=["corrupt", "newer"])
def test_containers_without_gpus_work_while_the_state_file_is_unreadable(stack, keeper, content):
    (stack.state_dir / "state.json").write_bytes(content)
    no_gpu_containers_still_work(stack)


@pytest.mark.parametrize(
    "garbage",
    [
        pytest.param(b'{"version": 1, "leases": {{{ truncated', id="text"),
        pytest.param(b"\x00\x17garbage{{" + bytes(range(256)), id="binary"),
    ],
)
def test_corrupt_state_file_stops_gpu_creates_until_repair_reset(stack, keeper, garbage):
    cid, gpu = keeper
    state = stack.state_dir / "state.json"
    state.write_bytes(garbage)
    refused = shim(stack, "run", "--rm", "--gpus", "1", IMAGE, "true")
    assert refused.returncode != 0
    assert str(state) in refused.stderr and "gpu-alloc repair" in refused.stderr
    plain = gpu_alloc(stack, "repair")
    assert plain.returncode != 0 and "--reset" in plain.stderr
    reset = gpu_alloc(stack, "repair", "--reset")
    assert reset.returncode == 0, reset.stderr
    assert "adopted 1 container" in reset.stdout
    assert list(stack.state_dir.glob("state.corrupt-*")), "the corrupt file was not kept"
    snap = status(stack)
    assert [c["container"] for c in snap["claims"]] == [cid]  # adopted back
    assert [g["uuid"] for g in snap["gpus"] if not g["free"]] == [gpu]
    other = ok(
        shim(stack, "run", "--rm", "--gpus", "7", IMAGE, "printenv", "NVIDIA_VISIBLE_DEVICES")
    )
    assert gpu not in other.split(",") and len(set(other.split(","))) == 7
    assert_invariants(stack)
    assert_all_free(stack)


def test_state_file_from_a_newer_version_is_refused_clearly(stack, keeper):
    state = stack.state_dir / "state.json"
    saved = state.read_bytes()
    state.write_text(json.dumps({"version": 99, "leases": {}, "claims": {}}))
    try:
        refused = shim(stack, "run", "--rm", "--gpus", "1", IMAGE, "true")
        assert refused.returncode != 0
        assert str(state) in refused.stderr and "newer gpu-alloc" in refused.stderr
        shown = gpu_alloc(stack, "status")
        assert shown.returncode != 0 and "newer gpu-alloc" in shown.stderr
        assert json.loads(state.read_text())["version"] == 99  # nobody overwrote it
    finally:
        state.write_bytes(saved)
    assert_invariants(stack)
    assert_all_free(stack)


@pytest.fixture
def full_state_fs(stack: FaultStack) -> Iterator[bytes]:
    """A 16 KiB tmpfs over the state dir holding the current files, then filled up."""
    saved = {p.name: p.read_bytes() for p in stack.state_dir.iterdir() if p.name in FILES}
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16k,mode=0700", "tmpfs", str(stack.state_dir)],
        check=True,
    )
    try:
        for name, data in saved.items():
            (stack.state_dir / name).write_bytes(data)
        with open(stack.state_dir / "filler", "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 512)
            except OSError:
                pass  # full
        yield saved["state.json"]
    finally:
        subprocess.run(["umount", str(stack.state_dir)], check=True)


def test_full_state_filesystem_refuses_gpu_creates_and_keeps_the_state(
    stack, keeper, full_state_fs
):
    state = stack.state_dir / "state.json"
    refused = shim(stack, "run", "--rm", "--gpus", "1", IMAGE, "true")
    assert refused.returncode != 0
    assert str(state) in refused.stderr and "cannot write the state" in refused.stderr
    assert state.read_bytes() == full_state_fs  # the previous state, intact
    left = {p.name for p in stack.state_dir.iterdir()}
    assert set(FILES) <= left
    # no half-written file left behind; the minute sampler may have made its directory
    assert left - {*FILES, "filler", "samples"} == set()
    no_gpu_containers_still_work(stack)


def test_read_only_state_dir_refuses_gpu_creates_with_a_message(stack, keeper):
    state = stack.state_dir / "state.json"
    saved = state.read_bytes()
    d = str(stack.state_dir)
    subprocess.run(["mount", "--bind", d, d], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", d], check=True)
        refused = shim(stack, "run", "--rm", "--gpus", "1", IMAGE, "true")
        assert refused.returncode != 0
        assert d in refused.stderr and "Read-only file system" in refused.stderr, refused.stderr
        assert state.read_bytes() == saved
        no_gpu_containers_still_work(stack)
    finally:
        subprocess.run(["umount", d], check=True)
    assert_invariants(stack)


# ----------------------------------------------------------------- pending leases


@pytest.fixture
def short_ttl_stack() -> Iterator[FaultStack]:
    require_engine()
    # A deadline the checks before it can meet on a loaded machine (a CLI call can take 5 s,
    # and two of them come before the deadline).
    s = FaultStack(gpus=2, pending_ttl=20.0, create_timeout=2.0).start()
    try:
        yield s
    finally:
        s.stop()


def test_a_pending_lease_whose_create_never_came_is_freed_after_its_deadline(short_ttl_stack):
    stack = short_ttl_stack
    alloc = Allocator(configmod.load(str(stack.config_path)))  # no Engine: no reconcile
    leased = alloc.book.lease(
        LeaseRequest(Ask(required=(), count=2, every=False, caps=("gpu",)), "ghost")
    )
    lease, _token = leased  # type: ignore[misc]
    # Until the deadline, nobody gets its GPUs, reconcile or not.
    snap = status(stack)
    assert [le["id"] for le in snap["leases"]] == [lease.id] and snap["free"] == 0
    early = shim(stack, "run", "--rm", "--gpus", "1", IMAGE, "true")
    assert early.returncode != 0 and "a create in flight" in early.stderr
    assert time.time() < lease.deadline, "the checks above were too slow for the TTL"
    time.sleep(max(0.0, lease.deadline - time.time()) + 0.5)
    got = ok(shim(stack, "run", "--rm", "--gpus", "2", IMAGE, "printenv", "NVIDIA_VISIBLE_DEVICES"))
    assert sorted(got.split(",")) == [engine.sim_gpu_uuid(0), engine.sim_gpu_uuid(1)]
    assert_invariants(stack)
    assert_all_free(stack)
