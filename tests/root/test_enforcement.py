"""No GPU without a lease, however the request is written, judged at both layers.

The shim's decision runs through its real interceptor (with a stand-in for the
Engine that answers 201); the plugin's through its real dispatcher (what its worker serves), with
AuthZReq bodies built the way dockerd builds them.  The real-Engine subset is
in test_enforcement_engine.py.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocator.core.api import labels
from allocator.core.api.rewrite import rewrite
from allocator.core.judging import verdicts as decide
from allocator.core.judging.ask import Ask
from allocator.host import config as configmod
from allocator.service.placer import LeaseRequest
from allocator.service.wiring import Allocator
from plugin.app import create_dispatcher
from shim.create import CreateInterceptor
from shim.framing import Request, Response
from tests.support import engine
from tests.support.enforcement_cases import Case, body, cases, make_nodes, request

# Under the kernel's /dev (devtmpfs): device paths anywhere else are refused before their
# nodes are even looked at, since a container could swap them after the check.
DEVDIR = Path("/dev/gpu-alloc-test-nodes")
CREATE_URI = "/v1.41/containers/create?name=job"


class World:
    """A config, 4 simulated GPUs, an empty ledger, the plugin's dispatcher and the interceptor."""

    def __init__(self, root: Path, gpus: int = 4, policy: dict | None = None):
        engine.write_sim_gpus(root / "gpus.yaml", gpus)
        cfg = {"state_dir": str(root / "state"), "gpus": str(root / "gpus.yaml"),
               "engine": {"socket": str(root / "none.sock")}, "policy": policy or {}}  # fmt: skip
        (root / "config.yaml").write_text(yaml.safe_dump(cfg))
        self.config = configmod.load(str(root / "config.yaml"))
        self.alloc = Allocator(self.config)  # no Engine: ledger and inventory only
        self.plugin = create_dispatcher(self.config, self.alloc)
        self.shim = CreateInterceptor(self.alloc)
        self.forwarded: list[Request] = []

    def authz(
        self, method: str, uri: str, payload: bytes | None, headers: dict | None = None
    ) -> dict:
        """dockerd's AuthZReq: the request's headers (``headers``) go to the plugin too."""
        sent = {"Content-Type": "application/json", **(headers or {})}
        req = {"User": "", "UserAuthNMethod": "", "RequestMethod": method, "RequestUri": uri,
               "RequestHeaders": sent}  # fmt: skip
        if payload is not None:
            req["RequestBody"] = base64.b64encode(payload).decode()
        # dockerd sends no Content-Type: the plugin must read the body regardless.
        return json.loads(self.plugin.dispatch("/AuthZPlugin.AuthZReq", json.dumps(req).encode()))

    def via_shim(self, payload: bytes, method: str = "POST", uri: str = CREATE_URI) -> Response:
        async def forward(req: Request) -> Response:
            """dockerd: ask the plugin, then create (201) or answer its denial (403)."""
            self.forwarded.append(req)
            answer = self.authz(req.method, req.target, req.body, dict(req.headers))
            if not answer["Allow"]:
                return Response(
                    403, "Forbidden", [], json.dumps({"message": answer["Msg"]}).encode()
                )
            return Response(201, "Created", [], json.dumps({"Id": "c" * 64}).encode())

        req = Request(method, uri, [("Content-Type", "application/json")], payload)
        return asyncio.run(self.shim.handle(req, forward))


@pytest.fixture
def world(tmp_path: Path) -> World:
    make_nodes(DEVDIR)
    return World(tmp_path)


CASES = cases(DEVDIR)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_plugin_decides_each_create_as_the_table_says(world: World, case: Case):
    answer = world.authz("POST", CREATE_URI, case.body)
    assert answer["Allow"] is (case.plugin == "allow"), answer
    if case.plugin == "deny":
        assert case.why in answer["Msg"]
        assert "gpu-alloc" in answer["Msg"]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_shim_decides_each_create_as_the_table_says(world: World, case: Case):
    response = world.via_shim(case.body)
    if case.shim == "deny":
        assert response.status in (400, 403), response
        assert case.why in json.loads(response.body)["message"]
        assert world.forwarded == []
        return
    assert response.status == 201
    sent = json.loads(world.forwarded[-1].body)
    env = [e for e in sent["Env"] if e.startswith("NVIDIA_VISIBLE_DEVICES=")]
    if case.shim == "allow":
        assert env == ["NVIDIA_VISIBLE_DEVICES=void"]
        assert labels.LEASE not in sent["Labels"]
        return
    n = int(case.shim.split()[1])
    uuids = env[0].split("=", 1)[1].split(",")
    assert len(set(uuids)) == n
    (lease,) = world.alloc.ledger.read().leases.values()
    assert (lease.state, lease.container) == ("bound", "c" * 64)
    assert sorted(lease.gpus) == sorted(uuids)
    # A toolkit with swarm-resource reads this instead: it names the lease too.
    resource = [e for e in sent["Env"] if e.startswith("DOCKER_RESOURCE_GPU=")]
    assert resource == [f"DOCKER_RESOURCE_GPU={','.join(uuids)}"]
    # The plugin admitted what the shim forwarded (201 above), and only once.
    sent = world.forwarded[-1]
    assert labels.LEASE_HEADER in dict(sent.headers)
    assert sent.body.count(dict(sent.headers)[labels.LEASE_HEADER].split(".")[1].encode()) == 0
    again = world.authz("POST", CREATE_URI, sent.body, dict(sent.headers))
    assert again["Allow"] is False
    assert "admitted its create already" in again["Msg"]


def test_the_shim_strips_client_supplied_lease_labels(world: World):
    forged = body(Labels={labels.LEASE: "abc.def", labels.OWNER: "0:root", "app": "y"})
    assert world.via_shim(forged).status == 201
    assert json.loads(world.forwarded[-1].body)["Labels"] == {"app": "y"}


def test_the_shim_drops_client_supplied_gpu_alloc_headers(world: World):
    mine = [("x-gpu-alloc-lease", "abc.def"), ("X-GPU-Alloc-Other", "x"), ("X-App", "y")]

    async def forward(req: Request) -> Response:
        world.forwarded.append(req)
        return Response(201, "Created", [], json.dumps({"Id": "c" * 64}).encode())

    gpu = Request("POST", CREATE_URI, mine, body(HostConfig={"DeviceRequests": [request(1)]}))
    assert asyncio.run(world.shim.handle(gpu, forward)).status == 201
    plain = Request("POST", CREATE_URI, mine, body())
    assert asyncio.run(world.shim.handle(plain, forward)).status == 201
    leased, unleased = (dict(r.headers) for r in world.forwarded)
    assert set(leased) == {"X-App", labels.LEASE_HEADER}
    assert leased[labels.LEASE_HEADER] != "abc.def"
    assert set(unleased) == {"X-App"}


def test_a_lease_label_copied_from_inspect_gets_nothing(world: World):
    gpu_create = body(HostConfig={"DeviceRequests": [request(1)]})
    assert world.via_shim(gpu_create).status == 201
    original = world.forwarded[-1].body
    # Someone reads the label and the UUID from `docker inspect` and replays them directly:
    # the token was never on the container.
    answer = world.authz("POST", CREATE_URI, original)
    assert answer["Allow"] is False
    assert "without a gpu-alloc lease" in answer["Msg"]


def test_a_made_up_lease_label_gets_nothing(world: World):
    spec = json.loads(body(HostConfig={"DeviceRequests": [request(ids=[engine.sim_gpu_uuid(0)])]}))
    spec["Env"] = [f"NVIDIA_VISIBLE_DEVICES={engine.sim_gpu_uuid(0)}"]
    spec["Labels"] = {labels.LEASE: "0123456789abcdef"}
    guess = {labels.LEASE_HEADER: "0123456789abcdef.guessed-token"}
    answer = world.authz("POST", CREATE_URI, json.dumps(spec).encode(), guess)
    assert answer["Allow"] is False
    assert "unknown or forged" in answer["Msg"]


def test_a_lease_header_on_a_create_that_asks_for_no_gpu_is_refused(world: World):
    """Only the shim sets the header, on GPU creates: elsewhere it is made up, and the
    answer to such a create must never settle the lease it names."""
    lease, _ = world.alloc.book.lease(LeaseRequest(Ask((), 1, False, ("gpu",))))
    made_up = {labels.LEASE_HEADER: f"{lease.id}.guessed-token"}
    answer = world.authz("POST", CREATE_URI, body(), made_up)
    assert answer["Allow"] is False
    assert f"carries a {labels.LEASE_HEADER} header but asks for no GPU" in answer["Msg"]
    assert world.authz("POST", CREATE_URI, body())["Allow"] is True  # without it: fine


def test_a_pending_lease_admits_only_its_own_gpus(world: World):
    lease, token = world.alloc.book.lease(LeaseRequest(Ask((), 1, False, ("gpu",))))
    other = next(u for u in map(engine.sim_gpu_uuid, range(4)) if u not in lease.gpus)
    spec = json.loads(body(HostConfig={"DeviceRequests": [request(ids=[other])]}))
    spec["Env"] = [f"NVIDIA_VISIBLE_DEVICES={other}"]
    spec["Labels"] = {labels.LEASE: lease.id}
    header = {labels.LEASE_HEADER: labels.lease_header(lease.id, token)}
    answer = world.authz("POST", CREATE_URI, json.dumps(spec).encode(), header)
    assert answer["Allow"] is False
    assert "differ from lease" in answer["Msg"]


def test_a_create_without_a_body_is_denied(world: World):
    answer = world.authz("POST", CREATE_URI, None)
    assert answer["Allow"] is False
    assert "no request body" in answer["Msg"]


SERVICE_ENV = b'{"TaskTemplate":{"ContainerSpec":{"Env":["DOCKER_RESOURCE_GPU=GPU-1"]}}}'
SERVICE_CAP = b'{"TaskTemplate":{"ContainerSpec":{"CapabilityAdd":["SYS_ADMIN"]}}}'
ROUTES = [
    # (method, uri, body, allowed?, word in the denial)
    ("GET", "/v1.41/containers/json?all=1", None, True, ""),
    ("HEAD", "/_ping", None, True, ""),
    ("POST", "/v1.41/containers/abc/kill", None, True, ""),
    ("DELETE", "/v1.41/containers/abc?force=1", None, True, ""),
    ("POST", "/v1.41/containers/abc/start", None, True, ""),
    ("POST", "/v1.41/containers/abc/start", b'{"Privileged":true}', False, "request body"),
    ("POST", "/v1.23/containers/abc/start", None, False, "1.24"),
    ("POST", "/v1.41/containers/abc/update", b'{"Memory":1048576}', True, ""),
    (
        "POST",
        "/v1.41/containers/abc/update",
        b'{"DeviceRequests":[{"Count":1,"Capabilities":[["gpu"]]}]}',
        False,
        "DeviceRequests",
    ),
    (
        "POST",
        "/v1.41/containers/abc/update",
        b'{"Devices":[{"PathOnHost":"/dev/nvidia0"}]}',
        False,
        "Devices",
    ),
    ("POST", "/v1.41/containers/abc/exec", b'{"Cmd":["sh"],"Privileged":false}', True, ""),
    (
        "POST",
        "/v1.41/containers/abc/exec",
        b'{"Cmd":["sh"],"Privileged":true}',
        False,
        "Privileged",
    ),
    (
        "POST",
        "/v1.41/containers/abc/exec",
        b'{"Cmd":["sh"],"privileged":true}',
        False,
        "letter case",
    ),
    ("POST", "/v1.41/containers/abc/exec", None, False, "no request body"),
    ("POST", "/v1.41/services/create", SERVICE_ENV, False, "DOCKER_RESOURCE_GPU"),
    ("POST", "/v1.41/services/x/update", SERVICE_CAP, False, "SYS_ADMIN"),
    (
        "POST",
        "/v1.41/plugins/pull?remote=x",
        b'[{"Name":"device","Value":["/dev/nvidia0"]}]',
        False,
        "device",
    ),
    ("POST", "/v1.41/plugins/pull?remote=x", b'[{"Name":"network","Value":["host"]}]', True, ""),
    ("POST", "/v1.41/plugins/create?name=x", None, False, "tarball"),
    ("POST", "/v1.41/plugins/x/set", b'["DEBUG=1"]', True, ""),
    ("POST", "/v1.41/plugins/x/set", b'["mydev.path=/dev/nvidia0"]', False, "device"),
    (
        "POST",
        "/v1.41/volumes/create",
        b'{"Name":"v","Driver":"local","DriverOpts":{"type":"none","o":"bind","device":"/dev"}}',
        False,
        "DriverOpts.device",
    ),
    ("POST", "/v1.41/volumes/create", b'{"Name":"v"}', True, ""),
    (
        "POST",
        "/v1.41/volumes/create",
        b'{"Name":"v","DriverOpts":{"type":"none","o":"rbind","device":"/dev"}}',
        False,
        "DriverOpts.device",
    ),
    (
        "POST",
        "/v1.41/volumes/create",
        b'{"Name":"v","DriverOpts":{"type":"proc","device":"proc"}}',
        False,
        "proc",
    ),
    (
        "POST",
        "/v1.41/volumes/create",
        b'{"Name":"v","DriverOpts":{"type":"none","o":"bind","device":"dev"}}',
        False,
        "relative",
    ),
    (
        "POST",
        "/v1.41/volumes/create",
        b'{"Name":"v","DriverOpts":{"type":"tmpfs","device":"tmpfs","o":"size=1m"}}',
        True,
        "",
    ),
    ("POST", "/v1.41/build?t=x&networkmode=default", None, True, ""),
    ("POST", "/v1.41/session", None, True, ""),
    (
        "POST",
        "/v1.41/commit?container=abc&repo=x",
        b'{"Env":["NVIDIA_VISIBLE_DEVICES=all"]}',
        True,
        "",
    ),
    ("POST", "/v1.41/swarm/init", b'{"ListenAddr":"0.0.0.0:2377"}', True, ""),
    ("POST", "/v1.41/containers/abc/frobnicate", None, False, "not an Engine route"),
    ("POST", "/v1.41/Containers/create", b"{}", False, "not an Engine route"),
    (
        "POST",
        "/v1.41/containers%2Fcreate",
        b'{"Image":"b","HostConfig":{"Privileged":true}}',
        False,
        "Privileged",
    ),
    (
        "POST",
        "/v1.41/containers/%63reate",
        b'{"Image":"b","HostConfig":{"Privileged":true}}',
        False,
        "Privileged",
    ),
    (
        "POST",
        "http://docker/v1.41/containers/create",
        b'{"Image":"b","HostConfig":{"Privileged":true}}',
        False,
        "Privileged",
    ),
    ("POST", "/v1.41/containers/create%zz", b"{}", False, "percent-escape"),
]


@pytest.mark.parametrize(
    ("method", "uri", "payload", "allowed", "why"),
    ROUTES,
    ids=[f"{m} {u} {(b or b'')[:40]!r}" for m, u, b, *_ in ROUTES],
)
def test_every_route_that_can_change_devices_is_vetted(
    world: World, method, uri, payload, allowed, why
):
    answer = world.authz(method, uri, payload)
    assert answer["Allow"] is allowed, answer
    if not allowed:
        assert why in answer["Msg"]
    response = world.via_shim(payload or b"", method=method, uri=uri)
    if allowed:
        assert response.status == 201  # forwarded to the stand-in Engine
    else:
        assert response.status in (400, 403)


def test_calls_that_touch_no_gpu_never_read_the_ledger(world: World, monkeypatch):
    def boom(*_a, **_k):
        raise AssertionError("the ledger was touched")

    monkeypatch.setattr(world.alloc.ledger, "read", boom)
    monkeypatch.setattr(world.alloc.ledger, "transaction", boom)
    monkeypatch.setattr(world.alloc.gather, "inventory", boom)
    for method, uri in (
        ("GET", "/v1.41/containers/json"),
        ("POST", "/v1.41/containers/x/stop"),
        ("DELETE", "/v1.41/containers/x"),
        ("GET", "/_ping"),
    ):
        assert world.authz(method, uri, None)["Allow"] is True


# ------------------------------------------------------------------ properties

LEGIT = json.loads(body(HostConfig={"DeviceRequests": [request(1)]}))


def _recase(key: str, flips: list[bool]) -> str:
    return "".join(
        c.swapcase() if f else c for c, f in zip(key, flips + [False] * len(key), strict=False)
    )


@st.composite
def recased(draw) -> tuple[bytes, bool]:
    """The legitimate body with some keys re-cased; also whether anything changed."""
    changed = False

    def walk(node):
        nonlocal changed
        if isinstance(node, dict):
            out = {}
            for k, v in node.items():
                flips = draw(st.lists(st.booleans(), max_size=len(k)))
                nk = _recase(k, flips)
                changed |= nk != k
                out[nk] = walk(v)
            return out
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return json.dumps(walk(LEGIT)).encode(), changed


@contextlib.contextmanager
def _fresh_world() -> Iterator[World]:
    """A World for one example (hypothesis runs many in one test), removed after it."""
    with tempfile.TemporaryDirectory(prefix="ga-prop-") as d:
        yield World(Path(d))


def _leased_body(w: World) -> tuple[bytes, dict[str, str]]:
    """A body the shim leased and its lease header, before the plugin saw them."""
    spec = decide.decode_create(json.dumps(LEGIT).encode())
    lease, token = w.alloc.book.lease(LeaseRequest(Ask((), 1, False, ("gpu",))))
    body = json.dumps(rewrite(spec, lease.gpus, labels.lease_label(lease.id))).encode()
    return body, {labels.LEASE_HEADER: labels.lease_header(lease.id, token)}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recased())
def test_recased_keys_are_never_allowed_to_grant_gpus(sample):
    payload, changed = sample
    with _fresh_world() as w:
        answer = w.authz("POST", CREATE_URI, payload)
        assert answer["Allow"] is False  # no lease: a GPU create is denied however it is spelled
        response = w.via_shim(payload)
        # Through the shim: the canonical spelling is leased, any other is refused outright.
        assert response.status == (400 if changed else 201)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutations_of_a_leased_body_never_widen_the_grant(data):
    with _fresh_world() as w:
        leased, header = _leased_body(w)
        lease = next(iter(w.alloc.ledger.read().leases.values()))
        i = data.draw(st.integers(0, len(leased) - 1))
        op = data.draw(st.sampled_from(["flip", "delete", "insert", "duplicate"]))
        b = bytearray(leased)
        if op == "flip":
            b[i] = data.draw(st.integers(0, 255))
        elif op == "delete":
            del b[i]
        elif op == "insert":
            b[i:i] = data.draw(st.binary(min_size=1, max_size=8))
        else:
            b[i:i] = leased[i : i + data.draw(st.integers(1, 40))]
        answer = w.authz("POST", CREATE_URI, bytes(b), header)
        assert set(answer) <= {"Allow", "Msg", "Err"}  # an answer, never a crash
        if answer["Allow"]:
            spec = decide.decode_create(bytes(b))
            facts = w.alloc.gather.facts()
            from allocator.core.access import access

            granted = access.of_create(spec, facts.engine, facts.inventory, facts.host)
            assert granted.none or granted.gpus(facts.inventory) == frozenset(lease.gpus)
