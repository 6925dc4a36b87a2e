"""What the plugin and the shim decide at once, on their event loops, and what waits.

The plugin allows an unnamed create at once when the facts at hand suffice.  What it pins: the
quick answer is the full decision's, for every create of the enforcement table and for
a leased one; a create that needs a fact not at hand (a bind's source, a volume, the
Engine's view gone stale, an inventory due to be read again) or is refused goes to the
pool as a `Later`, which records the refusal; so do a big body, a failure on the quick
path, and a named create (it is put in flight) once there is an Engine to resolve
names.  The loop never waits while NVML is read.

A call put in flight at its AuthZReq (a start, a removal) leaves the board before its
AuthZRes is answered: on the loop when the board's lock is free at once, else on the pool.

The shim forwards a create that surely asks for no GPU from its event loop, by the same
facts at hand; one that asks for a GPU takes that ask to its thread (made once), and one
that needs a fact not at hand, is big, or is refused (audited), is decided on the thread.
"""

from __future__ import annotations

import asyncio
import base64
import fcntl
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from allocator.core.leases.inflight import Start, Target
from allocator.host.inflight import Registry
from allocator.service import gather
from allocator.service.wiring import Allocator
from plugin.app import _ALLOW, Dispatcher
from shim.framing import Request, Response
from tests.root.test_enforcement import DEVDIR, World
from tests.support.enforcement_cases import body, cases, make_nodes, request
from tests.support.fake_engine import FakeEngine

REQ = "/AuthZPlugin.AuthZReq"
UNNAMED = "/v1.41/containers/create"
GPU_CREATE = body(HostConfig={"DeviceRequests": [request(1)]})
PLAIN_CREATE = body()
JOB = Target("c0ffee" + "1" * 58, "job")


def envelope(payload: bytes, uri: str = UNNAMED, headers: dict | None = None) -> bytes:
    return json.dumps(
        {
            "User": "",
            "RequestMethod": "POST",
            "RequestUri": uri,
            "RequestBody": base64.b64encode(payload).decode(),
            "RequestHeaders": {"Content-Type": "application/json", **(headers or {})},
        }
    ).encode()


def on_the_pool(answer: bytes | object) -> dict:
    """The answer of a `Later` (it must be one: decided on the pool), as the pool gives it."""
    assert not isinstance(answer, bytes)
    return answered(answer)


def answered(answer: bytes | object) -> dict:
    """The plugin's answer, waiting for a `Later` as the worker's pool would."""
    raw = answer if isinstance(answer, bytes) else answer()  # type: ignore[operator]
    return json.loads(raw)


def audit_trail(world: World) -> str:
    return (Path(world.config.state_dir) / "audit.jsonl").read_text()


@pytest.fixture
def world(tmp_path: Path) -> World:
    make_nodes(DEVDIR)
    w = World(tmp_path)
    w.alloc.gather.facts()  # the Engine's view, as the plugin's first calls leave it cached
    return w


def test_a_plain_create_is_allowed_at_once(world: World) -> None:
    answer = Dispatcher(world.alloc).answer(REQ, envelope(PLAIN_CREATE))
    assert isinstance(answer, bytes)
    assert json.loads(answer) == {"Allow": True}


def test_a_leased_create_is_allowed_at_once(world: World) -> None:
    plugin, answers = Dispatcher(world.alloc), []

    async def forward(req: Request) -> Response:
        """dockerd: ask the plugin, then create."""
        answers.append(plugin.answer(REQ, envelope(req.body, req.target, dict(req.headers))))
        return Response(201, "Created", [], json.dumps({"Id": "c" * 64}).encode())

    create = Request("POST", UNNAMED, [("Content-Type", "application/json")], GPU_CREATE)
    assert asyncio.run(world.shim.handle(create, forward)).status == 201
    assert answers == [_ALLOW]
    (lease,) = world.alloc.ledger.read().leases.values()
    assert lease.container == "c" * 64


def test_every_table_case_gets_the_full_decisions_answer(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    quick = Dispatcher(world.alloc)
    at_once = 0
    for case in cases(DEVDIR):
        raw = envelope(case.body)
        answer = quick.answer(REQ, raw)
        at_once += isinstance(answer, bytes)
        with monkeypatch.context() as m:
            m.setattr(gather, "ENGINE_VIEW_MAX_AGE", 0.0)  # nothing cached: all in full
            full = Dispatcher(world.alloc).answer(REQ, raw)
            assert not isinstance(full, bytes)
            expected = answered(full)
        assert answered(answer) == expected, case.name
        if isinstance(answer, bytes):
            assert expected["Allow"] is True, case.name  # only an Allow is quick
    assert at_once >= 5, at_once  # the everyday shapes took the quick path


def test_a_bind_mount_waits_for_the_pool(world: World, tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    payload = body(HostConfig={"Binds": [f"{tmp_path / 'data'}:/data"]})
    answer = Dispatcher(world.alloc).answer(REQ, envelope(payload))
    assert on_the_pool(answer) == {"Allow": True}


def test_a_refused_create_is_refused_by_the_pool_and_audited(world: World) -> None:
    Path(world.config.state_dir).mkdir()
    refusal = on_the_pool(Dispatcher(world.alloc).answer(REQ, envelope(GPU_CREATE)))
    assert refusal["Allow"] is False
    assert "DeviceRequests" in refusal["Msg"]
    assert '"denial"' in audit_trail(world)


def test_a_stale_engine_view_sends_the_create_to_the_pool(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gather, "ENGINE_VIEW_MAX_AGE", 0.0)
    answer = Dispatcher(world.alloc).answer(REQ, envelope(PLAIN_CREATE))
    assert on_the_pool(answer) == {"Allow": True}


def test_a_named_create_goes_to_the_pool_when_names_can_move(world: World) -> None:
    world.alloc = Allocator(world.config, FakeEngine())  # type: ignore[arg-type]
    world.alloc.gather.facts()
    plugin = Dispatcher(world.alloc)
    assert isinstance(plugin.answer(REQ, envelope(PLAIN_CREATE)), bytes)
    named = plugin.answer(REQ, envelope(PLAIN_CREATE, UNNAMED + "?name=job"))
    assert on_the_pool(named) == {"Allow": True}


def test_a_big_create_body_is_decoded_on_the_pool(world: World) -> None:
    big = body(Labels={f"note{i}": "x" * 100 for i in range(600)})  # 64 KiB and more
    answer = Dispatcher(world.alloc).answer(REQ, envelope(big))
    assert on_the_pool(answer) == {"Allow": True}


def test_a_failure_on_the_quick_path_leaves_the_decision_to_the_pool(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    real, failed = world.alloc.gather.at_hand, []

    def broken_once(verdict: Any, *reads: Any) -> Any:
        if not failed:
            failed.append(verdict)
            raise RuntimeError("a bug of the quick path")
        return real(verdict, *reads)

    monkeypatch.setattr(world.alloc.gather, "at_hand", broken_once)
    answer = Dispatcher(world.alloc).answer(REQ, envelope(PLAIN_CREATE))
    assert on_the_pool(answer) == {"Allow": True}


def test_the_loop_never_waits_for_an_inventory_being_read(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVML can take seconds (or hang, a GPU fallen off the bus): the event loop goes on."""
    reading, release = threading.Event(), threading.Event()
    devices = world.alloc.gather.devices
    real = devices.inventory

    def slow() -> object:
        reading.set()
        release.wait(10)
        return real()

    monkeypatch.setattr(devices, "inventory", slow)
    gpus = Path(world.config.gpus)
    gpus.write_text(gpus.read_text() + "\n")  # changed: the next facts read it again
    loader = threading.Thread(target=world.alloc.gather.facts)
    loader.start()
    try:
        assert reading.wait(10)
        began = time.monotonic()
        answer = Dispatcher(world.alloc).answer(REQ, envelope(PLAIN_CREATE))
        assert time.monotonic() - began < 5  # not the 10 s the loader is held
        assert not release.is_set()
        assert not isinstance(answer, bytes)  # it is decided on the pool, once read
    finally:
        release.set()
        loader.join()
    assert answered(answer) == {"Allow": True}


def in_flight_start(world: World, tmp_path: Path) -> tuple[Dispatcher, bytes]:
    """A plugin with a start of ``job`` on its board, and that start's AuthZRes."""
    world.alloc = Allocator(world.config, FakeEngine())  # type: ignore[arg-type]
    plugin = Dispatcher(world.alloc)
    plugin.inflight.registry = Registry(tmp_path)
    uri = "/v1.41/containers/job/start"
    why, _ = plugin.inflight.registry.begin(f"POST {uri}", Start("start", "job", JOB))
    assert why is None
    res = {"RequestMethod": "POST", "RequestUri": uri, "ResponseStatusCode": 204}
    return plugin, json.dumps(res).encode()


def test_a_start_leaves_the_board_before_its_response_is_answered(
    world: World, tmp_path: Path
) -> None:
    # Answered first, a worker killed right after would leave the entry for its TTL.
    plugin, res = in_flight_start(world, tmp_path)
    assert plugin.answer("/AuthZPlugin.AuthZRes", res) == _ALLOW
    assert plugin.inflight.registry.read().entries == ()


def test_a_busy_board_ends_the_start_on_the_pool_before_answering(
    world: World, tmp_path: Path
) -> None:
    plugin, res = in_flight_start(world, tmp_path)
    other = os.open(tmp_path / "gpu-alloc.inflight", os.O_RDWR)
    fcntl.flock(other, fcntl.LOCK_EX)  # another worker holds the board's lock
    try:
        began = time.monotonic()
        answer = plugin.answer("/AuthZPlugin.AuthZRes", res)
        assert time.monotonic() - began < 2.5  # tried the lock once, not its 5 s wait
        assert not isinstance(answer, bytes)
        assert len(plugin.inflight.registry.read().entries) == 1
    finally:
        os.close(other)
    assert answered(answer) == {"Allow": True}
    assert plugin.inflight.registry.read().entries == ()


class Forwarded:
    """dockerd behind the shim: a 201 for every create, each body kept."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []

    async def __call__(self, req: Request) -> Response:
        self.bodies.append(json.loads(req.body))
        return Response(201, "Created", [], json.dumps({"Id": "c" * 64}).encode())


def through_shim(
    world: World, payload: bytes, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[str], list[dict]]:
    """The create through the shim: which took the thread (`Creates.lease_for`), what went
    on."""
    threaded: list[str] = []
    real = world.alloc.creates.lease_for

    def lease_for(*args: object) -> object:
        threaded.append(json.loads(payload).get("Image", ""))
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(world.alloc.creates, "lease_for", lease_for)
    forward = Forwarded()
    req = Request("POST", UNNAMED, [("Content-Type", "application/json")], payload)
    response = asyncio.run(world.shim.handle(req, forward))
    assert response.status in (201, 403), response
    return threaded, forward.bodies


def test_the_shim_forwards_a_plain_create_without_a_thread(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    threaded, sent = through_shim(world, PLAIN_CREATE, monkeypatch)
    assert threaded == []
    assert "NVIDIA_VISIBLE_DEVICES=void" in sent[0]["Env"]  # the guard, as on the thread


def test_the_shim_leases_a_gpu_create_on_its_thread(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    threaded, sent = through_shim(world, GPU_CREATE, monkeypatch)
    assert threaded == ["busybox"]
    (lease,) = world.alloc.ledger.read().leases.values()
    assert sent[0]["HostConfig"]["DeviceRequests"][0]["DeviceIDs"] == list(lease.gpus)


def test_the_shim_refuses_on_its_thread_so_the_refusal_is_audited(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    Path(world.config.state_dir).mkdir()
    privileged = body(HostConfig={"Privileged": True})
    threaded, sent = through_shim(world, privileged, monkeypatch)
    assert (threaded, sent) == (["busybox"], [])
    assert '"refusal"' in audit_trail(world)


def test_the_shim_asks_in_full_when_the_engines_view_is_stale(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gather, "ENGINE_VIEW_MAX_AGE", 0.0)
    threaded, sent = through_shim(world, PLAIN_CREATE, monkeypatch)
    assert threaded == ["busybox"]
    assert "NVIDIA_VISIBLE_DEVICES=void" in sent[0]["Env"]


def test_a_gpu_creates_ask_is_made_once_when_the_facts_are_at_hand(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shim import create

    asks: list[object] = []
    real = create.decide.shim_ask
    monkeypatch.setattr(create.decide, "shim_ask", lambda *a: asks.append(a) or real(*a))
    threaded, _ = through_shim(world, GPU_CREATE, monkeypatch)
    assert (threaded, len(asks)) == (["busybox"], 1)


def test_the_shim_judges_a_big_create_on_its_thread(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = body(Labels={f"note{i}": "x" * 100 for i in range(600)})  # 48 KiB and more
    threaded, sent = through_shim(world, big, monkeypatch)
    assert threaded == ["busybox"]
    assert "NVIDIA_VISIBLE_DEVICES=void" in sent[0]["Env"]
