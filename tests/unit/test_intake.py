"""The create as one service call (`Intake.create`): a decoded create and who asks in,
what to forward or the refusal out, and the Engine's answer handed back."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from allocator.core.api import labels
from allocator.host import config
from allocator.service.intake import Approved, Refused
from allocator.service.placer import LeaseRequest
from allocator.service.wiring import Allocator
from tests.support.enforcement_cases import body, request

CID = "c" * 64
TARGET = "/v1.41/containers/create?name=job"


class NoLine:
    """A line nobody may join: these creates never wait."""

    async def wait(self, req: LeaseRequest, seconds: float, gone: object = None) -> None:
        raise AssertionError("no create here waits")


def world(tmp_path: Path, policy: str = "{}") -> Allocator:
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text("[{uuid: GPU-0, index: 0, memory_mib: 81920}, {uuid: GPU-1, index: 1}]\n")
    (tmp_path / "state").mkdir()
    return Allocator(config.parse(f"gpus: {gpus}\nstate_dir: {tmp_path}/state\npolicy: {policy}\n"))


def create(alloc: Allocator, **fields: object) -> Approved | Refused:
    decoded = json.loads(body(**fields))
    return asyncio.run(alloc.intake.create(decoded, "POST", TARGET, None, NoLine()))


def test_a_gpu_create_is_granted_its_lease_with_the_header_the_plugin_reads(tmp_path) -> None:
    alloc = world(tmp_path)
    got = create(alloc, HostConfig={"DeviceRequests": [request(1)]})
    assert isinstance(got, Approved) and got.grant is not None
    lease = got.grant.lease
    assert dict(got.headers) == {labels.LEASE_HEADER: got.grant.header}
    assert json.loads(got.body)["HostConfig"]["DeviceRequests"][0]["DeviceIDs"] == list(lease.gpus)
    asyncio.run(alloc.intake.answered(got, None, 201, json.dumps({"Id": CID}).encode()))
    assert alloc.ledger.read().leases[lease.id].container == CID


def test_a_create_without_gpus_goes_on_with_the_guard_and_no_lease(tmp_path) -> None:
    alloc = world(tmp_path)
    got = create(alloc)
    assert isinstance(got, Approved) and (got.grant, got.headers) == (None, ())
    assert "NVIDIA_VISIBLE_DEVICES=void" in json.loads(got.body)["Env"]
    assert alloc.ledger.read().leases == {}


def test_the_clients_labels_are_read_by_the_service_and_refused_when_wrong(tmp_path) -> None:
    alloc = world(tmp_path)
    got = create(alloc, Labels={"io.gpu-alloc.share": "quarter"})
    assert isinstance(got, Refused) and got.status == 400
    assert "a fraction of one GPU" in got.msg


def test_a_create_the_engine_never_got_frees_its_lease(tmp_path) -> None:
    alloc = world(tmp_path)
    got = create(alloc, HostConfig={"DeviceRequests": [request(1)]})
    assert isinstance(got, Approved)
    asyncio.run(alloc.intake.lost(got, delivered=False))
    assert alloc.ledger.read().leases == {}


def test_a_share_whose_mps_daemon_cannot_start_is_refused_and_its_lease_ends(tmp_path) -> None:
    alloc = world(tmp_path, "{sharing: [{gpus: [0], shares: 4}]}")
    alloc.mps.ensure = lambda lease: "the MPS daemon of GPU 0 did not start"  # type: ignore[method-assign]
    got = create(
        alloc,
        HostConfig={"DeviceRequests": [request(1)]},
        Labels={"io.gpu-alloc.share": "1/4"},
    )
    assert got == Refused(503, "the MPS daemon of GPU 0 did not start")
    assert alloc.ledger.read().leases == {}


def test_a_gpu_create_through_the_shim_reaches_the_library_only_to_decode_route_and_ask(
    tmp_path,
) -> None:
    """The shim's own calls during one GPU create, traced: every decision is the service's."""
    import sys

    from shim.create import CreateInterceptor
    from shim.framing import Request, Response

    alloc = world(tmp_path)
    shim = CreateInterceptor(alloc)

    async def engine(req: Request) -> Response:
        return Response(201, "Created", [], json.dumps({"Id": CID}).encode())

    payload = body(HostConfig={"DeviceRequests": [request(1)]})
    create = Request("POST", TARGET, [("Content-Type", "application/json")], payload)
    called: set[str] = set()

    def trace(frame, event, arg) -> None:
        caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back else ""
        callee = frame.f_globals.get("__name__", "")
        if event == "call" and caller.startswith("shim.") and callee.startswith("allocator."):
            called.add(callee)

    sys.setprofile(trace)
    try:
        answer = asyncio.run(shim.handle(create, engine))
    finally:
        sys.setprofile(None)
    assert answer.status == 201
    assert called == {
        "allocator.core.api.createbody",  # bytes -> request
        "allocator.core.judging.verdicts",  # which route
        "allocator.service.intake",  # the create, decided
    }
