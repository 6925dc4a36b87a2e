"""Reservations through a real dockerd: a reservation starting in 10 s keeps its GPU.

Two simulated GPUs; ``bob`` creates through the shim as a non-root user (the shim knows
him by SO_PEERCRED), ``alice`` holds the reservation.  Before the window an unlimited
create of bob's goes to the other GPU, or is refused naming the reservation; one with
``io.gpu-alloc.time=3s`` may use the reserved GPU; during the window only alice gets it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator

import pytest

from tests.support import clients, engine, host_users

IMAGE = engine.BUSYBOX_TAG
ALICE, BOB = "ga28alice", "ga28bob"
LEAD = 10.0  # seconds from the reservation to its window


def make_stack() -> engine.Stack:
    return engine.Stack(gpus=2)


@pytest.fixture(scope="module", autouse=True)
def users(stack: engine.Stack) -> Iterator[None]:
    with host_users.present(ALICE, BOB):
        host_users.open_shim(stack)
        os.chmod(stack.state_dir, 0o700)  # root's, as installed: others ask the shim
        yield


def create(stack: engine.Stack, user: str, name: str, *extra: str, gpus: str = "1"):
    return clients.docker_cli(
        stack.shim_sock, "create", "--name", name, "--gpus", gpus, *extra, IMAGE, "true",
        user=user,
    )  # fmt: skip


def gpu_of(stack: engine.Stack, name: str) -> str:
    got = clients.docker_cli(stack.shim_sock, "inspect", name)
    assert got.returncode == 0, got.stderr
    (request,) = json.loads(got.stdout)[0]["HostConfig"]["DeviceRequests"]
    (uuid,) = request["DeviceIDs"]
    return uuid


def reservations(stack: engine.Stack) -> list[dict]:
    got = engine.gpu_alloc(stack, "reservations", "--json")
    assert got.returncode == 0, got.stderr
    return json.loads(got.stdout)


def test_a_reservation_starting_in_10s_keeps_its_gpu_and_gives_it_to_its_holder(stack) -> None:
    made = engine.gpu_alloc(
        stack, "reserve", "--gpus", "1", "--for", ALICE, "--from", f"+{LEAD:g}s", "--to", "+5m"
    )
    begins = time.monotonic() + LEAD
    assert made.returncode == 0, made.stderr
    # before the window an unlimited create goes to the other GPU, and one whose time limit
    # ends before the window may use the reserved one
    assert create(stack, BOB, "elsewhere").returncode == 0
    short = create(stack, BOB, "short", "--label", "io.gpu-alloc.time=3s")
    assert short.returncode == 0, short.stderr
    short_gpu = gpu_of(stack, "short")
    assert clients.docker_cli(stack.shim_sock, "rm", "-f", "short").returncode == 0
    # ... and with nothing else free it is refused, naming the reservation
    refused = create(stack, BOB, "unlimited")
    assert time.monotonic() < begins - 1, "too slow to tell: the window was near"
    (r,) = reservations(stack)
    reserved, rid = r["uuids"][0], r["id"]
    assert gpu_of(stack, "elsewhere") != reserved
    assert short_gpu == reserved
    assert refused.returncode != 0
    assert f"reserved for {ALICE} from" in refused.stderr and rid in refused.stderr, refused.stderr
    assert "io.gpu-alloc.time" in refused.stderr
    # during the window: nobody else, not even with a short limit or by name ...
    time.sleep(max(0.0, begins - time.monotonic()) + 0.5)
    during = create(stack, BOB, "during", "--label", "io.gpu-alloc.time=3s")
    assert during.returncode != 0 and f"reserved for {ALICE} until" in during.stderr
    named = create(stack, BOB, "named", gpus=f"device={reserved}")
    assert named.returncode != 0 and rid in named.stderr, named.stderr
    # ... but its holder
    mine = create(stack, ALICE, "mine")
    assert mine.returncode == 0, mine.stderr
    assert gpu_of(stack, "mine") == reserved
    for name in ("elsewhere", "mine"):
        clients.docker_cli(stack.shim_sock, "rm", "-f", name)
    assert engine.gpu_alloc(stack, "reserve", "cancel", rid).returncode == 0


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ["--gpu", "0", "--from", "2020-01-01T00:00:00Z", "--to", "2020-01-01T01:00:00Z"],
            "in the past",
        ),
        (["--gpu", "0", "--from", "+2h", "--to", "+1h"], "must be after --from"),
        (["--gpus", "3", "--from", "+1m", "--to", "+1h"], "this host has only 2"),
        (["--gpu", "5", "--from", "+1m", "--to", "+1h"], "is not a GPU on this host"),
        (["--gpu", "0", "--from", "soon", "--to", "+1h"], "'soon' is not a time"),
        (["--gpu", "1", "--from", "+1m", "--to", "+1h"], "overlaps another reservation"),
    ],
)
def test_bad_reservations_are_refused_cleanly(stack, args, said) -> None:
    if said.startswith("overlaps"):
        first = engine.gpu_alloc(stack, "reserve", "--gpu", "1", "--for", ALICE,
                                 "--from", "+30s", "--to", "+2h")  # fmt: skip
        assert first.returncode == 0, first.stderr
    got = engine.gpu_alloc(stack, "reserve", "--for", BOB, *args)
    assert got.returncode != 0 and said in got.stderr and "Traceback" not in got.stderr
    for r in reservations(stack):
        engine.gpu_alloc(stack, "reserve", "cancel", r["id"])


def test_a_user_who_cannot_read_the_state_dir_lists_the_reservations(stack) -> None:
    """A refusal for a reserved GPU says "'gpu-alloc reservations' lists them": bob, who
    may use Docker but not read the state directory, runs it and the shim answers."""
    made = engine.gpu_alloc(stack, "reserve", "--gpu", "0", "--for", ALICE,
                            "--from", "+1h", "--to", "+2h", "--note", "paper")  # fmt: skip
    assert made.returncode == 0, made.stderr
    try:
        got = host_users.gpu_alloc_as(BOB, stack.config_path, "reservations", "--json")
        assert got.returncode == 0, got.stderr + stack.logs()
        assert [(r["for"], r["gpus"], r["note"]) for r in json.loads(got.stdout)] == [
            (ALICE, [0], "paper")
        ]
    finally:
        for r in reservations(stack):
            engine.gpu_alloc(stack, "reserve", "cancel", r["id"])
