"""Four ways around a lease, tried against a real dockerd 20.10 as a user would.

Each class of issue 10 that access decides (Count 0 requests the toolkit still
serves, numbers read as dockerd reads them, local volumes, the Engine's own
paths), and the ordinary requests that must work, on both sockets: the shim's
(``shim_sock``) and dockerd's own (``engine_sock``, still behind the plugin).
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import require_engine
from tests.engine.test_enforcement_engine import containers, raw
from tests.support import engine
from tests.support.engine import gpu_alloc

IMAGE = engine.BUSYBOX_TAG
CUDA_IMAGE = "gpu-alloc-test/cuda-like:1"  # CUDA_VERSION without NVIDIA_REQUIRE_CUDA: all GPUs


def make_stack() -> engine.Stack:
    return engine.Stack(gpus=2)


def sockets(stack: engine.Stack) -> dict[str, str]:
    return {"shim": stack.shim_sock, "engine": stack.engine_sock}


def cli(sock: str, *args: str):
    return engine.docker_cli(sock, *args)


def make_cuda_image(sock: str) -> None:
    """An image whose ENV makes the legacy toolkit rule give every GPU."""
    made = cli(sock, "create", IMAGE, "true")
    assert made.returncode == 0, made.stderr
    cid = made.stdout.strip()
    done = cli(sock, "commit", "--change", "ENV CUDA_VERSION=12.2", cid, CUDA_IMAGE)
    assert done.returncode == 0, done.stderr
    cli(sock, "rm", cid)


@pytest.fixture(scope="module")
def cuda_image(stack: engine.Stack) -> str:
    make_cuda_image(stack.engine_sock)
    return CUDA_IMAGE


def free_gpus(stack: engine.Stack) -> int:
    snap = json.loads(gpu_alloc(stack, "status", "--json").stdout)
    return sum(1 for g in snap["gpus"] if g["free"])


# ------------------------------------------------- class 2: Count 0 device requests


@pytest.mark.parametrize(
    "args",
    [
        ("--gpus", "0"),
        ("--gpus", "0", "-e", "NVIDIA_VISIBLE_DEVICES=all"),
        ("--gpus", "0", "-e", "NVIDIA_VISIBLE_DEVICES=1"),
        ("--gpus", "count=0,capabilities=utility"),
    ],
    ids=["image ENV", "env all", "env one GPU", "count=0 with caps"],
)
def test_gpus_0_on_the_real_socket_is_refused(stack, cuda_image, args):
    before = containers(stack)
    out = cli(stack.engine_sock, "create", *args, cuda_image, "true")
    assert out.returncode != 0
    assert "Count 0" in out.stderr and "NVIDIA_VISIBLE_DEVICES" in out.stderr
    assert containers(stack) == before


@pytest.mark.parametrize("count", ["0", "-0", "0.0e0"])
def test_a_raw_count_0_nvidia_request_is_refused_however_zero_is_written(stack, count, cuda_image):
    body = (
        f'{{"Image":"{cuda_image}","HostConfig":{{"DeviceRequests":'
        f'[{{"Driver":"nvidia","Count":{count}}}]}}}}'
    )
    status, answer = raw(stack.engine_sock, "POST", "/v1.41/containers/create", body.encode())
    assert status in (400, 403), answer
    assert containers(stack) == []


def test_gpus_0_pinned_to_void_runs_on_the_real_socket(stack, cuda_image):
    out = cli(stack.engine_sock, "run", "--rm", "--gpus", "0", "-e",
              "NVIDIA_VISIBLE_DEVICES=void", cuda_image, "true")  # fmt: skip
    assert out.returncode == 0, out.stderr


def test_gpus_0_through_the_shim_runs_with_the_void_guard(stack, cuda_image):
    out = cli(stack.shim_sock, "create", "--gpus", "0", cuda_image, "true")
    assert out.returncode == 0, out.stderr
    env = engine.engine_api(stack.engine_sock).inspect_container(out.stdout.strip())["Config"]
    assert [e for e in env["Env"] if e.startswith("NVIDIA_")] == ["NVIDIA_VISIBLE_DEVICES=void"]
    assert free_gpus(stack) == 2


def test_gpus_device_all_is_leased_like_gpus_all(stack):
    out = cli(stack.shim_sock, "create", "--gpus", "device=all", IMAGE, "true")
    assert out.returncode == 0, out.stderr
    info = engine.engine_api(stack.engine_sock).inspect_container(out.stdout.strip())
    (req,) = info["HostConfig"]["DeviceRequests"]
    assert sorted(req["DeviceIDs"]) == sorted(engine.sim_gpu_uuid(i) for i in range(2))
    assert free_gpus(stack) == 0
    refused = cli(stack.engine_sock, "create", "--gpus", "device=all", IMAGE, "true")
    assert refused.returncode != 0 and "DeviceRequests" in refused.stderr


# ------------------------------------------------ class 3: numbers dockerd parses


@pytest.mark.parametrize("rule", ["c 0195:* rwm", "c 000195:0 rw", "c 0226:* rwm", "a *:* r"])
def test_gpu_cgroup_rules_are_refused_however_the_major_is_written(stack, rule):
    for name, sock in sockets(stack).items():
        out = cli(sock, "create", "--device-cgroup-rule", rule, IMAGE, "true")
        assert out.returncode != 0, name
        assert "DeviceCgroupRules" in out.stderr, (name, out.stderr)
    assert containers(stack) == []


def test_an_ordinary_cgroup_rule_with_a_leading_zero_runs(stack):
    for sock in sockets(stack).values():
        out = cli(sock, "run", "--rm", "--device-cgroup-rule", "c 01:03 rwm", IMAGE, "true")
        assert out.returncode == 0, out.stderr


# ------------------------------------------------------------ class 4: local volumes


@pytest.mark.parametrize(
    "opts",
    [
        ("type=proc", "device=proc"),
        ("type=sysfs", "device=sysfs"),
        ("type=devtmpfs", "device=devtmpfs"),
        ("type=none", "o=bind", "device=dev"),
        ("type=none", "o=rbind", "device=/dev"),
        ("type=overlay", "device=overlay", "o=lowerdir=/dev"),
    ],
    ids=["proc", "sysfs", "devtmpfs", "relative bind", "rbind /dev", "overlay"],
)
def test_volume_creates_that_mount_host_kernel_trees_are_refused(stack, opts):
    for name, sock in sockets(stack).items():
        out = cli(sock, "volume", "create", *(f"--opt={o}" for o in opts), f"bad-{name}")
        assert out.returncode != 0, (name, out.stdout)
        assert "volume create" in out.stderr, out.stderr
    assert "bad-" not in cli(stack.engine_sock, "volume", "ls", "-q").stdout


@pytest.mark.parametrize(
    "opts",
    [
        "volume-opt=type=proc,volume-opt=device=proc",
        "volume-opt=type=none,volume-opt=o=rbind,volume-opt=device=/dev",
        "volume-opt=type=devtmpfs,volume-opt=device=x",
        "volume-opt=type=none,volume-opt=o=bind,volume-opt=device=../../../dev",
    ],
    ids=["proc", "rbind /dev", "devtmpfs", "relative"],
)
def test_inline_volume_options_that_mount_host_kernel_trees_are_refused(stack, opts):
    for name, sock in sockets(stack).items():
        out = cli(sock, "create", "--mount", f"type=volume,dst=/d,{opts}", IMAGE, "true")
        assert out.returncode != 0, name
        assert "Mounts[0]" in out.stderr, (name, out.stderr)
    assert containers(stack) == []


def test_safe_local_volumes_are_made_and_used(stack):
    api = engine.engine_api(stack.engine_sock)
    try:
        for name, sock in sockets(stack).items():
            vol = f"mem-{name}"
            made = cli(sock, "volume", "create", "--opt", "type=tmpfs", "--opt", "device=tmpfs",
                       "--opt", "o=size=1m", vol)  # fmt: skip
            assert made.returncode == 0, made.stderr
            used = cli(sock, "run", "--rm", "-v", f"{vol}:/d", IMAGE, "true")
            assert used.returncode == 0, used.stderr
            inline = cli(sock, "run", "--rm", "--mount",
                         "type=volume,dst=/d,volume-opt=type=tmpfs,volume-opt=device=tmpfs",
                         IMAGE, "true")  # fmt: skip
            assert inline.returncode == 0, inline.stderr
            api.remove_volume(vol)
    finally:
        api.close()


# --------------------------------------------------- class 5: the Engine's own paths


def test_binds_of_the_engines_own_paths_are_refused(stack):
    info = engine.engine_api(stack.engine_sock).info()
    root = info["DockerRootDir"]
    assert root.startswith(str(stack.dir))  # a private Engine: not /var/lib/docker
    paths = [root, f"{root}/containers", str(stack.engine_dir / "exec"),
             str(stack.engine_dir), str(stack.state_dir)]  # fmt: skip
    for name, sock in sockets(stack).items():
        for path in paths:
            out = cli(sock, "create", "-v", f"{path}:/x:ro", IMAGE, "true")
            assert out.returncode != 0, (name, path)
            assert "exposes" in out.stderr, (name, path, out.stderr)
    assert containers(stack) == []


# ------------------------------------------------------- ordinary: not refused


@pytest.mark.parametrize(
    "args",
    [
        ("-v", "/dev/shm:/dev/shm"),
        ("-v", "/sys/fs/cgroup:/sys/fs/cgroup:ro"),
        ("--mount", "type=bind,src=/dev/shm,dst=/shm"),
        ("--mount", "type=bind,src=/sys/fs/cgroup,dst=/cg,readonly"),
    ],
    ids=["-v /dev/shm", "-v cgroup ro", "--mount /dev/shm", "--mount cgroup readonly"],
)
def test_binds_that_touch_no_gpu_run(stack, args):
    for sock in sockets(stack).values():
        out = cli(sock, "run", "--rm", *args, IMAGE, "true")
        assert out.returncode == 0, out.stderr


def test_writable_cgroup_files_and_dev_itself_stay_refused(stack):
    for sock in sockets(stack).values():
        for bind in ("/sys/fs/cgroup:/sys/fs/cgroup", "/dev/shm/..:/d", "/sys/fs:/fs:ro"):
            out = cli(sock, "create", "-v", bind, IMAGE, "true")
            assert out.returncode != 0 and "exposes" in out.stderr, (bind, out.stderr)


# ------------------------------------- made before gpu-alloc: holders and volumes


def test_old_count_0_containers_hold_gpus_and_old_unsafe_volumes_are_judged_by_name():
    """A --gpus 0 container on a CUDA image holds every GPU; a volume made with unsafe
    options is refused wherever it is used by name."""
    require_engine()
    s = engine.Stack(gpus=2)
    pre = engine.Dockerd(s.engine_dir).start()
    try:
        engine.import_busybox(pre.sock)
        make_cuda_image(pre.sock)
        for args in (
            ("--name", "zero", "--gpus", "0", CUDA_IMAGE),
            ("--name", "voided", "--gpus", "0", "-e", "NVIDIA_VISIBLE_DEVICES=void", CUDA_IMAGE),
        ):
            made = cli(pre.sock, "create", *args, "true")
            assert made.returncode == 0, made.stderr
        made = cli(pre.sock, "volume", "create", "--opt", "type=none", "--opt", "o=rbind",
                   "--opt", "device=/dev", "devvol")  # fmt: skip
        assert made.returncode == 0, made.stderr
    finally:
        pre.stop(remove=False)
    s.start()
    try:
        snap = json.loads(gpu_alloc(s, "status", "--json").stdout)
        holders = {g["holder"]["name"] for g in snap["gpus"] if not g["free"]}
        assert holders == {"zero"}, snap
        refused = cli(s.shim_sock, "run", "--rm", "--gpus", "1", IMAGE, "true")
        assert refused.returncode != 0 and "zero" in refused.stderr
        for sock in (s.shim_sock, s.engine_sock):
            for use in (("-v", "devvol:/d"), ("--mount", "src=devvol,dst=/d")):
                out = cli(sock, "create", *use, IMAGE, "true")
                assert out.returncode != 0, use
                assert "volume devvol" in out.stderr and "/dev" in out.stderr, out.stderr
    finally:
        s.stop()
