"""The Engine grants at start: starts, restarts, removals and Compose hand-overs against
the real dockerd, on the real socket and through the shim.

What a container reaches is resolved by dockerd when it starts (device paths and
directories, bind sources), so a create that was harmless can become a GPU grant by
the time of its start.  References are resolved by dockerd too (full id, exact name,
unique id prefix): a lease ends only when the Engine proves its container gone.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import docker.errors
import pytest

from tests.support import engine
from tests.support.faults import IMAGE, status

SOCKS = ["engine_sock", "shim_sock"]


def api_on(stack: engine.Stack, sock: str):
    return engine.engine_api(getattr(stack, sock))


def gpu_node(directory: Path, minor: int = 1) -> None:
    """A simulated GPU's node (nvidia major 195, the GPU's minor), made after the create."""
    os.mknod(directory / f"nvidia{minor}", 0o600 | 0o020000, os.makedev(195, minor))


def refused(call, *args, match: str = "gpu-alloc refused") -> str:
    with pytest.raises(docker.errors.APIError) as e:
        call(*args)
    assert e.value.status_code == 403, e.value
    assert match in str(e.value), e.value
    return str(e.value)


@pytest.fixture
def dev_dir(tmp_path: Path):
    """An empty directory under the host's /dev (devtmpfs), where device paths must lie."""
    path = Path("/dev") / f"ga-test-{tmp_path.name}"[:40]
    path.mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def running(stack: engine.Stack, cid: str) -> bool:
    return engine.engine_api(stack.engine_sock).inspect_container(cid)["State"]["Running"]


@pytest.mark.parametrize("sock", SOCKS)
def test_a_device_directory_that_gets_a_gpu_node_after_create_is_refused_at_start(
    stack, dev_dir, sock
):
    api = api_on(stack, sock)
    devs = dev_dir
    hc = api.create_host_config(devices=[f"{devs}:/dev/x:rwm"], network_mode="none")
    cid = api.create_container(IMAGE, ["sleep", "300"], host_config=hc)["Id"]
    gpu_node(devs)
    why = refused(api.start, cid, match="without a gpu-alloc lease")
    assert "HostConfig.Devices[0]" in why
    assert not running(stack, cid)


@pytest.mark.parametrize("sock", SOCKS)
def test_a_device_path_outside_dev_is_refused_at_create(stack, tmp_path, sock):
    """Outside the kernel's /dev a container can swap the nodes after any check (mknod in a
    bind mount), and a restart policy re-reads the path without asking: refused outright."""
    api = api_on(stack, sock)
    devs = tmp_path / "devs"
    devs.mkdir()
    os.mknod(devs / "null", 0o600 | 0o020000, os.makedev(1, 3))  # harmless now
    for path in (devs, devs / "null"):
        hc = api.create_host_config(devices=[f"{path}:/dev/x:rwm"], network_mode="none")
        why = refused(lambda hc=hc: api.create_container(IMAGE, ["true"], host_config=hc))
        assert "is not on the host's devtmpfs (/dev)" in why
    assert api.containers(all=True) == []


@pytest.mark.parametrize("sock", SOCKS)
def test_a_bind_source_replaced_by_a_link_to_dev_after_create_is_refused_at_start(
    stack, tmp_path, sock
):
    api = api_on(stack, sock)
    src = tmp_path / "data"
    src.mkdir()
    hc = api.create_host_config(binds={str(src): {"bind": "/hostdev"}}, network_mode="none")
    cid = api.create_container(IMAGE, ["sleep", "300"], host_config=hc)["Id"]
    src.rmdir()
    src.symlink_to("/dev")
    refused(api.start, cid, match="exposes /dev")
    assert not running(stack, cid)


@pytest.mark.parametrize("sock", SOCKS)
def test_restart_is_judged_like_start(stack, dev_dir, sock):
    api = api_on(stack, sock)
    devs = dev_dir
    hc = api.create_host_config(devices=[f"{devs}:/dev/x:rwm"], network_mode="none")
    cid = api.create_container(IMAGE, ["sleep", "300"], host_config=hc)["Id"]
    os.mknod(devs / "null", 0o600 | 0o020000, os.makedev(1, 3))  # dockerd needs one node
    api.start(cid)  # no GPU node in the directory yet
    other = api.create_container(IMAGE, ["sleep", "300"], host_config=hc)["Id"]
    gpu_node(devs)
    refused(api.restart, cid, match="without a gpu-alloc lease")
    refused(api.restart, other)  # a restart of a created container starts it
    assert not running(stack, other)


def test_ordinary_start_restart_and_stop_still_work(stack):
    for sock, args in (("shim_sock", ["--gpus", "1"]), ("shim_sock", []), ("engine_sock", [])):
        name = f"plain{len(args)}{sock[0]}"
        ran = engine.docker_cli(getattr(stack, sock), "run", "-d", "--network", "none",
                                "--name", name, *args, IMAGE, "sleep", "300")  # fmt: skip
        assert ran.returncode == 0, ran.stderr + stack.logs()
        for verb in (["restart", "-t", "0"], ["stop", "-t", "0"], ["start"]):
            done = engine.docker_cli(getattr(stack, sock), *verb, name)
            assert done.returncode == 0, f"{verb}: {done.stderr}"
        assert running(stack, name)


# ------------------------------------------------------------ references (class 6)


def gpu_container(stack: engine.Stack, name: str, gpus: str = "1") -> str:
    ran = engine.docker_cli(stack.shim_sock, "run", "-d", "--network", "none", "--name", name,
                            "--gpus", gpus, IMAGE, "sleep", "300")  # fmt: skip
    assert ran.returncode == 0, ran.stderr + stack.logs()
    return ran.stdout.strip()


def leased_containers(stack: engine.Stack) -> set[str]:
    return {le["container"] for le in status(stack, reconcile=False)["leases"]}


@pytest.mark.parametrize("sock", SOCKS)
def test_removing_a_decoy_named_like_a_gpu_containers_id_prefix_keeps_its_lease(stack, sock):
    gpu = gpu_container(stack, "victim")
    for decoy in (gpu[:12], gpu[:16]):
        made = engine.docker_cli(stack.engine_sock, "create", "--name", decoy, IMAGE, "true")
        assert made.returncode == 0, made.stderr
        gone = engine.docker_cli(getattr(stack, sock), "rm", decoy)
        assert gone.returncode == 0, gone.stderr
        assert running(stack, gpu)  # dockerd removed the decoy, by its exact name
        assert gpu in leased_containers(stack), "the plugin ended the victim's lease"


@pytest.mark.parametrize("ref", ["name", "prefix", "id"])
def test_removing_a_gpu_container_by_any_reference_ends_its_lease_at_once(stack, ref):
    gpu = gpu_container(stack, "doomed")
    typed = {"name": "doomed", "prefix": gpu[:7], "id": gpu}[ref]
    gone = engine.docker_cli(stack.engine_sock, "rm", "-f", typed)
    assert gone.returncode == 0, gone.stderr
    assert gpu not in leased_containers(stack)


def test_removing_a_link_keeps_the_lease(stack):
    gpu = gpu_container(stack, "linked")
    api = engine.engine_api(stack.engine_sock)
    with pytest.raises(docker.errors.APIError):
        api.remove_container("linked", link=True)  # not a link: dockerd refuses, nothing goes
    assert gpu in leased_containers(stack)


# ------------------------------------------------------------- Compose (class 7)

COMPOSE = {"com.docker.compose.project": "p", "com.docker.compose.service": "s",
           "com.docker.compose.container-number": "1"}  # fmt: skip


def test_a_forged_compose_replacement_never_runs_beside_its_victim(stack):
    api = engine.engine_api(stack.shim_sock)
    all_gpus = api.create_host_config(
        device_requests=[{"Count": -1, "Capabilities": [["gpu"]]}], network_mode="none"
    )
    victim = api.create_container(IMAGE, ["sleep", "300"], name="p-s-1", labels=COMPOSE,
                                  host_config=all_gpus)["Id"]  # fmt: skip
    api.start(victim)
    forged = api.create_container(
        IMAGE, ["sleep", "300"], name=f"{victim[:12]}_p-s-1", host_config=all_gpus,
        labels={**COMPOSE, "com.docker.compose.replace": victim},
    )["Id"]  # fmt: skip
    real = engine.engine_api(stack.engine_sock)
    for attempt in (api.start, api.restart, real.start, real.restart):
        refused(attempt, forged, match="still runs on its GPUs")
    api.stop(victim, timeout=0)
    for attempt in (api.start, api.restart, real.restart):
        refused(attempt, forged, match="remove that one first")
    assert not running(stack, forged)
    refused(api.restart, victim, match="handed to the container replacing it")
    api.remove_container(forged)  # the victim gets its GPUs back
    api.start(victim)
    assert running(stack, victim)
    assert leased_containers(stack) == {victim}
