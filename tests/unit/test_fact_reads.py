"""What a verdict reads of its facts is what its route declares (route_checks.READS).

Every route of core/api/routes.py is judged on recording facts (`Facts.read`), with bodies
that reach each of its checks' branches; a read outside the declaration fails here, and
so does a declared fact no body reads.  A verdict handed only its declared facts that
reads another gets `Unread`, never a default.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from allocator.core.access.facts import EngineView
from allocator.core.api import routes
from allocator.core.api.createbody import decode_create
from allocator.core.api.gojson import BodyError
from allocator.core.api.routes import Check
from allocator.core.judging import services
from allocator.core.judging import verdicts as decide
from allocator.core.judging.decisions import EVERY_FACT, Fact, Facts, Unread
from allocator.core.judging.route_checks import READS
from allocator.core.machine.inventory import GPU, Inventory
from tests.support.enforcement_cases import body, cases, request
from tests.support.table_host import TableHost

INVENTORY = Inventory((GPU("GPU-0", 0), GPU("GPU-1", 1)))


def recording() -> Facts:
    return Facts(
        INVENTORY,
        EngineView(version=(20, 10, 24), authz_plugins=("gpu-alloc",)),
        TableHost(),
        container_of=lambda name: [
            {"Mounts": [{"Type": "bind", "Source": "/srv/data", "Destination": "/data"}]}
        ],
        volume_of=lambda name: ("local", {"type": "none", "o": "bind", "device": "/srv"}),
    )


def sample(pattern: str) -> str:
    """A path the row's pattern matches: its name a container's, its first alternative."""
    path = pattern.replace("(?P<name>.*)", "job").replace("(?P<checkpoint>[^/]*)", "cp")
    return re.sub(r"\(\?:([^|)]*)[^)]*\)\??", r"\1", path)


ROWS = [(method, sample(pattern), check) for method, pattern, check in routes._WRITES]
ROWS.append(("GET", "/containers/json", Check.ALLOW))

_TASK = {"ContainerSpec": {"Image": "busybox", "Mounts": [
    {"Type": "volume", "Source": "scratch", "Target": "/s"},
    {"Type": "bind", "Source": "/srv", "Target": "/srv"}]},
    "Resources": {"Reservations": {"GenericResources": [
        {"DiscreteResourceSpec": {"Kind": "gpu", "Value": 1}}]}}}  # fmt: skip
_PRIVILEGES = [{"Name": "devices", "Value": ["/dev/nvidia0"]},
               {"Name": "mount", "Value": ["/srv"]}]  # fmt: skip
BODIES: dict[Check, list[object]] = {
    Check.CREATE: [
        *[c.body for c in cases(Path("/dev"))],
        body(HostConfig={"DeviceRequests": [request(1)]}),
        body(HostConfig={"Binds": ["/srv/data:/data", "scratch:/scratch"]}),
        body(HostConfig={"VolumesFrom": ["other"]}),
    ],
    Check.SERVICE: [
        {"Name": "train", "TaskTemplate": _TASK},
        services.pin({"Name": "train", "TaskTemplate": _TASK}, services.DEFAULT_KIND),
    ],
    Check.PLUGIN_INSTALL: [_PRIVILEGES],
    Check.PLUGIN_UPGRADE: [_PRIVILEGES],
    Check.PLUGIN_SET: [["mount.source=/dev", "DEBUG=1"]],
    Check.VOLUME_CREATE: [
        {"Name": "v", "Driver": "local", "DriverOpts": {"o": "bind", "device": "/dev"}},
        {"Name": "v", "Driver": "local"},
    ],
    Check.UPDATE: [{"Memory": 1 << 30, "RestartPolicy": {"Name": "always"}}],
    Check.EXEC: [{"Cmd": ["true"], "Privileged": True}],
}


def reads(method: str, uri: str, raw: object) -> set[Fact]:
    route = decide.route_of(method, uri)
    assert not isinstance(route, decide.Deny)
    facts = recording()
    data = raw if raw is None or isinstance(raw, bytes) else json.dumps(raw).encode()
    decide.authz_request(route, method, uri, data, facts)
    return facts.read


@pytest.mark.parametrize(("method", "path", "check"), ROWS, ids=[f"{m} {p}" for m, p, _ in ROWS])
def test_every_route_reads_only_the_facts_it_declares(method, path, check) -> None:
    uri = f"/v1.41{path}"
    route = decide.route_of(method, uri)
    assert not isinstance(route, decide.Deny) and route.check is check
    declared = decide.reads_facts(route)
    read: set[Fact] = set()
    for raw in [None, b"{}", b"null", *BODIES.get(check, [])]:
        read |= reads(method, uri, raw)
    assert read <= declared, f"{check}: reads {read - declared} it does not declare"
    assert read == declared, f"{check}: declares {declared - read} it never reads"


def test_every_check_declares_its_facts() -> None:
    assert set(READS) == set(Check)


def test_a_routes_declared_facts_are_what_is_gathered_for_it() -> None:
    start = decide.route_of("POST", "/v1.41/containers/job/start")
    service = decide.route_of("POST", "/v1.41/services/create")
    assert not isinstance(start, decide.Deny) and not isinstance(service, decide.Deny)
    assert decide.reads_facts(start) == frozenset()
    assert Fact.SWARM_KIND in decide.reads_facts(service)  # the swarm-kind bug's fact


def test_a_read_of_a_fact_not_gathered_is_an_error_not_a_default() -> None:
    facts = recording().only(frozenset({Fact.ENGINE}))
    assert facts.engine.version == (20, 10, 24)
    with pytest.raises(Unread, match="swarm_kind"):
        facts.swarm_kind  # noqa: B018
    with pytest.raises(Unread, match="inventory"):
        facts.known_gpus  # noqa: B018
    assert facts.read == {Fact.ENGINE, Fact.SWARM_KIND, Fact.INVENTORY}
    with pytest.raises(Unread):
        decide.unread().host  # noqa: B018


def test_a_service_judged_without_its_swarm_kind_raises() -> None:
    """The swarm-kind bug: a service's verdict on facts lacking swarm.kind is refused the
    read, so it cannot be judged as kind 'gpu' by default."""
    uri = "/v1.41/services/create"
    route = decide.route_of("POST", uri)
    assert not isinstance(route, decide.Deny)
    spec = json.dumps(services.pin({"Name": "t", "TaskTemplate": _TASK}, "nvidia_gpu")).encode()
    facts = recording().only(EVERY_FACT - {Fact.SWARM_KIND})
    with pytest.raises(Unread, match="swarm_kind"):
        decide.authz_request(route, "POST", uri, spec, facts)


def test_the_needs_of_facts_not_asked_are_no_read() -> None:
    facts = recording()
    assert facts.needs == "" and facts.read == set()


def test_the_shims_ask_reads_only_the_facts_it_declares() -> None:
    read: set[Fact] = set()
    for raw in BODIES[Check.CREATE]:
        assert isinstance(raw, bytes)
        try:
            spec = decode_create(raw)
        except BodyError:
            continue  # refused before any fact, as the shim refuses it
        facts = recording()
        decide.shim_ask(spec, facts)
        read |= facts.read
    assert read == decide.SHIM_ASK_READS
