"""Compose through the shim: up, scale, down, recreate.

The Compose of the Engine under test (tests/support/clients.py): Debian's docker-compose
1.29 (v1) on the host's dockerd 20.10, the root's Compose v2 (`docker compose`
2.26 / 2.40) on dockerd 26 / 28.

Services use ``network_mode: none``: Compose then creates no network (the test
engines have no bridge), and GPU leasing does not care about networking.

Recreate is the hard case.  For a changed service Compose 1.29 does, per
container and in parallel across replicas (dockerd --debug log):

    GET  /containers/<old>/json
    POST /containers/<old>/stop?t=<stop_grace_period>
    POST /containers/<old>/rename?name=<old short id>_<name>
    GET  /images/<image>/json
    POST /containers/create?name=<name>          (same labels, same device reservation)
    POST /containers/<new>/start
    DELETE /containers/<old>?v=False&link=False&force=False

so the old container, stopped and renamed, still holds its GPUs while the new one
is created.  With room to spare the replacement simply gets other GPUs; on a full
host gpu-alloc hands the stopped predecessor's GPUs over to its replacement (and
refuses to start the predecessor meanwhile).  If Compose stops half-way (the new
container fails to start) both stay, the predecessor stopped and unstartable.

Compose v2 (2.26 and 2.40 alike) recreates in the other order:

    POST /containers/create?name=<old short id>_<name>   (label com.docker.compose.replace=<old id>)
    POST /containers/<old>/stop
    DELETE /containers/<old>
    POST /containers/<new>/rename?name=<name>
    POST /containers/<new>/start

so on a full host the replacement is created while its predecessor still runs; it
gets the predecessor's GPUs, and may start only once the predecessor is gone.  A
failed start leaves only the replacement (the predecessor is already removed).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.support import engine
from tests.support.faults import (
    IMAGE,
    FaultStack,
    assert_all_free,
    assert_invariants,
    status,
    visible_devices,
)

UUIDS = [engine.sim_gpu_uuid(k) for k in range(4)]
PROJECT = "gacompose"
V2 = engine.compose_v2()
# What each Compose prints when it recreates a container, and when a start fails.
RECREATED = "Recreated" if V2 else "Recreating"
START_FAILED = (
    "hook #0" if V2 else "Cannot start service"
)  # runc 1.1: "error running hook #0", 1.3: "prestart hook #0"


def make_stack() -> engine.Stack:
    return FaultStack(gpus=4)


def write_project(
    directory: Path, *, gpus: int = 1, command: str = "300", restart: str = "no"
) -> None:
    (directory / "docker-compose.yml").write_text(f"""
version: "3.8"
services:
  worker:
    image: {IMAGE}
    command: ["sleep", "{command}"]
    network_mode: none
    restart: "{restart}"
    stop_grace_period: 1s
    deploy:
      resources:
        reservations:
          devices:
            - driver: nvidia
              count: {gpus}
              capabilities: [gpu]
""")


def audit_events(stack: FaultStack, kind: str) -> list[dict]:
    lines = (stack.state_dir / "audit.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def compose(stack: FaultStack, directory: Path, *args: str):
    return engine.docker_compose(stack.shim_sock, directory, *args, project_name=PROJECT)


def worker(number: int) -> str:
    return engine.compose_name(PROJECT, "worker", number)


def project_containers(stack: FaultStack) -> list[dict]:
    api = engine.engine_api(stack.engine_sock)
    return api.containers(all=True, filters={"label": f"com.docker.compose.project={PROJECT}"})


def service_gpus(stack: FaultStack) -> dict[str, str]:
    """Compose container name -> NVIDIA_VISIBLE_DEVICES, for the project's containers."""
    api = engine.engine_api(stack.engine_sock)
    found = api.containers(all=True, filters={"label": f"com.docker.compose.project={PROJECT}"})
    return {c["Names"][0].lstrip("/"): visible_devices(stack, c["Id"]) or "" for c in found}


def test_up_with_a_gpu_reservation_leases_it(stack, tmp_path):
    write_project(tmp_path, gpus=2)
    up = compose(stack, tmp_path, "up", "-d")
    assert up.returncode == 0, up.stderr + stack.logs()
    assert "Creating network" not in up.stderr
    (name, gpus), *rest = service_gpus(stack).items()
    assert not rest and name == worker(1)
    assert len(set(gpus.split(","))) == 2 and set(gpus.split(",")) <= set(UUIDS)
    snap = assert_invariants(stack)
    assert snap["free"] == 2
    assert [le["name"] for le in snap["leases"]] == [name]


def test_scale_3_gets_3_distinct_gpus_and_down_frees_them(stack, tmp_path):
    write_project(tmp_path)
    up = compose(stack, tmp_path, "up", "-d", "--scale", "worker=3")
    assert up.returncode == 0, up.stderr + stack.logs()
    gpus = service_gpus(stack)
    assert len(gpus) == 3
    assert len(set(gpus.values())) == 3 and set(gpus.values()) <= set(UUIDS)
    assert assert_invariants(stack)["free"] == 1
    down = compose(stack, tmp_path, "down")
    assert down.returncode == 0, down.stderr
    snap = status(stack)
    assert snap["free"] == 4 and snap["leases"] == [], json.dumps(snap, indent=1)


def test_recreate_with_room_to_spare_moves_to_other_gpus(stack, tmp_path):
    write_project(tmp_path)
    up = compose(stack, tmp_path, "up", "-d", "--scale", "worker=2")
    assert up.returncode == 0, up.stderr
    before = service_gpus(stack)
    write_project(tmp_path, command="301")  # a config change: Compose recreates
    again = compose(stack, tmp_path, "up", "-d", "--scale", "worker=2")
    assert again.returncode == 0, again.stderr + stack.logs()
    assert RECREATED in again.stderr
    after = service_gpus(stack)
    assert sorted(after) == sorted(before)  # same names, old containers gone
    assert len(set(after.values())) == 2
    assert_invariants(stack)
    assert compose(stack, tmp_path, "down").returncode == 0
    assert_all_free(stack)


@pytest.mark.parametrize("layout", ["4x1", "1x4"])
def test_recreate_on_a_full_host_hands_the_gpus_over(stack, tmp_path, layout):
    """The replacement gets its GPUs without the host needing to be emptier."""
    replicas, per = (4, 1) if layout == "4x1" else (1, 4)
    write_project(tmp_path, gpus=per)
    scale = ("--scale", f"worker={replicas}")
    up = compose(stack, tmp_path, "up", "-d", *scale)
    assert up.returncode == 0, up.stderr
    assert status(stack)["free"] == 0
    write_project(tmp_path, gpus=per, command="301")
    handed = len(audit_events(stack, "hand-over"))
    again = compose(stack, tmp_path, "up", "-d", *scale)
    assert again.returncode == 0, again.stderr + stack.logs()
    assert RECREATED in again.stderr
    assert len(audit_events(stack, "hand-over")) == handed + replicas  # one line each
    after = service_gpus(stack)
    assert len(after) == replicas  # the old containers are gone
    if V2:  # each replacement was made while its predecessor ran (the GPU hand-over)
        replaced = [
            c["Labels"].get("com.docker.compose.replace") for c in project_containers(stack)
        ]
        assert all(replaced) and len(set(replaced)) == replicas, replaced
    granted = [u for gpus in after.values() for u in gpus.split(",")]
    assert sorted(granted) == UUIDS
    snap = assert_invariants(stack)
    assert snap["free"] == 0 and all(le["state"] == "bound" for le in snap["leases"])
    assert compose(stack, tmp_path, "down").returncode == 0
    assert_all_free(stack)


def test_a_failed_recreate_then_a_dockerd_restart_grants_no_gpu_twice(stack, tmp_path):
    """Compose stops at a failed start and leaves the stopped predecessor (GPUs handed
    over) next to its replacement.  ``restart: always`` makes dockerd restart the
    predecessor at its next start, without asking anyone: both may then run on the
    same GPUs."""
    write_project(tmp_path, gpus=4, restart="always")
    assert compose(stack, tmp_path, "up", "-d").returncode == 0
    hook = stack.engine_dir / "bin" / "nvidia-container-runtime-hook"
    hook.write_text("#!/bin/sh\nexit 1\n")  # a transient driver failure at start
    try:
        write_project(tmp_path, gpus=4, command="301", restart="always")
        failed = compose(stack, tmp_path, "up", "-d")
        assert failed.returncode != 0 and START_FAILED in failed.stderr
    finally:
        hook.write_text("#!/bin/sh\nexit 0\n")
    stack.restart_dockerd()
    time.sleep(2)  # dockerd restarts restart-always containers right after it starts
    # The replacement (the name Compose gave it) can now be started, it holds the lease.
    shim_start = engine.docker_cli(stack.shim_sock, "start", worker(1))
    running = [
        c for c in engine.engine_api(stack.engine_sock).containers()
        if c["Labels"].get("com.docker.compose.project") == PROJECT
    ]  # fmt: skip
    assert shim_start.returncode != 0 or len(running) < 2, "both run on the same GPUs"
    assert_invariants(stack)


def test_compose_v2_recreate_on_a_full_host_hands_over_while_the_old_one_runs(stack):
    """Compose v2's order, replayed on the API step by step (the real v2 runs above on
    26 and 28; this checks each refusal in between, on every Engine): create the replacement
    as <old short id>_<name> with com.docker.compose.replace while the old one still runs,
    stop and remove the old one, rename the replacement, start it."""
    api = engine.engine_api(stack.shim_sock)
    labels = {"com.docker.compose.project": "v2", "com.docker.compose.service": "trainer",
              "com.docker.compose.container-number": "1"}  # fmt: skip
    all_gpus = api.create_host_config(device_requests=[{"Count": -1, "Capabilities": [["gpu"]]}])
    old = api.create_container(IMAGE, ["sleep", "300"], name="v2-trainer-1", labels=labels,
                               host_config=all_gpus)["Id"]  # fmt: skip
    api.start(old)
    new = api.create_container(
        IMAGE, ["sleep", "300"], name=f"{old[:12]}_v2-trainer-1", host_config=all_gpus,
        labels={**labels, "com.docker.compose.replace": old},
    )["Id"]  # fmt: skip
    assert sorted(visible_devices(stack, new).split(",")) == UUIDS
    with pytest.raises(Exception, match="still runs on its GPUs"):
        api.start(new)  # the old one holds the same GPUs until it is stopped
    api.stop(old, timeout=1)
    with pytest.raises(Exception, match="handed to the container replacing it"):
        api.start(old)
    api.remove_container(old)
    api.rename(new, "v2-trainer-1")
    api.start(new)
    snap = assert_invariants(stack)
    assert snap["free"] == 0
    assert [le["container"] for le in snap["leases"]] == [new]
