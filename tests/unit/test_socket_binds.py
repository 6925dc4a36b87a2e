"""Who may bind the Engine's socket (allocator/core/judging/socket_binds.py): a create the shim
labelled and marked for an owner ``policy.engine_socket_binds`` names, on both sockets;
nobody else, and nothing a docker-group user can copy or spell."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import yaml

from allocator.core.access import access
from allocator.core.access.facts import EngineView
from allocator.core.judging import service_marks as service
from allocator.core.judging import socket_binds as binds
from allocator.core.judging import verdicts as decide
from allocator.core.judging.service_marks import Signing
from allocator.core.judging.socket_binds import Binders
from allocator.core.machine.inventory import Inventory
from allocator.host import config
from allocator.host.creators import Creators
from allocator.host.filesystem import Host
from allocator.service.wiring import Allocator
from tests.support import engine as sim
from tests.support.fake_engine import FakeEngine
from tests.support.table_host import TableHost

KEY = b"k" * 32
SOCK = "/var/run/docker.sock"
URI = "/v1.41/containers/create?name=ci"


@dataclass
class BinderHost(TableHost):
    """A table host whose Engine serves ``SOCK`` (and one inside its own directory), and
    whose policy lets alice alone bind it."""

    engine_sockets: tuple[str, ...] = (SOCK, "/run/docker/inner.sock")

    def may_bind_engine(self, user: str) -> bool:
        return user == "alice"

    def __post_init__(self) -> None:
        self.protected = (*self.protected, *self.engine_sockets)


def create(*binds_: str, owner: str = "") -> dict:
    spec: dict = {"Image": "ci", "HostConfig": {"Binds": list(binds_)}}
    return binds.labelled_as(spec, owner) if owner else spec


def judge(spec: dict, headers: dict | None = None, uri: str = URI) -> decide.Decision:
    body = json.dumps(spec).encode()
    facts = decide.Facts(None, EngineView(), BinderHost())
    route = decide.route_of("POST", uri)
    return decide.authz_request(route, "POST", uri, body, facts,  # type: ignore[arg-type]
                                headers=headers, signing=Signing(KEY))  # fmt: skip


def marked(spec: dict, uri: str = URI, key: bytes = KEY) -> dict[str, str]:
    """The header the shim sends with ``spec`` as its body."""
    return {binds.HEADER: binds.mark(key, "POST", uri, json.dumps(spec).encode())}


def test_a_bind_of_the_engines_socket_is_refused_saying_how_to_be_let_through():
    got = judge(create(f"{SOCK}:/var/run/docker.sock"))
    assert isinstance(got, decide.Deny)
    assert SOCK in got.msg and "Engine's API socket" in got.msg
    assert "policy.engine_socket_binds" in got.msg and "--context gpu-alloc" in got.msg


def test_a_create_the_shim_marked_for_an_owner_the_policy_names_binds_the_socket():
    spec = create(f"{SOCK}:/var/run/docker.sock", owner="alice")
    assert judge(spec, marked(spec)) == decide.ALLOW


def test_the_owner_label_without_the_shims_mark_is_refused_as_forged():
    spec = create(f"{SOCK}:/s", owner="alice")
    got = judge(spec)
    assert isinstance(got, decide.Deny) and binds.LABEL in got.msg and got.field == "Config.Labels"
    plain = create("/srv/data:/data", owner="alice")  # forged even where nothing is bound
    assert isinstance(judge(plain), decide.Deny)


@pytest.mark.parametrize(
    "replay",
    [
        "another body",  # a mark copied onto a create that binds more
        "another name",  # the same body under another URI
        "another key",  # a mark made without this host's key
        "another owner",  # alice's mark with the label turned to bob's
    ],
)
def test_a_mark_is_good_for_its_own_key_uri_and_body_alone(replay):
    spec = create(f"{SOCK}:/s", owner="alice")
    headers, uri = marked(spec), URI
    if replay == "another body":
        spec = create(f"{SOCK}:/s", "/dev:/dev", owner="alice")
    elif replay == "another name":
        uri = "/v1.41/containers/create?name=other"
    elif replay == "another key":
        headers = marked(spec, key=b"x" * 32)
    else:
        spec = create(f"{SOCK}:/s", owner="bob")
    assert isinstance(judge(spec, headers, uri), decide.Deny)


def test_an_owner_the_policy_does_not_name_is_refused_though_marked():
    spec = create(f"{SOCK}:/s", owner="bob")
    got = judge(spec, marked(spec))
    assert isinstance(got, decide.Deny) and "policy.engine_socket_binds" in got.msg


@pytest.mark.parametrize(
    "source",
    [
        "/var/run",  # the directory that holds the socket reaches what else it holds
        "/run/docker/inner.sock",  # a socket inside dockerd's own directory reaches it too
        "/dev/nvidia0",  # the exemption is for the socket alone
    ],
)
def test_only_the_socket_itself_is_let_through(source):
    spec = create(f"{source}:/s", owner="alice")
    assert isinstance(judge(spec, marked(spec)), decide.Deny)


def test_a_start_is_judged_by_the_owner_gpu_alloc_recorded_never_by_a_label():
    inspect = {
        "Config": {"Env": [], "Labels": {binds.LABEL: "alice"}},  # an image can set it
        "HostConfig": {"Binds": [f"{SOCK}:/s"]},
    }
    host, gpus = BinderHost(), Inventory(())
    held = access.of_container(inspect, EngineView(), gpus, host)
    assert not held.none and "Engine's API socket" in held.grants[0].detail
    assert access.of_container(inspect, EngineView(), gpus, host, owner="alice").none
    assert not access.of_container(inspect, EngineView(), gpus, host, owner="bob").none


def service_spec(owner: str) -> dict:
    mounts = [{"Type": "bind", "Source": SOCK, "Target": "/var/run/docker.sock"}]
    pins = ["NVIDIA_VISIBLE_DEVICES=void", "DOCKER_RESOURCE_GPU=void"]  # the shim's
    cs = {"Image": "a", "Env": pins, "Mounts": mounts}
    spec = {"Name": "agent", "TaskTemplate": {"ContainerSpec": cs}}
    return {**spec, "Labels": {"io.gpu-alloc.owner": f"1000:{owner}"}} if owner else spec


def judge_service(spec: dict, mark: bool) -> decide.Decision:
    body = json.dumps(spec).encode()
    headers = {service.HEADER: service.mark(KEY, body)} if mark else {}
    facts = decide.Facts(None, EngineView(), BinderHost())
    uri = "/v1.41/services/create"
    route = decide.route_of("POST", uri)
    return decide.authz_request(route, "POST", uri, body, facts,  # type: ignore[arg-type]
                                headers=headers, signing=Signing(KEY))  # fmt: skip


def test_a_service_the_shim_marked_as_a_named_owners_binds_the_socket():
    assert judge_service(service_spec("alice"), mark=True) == decide.ALLOW
    refused = [
        judge_service(service_spec("bob"), mark=True),  # marked, but not a named owner's
        judge_service(service_spec(""), mark=False),  # dockerd's own socket
        judge_service(service_spec("alice"), mark=False),  # a label copied, no mark
    ]
    for got in refused:
        assert isinstance(got, decide.Deny) and "API socket" in got.msg, got


def test_binders_are_named_users_and_members_of_named_groups():
    named = Binders(users=("alice",), groups=("ops",))
    assert named.allow("alice", ()) and named.allow("carol", ("staff", "ops"))
    assert not named.allow("bob", ("staff",)) and not named.allow("", ("ops",))
    assert not Binders() and named


def test_the_host_asks_nss_for_a_binders_groups():
    assert Host(binders=Binders(groups=("root",))).may_bind_engine("root")
    assert not Host(binders=Binders(groups=("root",))).may_bind_engine("no-such-user-ga34b")
    assert not Host().may_bind_engine("root")  # nobody named: nobody may


def test_the_policy_key_names_users_and_groups():
    cfg = config.parse("policy:\n  engine_socket_binds: {users: [ci], groups: [ops]}\n", "/c")
    assert cfg.policy.rules.engine_socket_binds == Binders(("ci",), ("ops",))
    assert config.parse("", "/c").policy.rules.engine_socket_binds == Binders()


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("engine_socket_binds: [ci]", "policy.engine_socket_binds"),
        ("engine_socket_binds: {users: ci}", "policy.engine_socket_binds.users"),
        ("engine_socket_binds: {groups: [1]}", "policy.engine_socket_binds.groups"),
        ("engine_socket_binds: {owners: [ci]}", "policy.engine_socket_binds.owners"),
    ],
)
def test_a_bad_policy_key_is_refused_by_name(text, key):
    with pytest.raises(config.ConfigError) as info:
        config.parse(f"policy:\n  {text}\n", "/c")
    assert key in str(info.value)


def test_adoption_judges_a_socket_bind_by_the_owner_gpu_alloc_recorded(tmp_path):
    """At the shim's start, a container binding the socket is adopted as holding every GPU
    unless gpu-alloc recorded a named owner for it: its creator, or its service's."""
    cfg = {"state_dir": str(tmp_path / "state"),
           "gpus": str(sim.write_sim_gpus(tmp_path / "gpus.yaml", 2)),
           "engine": {"socket": str(tmp_path / "none.sock")},
           "policy": {"engine_socket_binds": {"users": ["alice"]}}}  # fmt: skip
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    fake = FakeEngine()
    alloc = Allocator(config.load(str(tmp_path / "config.yaml")), fake, Host())  # type: ignore[arg-type]
    sid = fake.add_service({"Name": "agent", "Labels": {"io.gpu-alloc.owner": "1000:alice"}})
    made = {
        "mine": fake.add("mine"),
        "task": fake.add("task", labels_={"com.docker.swarm.service.id": sid}),
        "theirs": fake.add("theirs"),
    }
    for cid in made.values():
        fake.by_id[cid]["HostConfig"]["Binds"] = [f"{SOCK}:/var/run/docker.sock"]
    Creators(cfg["state_dir"]).record(made["mine"], 1000, "alice")
    assert alloc.reconciler.reconcile(adopt=True).adopted == [made["theirs"]]
