"""The plugin's create: its body decoded once (base64, then as dockerd reads it), however
often its verdict is made; and made again on facts read only when the facts at hand did
not suffice."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from allocator.core.access.facts import EngineView
from allocator.core.api.gojson import Body, BodyError
from allocator.core.judging import verdicts
from allocator.core.machine.inventory import GPU, Inventory
from allocator.service.wiring import Allocator
from plugin import app
from tests.support.enforcement_cases import body, request
from tests.support.fake_engine import allocator_on
from tests.support.table_host import TableHost

REQ = "/AuthZPlugin.AuthZReq"


@pytest.fixture
def alloc(tmp_path: Path) -> Allocator:
    return allocator_on(tmp_path)


def envelope(payload: bytes) -> bytes:
    return json.dumps({"RequestMethod": "POST", "RequestUri": "/v1.41/containers/create",
                       "RequestBody": base64.b64encode(payload).decode(),
                       "RequestHeaders": {}}).encode()  # fmt: skip


def counted(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> list[object]:
    calls: list[object] = []
    real = getattr(module, name)

    def count(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, count)
    return calls


@pytest.mark.parametrize(
    ("payload", "runs"),
    [
        (body(HostConfig={"Binds": ["/srv/data:/data"]}), 2),  # at hand, then on the host read
        (body(HostConfig={"DeviceRequests": [request(1)]}), 1),  # refused at hand: no lease
        (body(), 1),  # allowed at hand
    ],
    ids=["a bind", "a GPU without a lease", "a plain create"],
)
def test_a_creates_body_is_decoded_once_however_often_it_is_judged(
    alloc: Allocator, monkeypatch: pytest.MonkeyPatch, payload: bytes, runs: int
) -> None:
    alloc.gather.facts()  # the Engine's view and the inventory, as the first calls leave them
    judged = counted(monkeypatch, verdicts, "authz_request")
    decoded = counted(monkeypatch, verdicts, "decode_create")
    unpacked = counted(monkeypatch, app, "_body")
    answer = app.Dispatcher(alloc).answer(REQ, envelope(payload))
    json.loads(answer if isinstance(answer, bytes) else answer())
    assert (len(judged), len(decoded), len(unpacked)) == (runs, 1, 1)


def test_a_kept_body_gives_its_first_decoding_or_its_error_again() -> None:
    kept, calls = Body(b'{"Image": "busybox"}'), []

    def read(raw: bytes) -> dict:
        calls.append(raw)
        return json.loads(raw)

    assert kept.decoded(read) is kept.decoded(read)
    assert calls == [b'{"Image": "busybox"}']
    bad = Body(b"{")
    with pytest.raises(BodyError):
        bad.decoded(verdicts.decode_create)
    with pytest.raises(BodyError):
        bad.decoded(verdicts.decode_create)
    assert Body.of(kept) is kept and Body.of(None).raw is None


def test_a_create_judged_twice_on_one_kept_body_is_judged_alike() -> None:
    """What a verdict reads of the decoding it never changes: the second verdict on the
    kept body is the first's."""
    route = verdicts.route_of("POST", "/v1.41/containers/create")
    assert not isinstance(route, verdicts.Deny)
    kept = Body(body(HostConfig={"DeviceRequests": [request(1)]}, Env=["A=1"]))
    first = verdicts.authz_request(route, "POST", "/v1.41/containers/create", kept, facts())
    again = verdicts.authz_request(route, "POST", "/v1.41/containers/create", kept, facts())
    assert first == again and isinstance(first, verdicts.Deny)
    assert kept.decoded(verdicts.decode_create) == verdicts.decode_create(kept.raw or b"")


def facts() -> verdicts.Facts:
    return verdicts.Facts(Inventory((GPU("GPU-0", 0),)), EngineView(), TableHost())
