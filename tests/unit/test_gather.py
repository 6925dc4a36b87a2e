"""Gatherer.decide and at_hand: a verdict gets the facts at hand, and the facts read only
when it asked for one not at hand."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from allocator.core.access.facts import HOST_FILES, Need, NotAsked
from allocator.core.judging import verdicts as decide
from allocator.core.judging.ask import Ask
from allocator.core.judging.decisions import Fact, Unread
from allocator.host import config as configmod
from allocator.host.filesystem import Host
from allocator.service.gather import STRICT_ENV
from allocator.service.wiring import Allocator
from tests.support import engine as sim
from tests.support.enforcement_cases import body, request
from tests.support.fake_engine import FakeEngine, allocator_on

GPU_CREATE = json.loads(body(HostConfig={"DeviceRequests": [request(1)]}))
BIND_CREATE = json.loads(body(HostConfig={"Binds": ["/srv/data:/data"]}))


@pytest.fixture
def alloc(tmp_path: Path) -> Allocator:
    return allocator_on(tmp_path)


def verdict_on(spec: dict, seen: list[decide.Facts]):
    def verdict(facts: decide.Facts) -> Ask | decide.Deny:
        seen.append(facts)
        return decide.shim_ask(spec, facts)

    return verdict


def test_nothing_is_at_hand_before_the_engine_was_asked(alloc: Allocator) -> None:
    assert alloc.gather.at_hand(verdict_on(GPU_CREATE, [])) == Need("the Engine's view")


def test_a_gpu_create_is_decided_once_on_the_facts_at_hand(alloc: Allocator) -> None:
    alloc.gather.facts()  # the Engine's view and the inventory, as the first calls leave them
    seen: list[decide.Facts] = []
    got = alloc.gather.decide(verdict_on(GPU_CREATE, seen))
    assert isinstance(got, Ask) and got.count == 1
    assert len(seen) == 1 and isinstance(seen[0].host, NotAsked)  # the host never asked


def test_a_create_that_needs_the_host_is_decided_again_on_the_facts_read(
    alloc: Allocator,
) -> None:
    alloc.gather.facts()
    seen: list[decide.Facts] = []
    assert alloc.gather.at_hand(verdict_on(BIND_CREATE, seen)) == Need(HOST_FILES)
    got = alloc.gather.decide(verdict_on(BIND_CREATE, seen))
    assert isinstance(got, Ask | decide.Deny)  # judged on the host as read, found or not
    assert len(seen) == 3 and isinstance(seen[-1].host, Host)


def test_a_verdict_that_reads_no_fact_reads_none(
    alloc: Allocator, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom() -> None:
        raise AssertionError("a fact was read")

    monkeypatch.setattr(alloc.gather, "facts", boom)
    monkeypatch.setattr(alloc.gather, "inventory", boom)
    route = decide.route_of("POST", "/v1.41/containers/job/start")
    assert not isinstance(route, decide.Deny)
    uri = "/v1.41/containers/job/start"
    got = alloc.gather.decide(
        lambda facts: decide.authz_request(route, "POST", uri, None, facts),
        decide.reads_facts(route),
    )
    assert got == decide.StartCheck("job")


@pytest.mark.parametrize("kind", ["gpu", "nvidia_gpu"])
def test_a_service_is_judged_on_the_facts_read_like_any_other_fact(tmp_path: Path, kind) -> None:
    """swarm.kind is a fact as the Engine's view is: a service spec pinned for the
    configured kind passes, whatever the kind (it was judged on unread facts, kind gpu)."""
    from allocator.core.judging import services

    cfg = {"state_dir": str(tmp_path / "state"),
           "gpus": str(sim.write_sim_gpus(tmp_path / "gpus.yaml", 2)),
           "engine": {"socket": str(tmp_path / "none.sock")},
           # trusted: a service made on dockerd's socket is judged, not refused unmarked
           "swarm": {"kind": kind, "engine_socket_services": "trusted"}}  # fmt: skip
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    alloc = Allocator(configmod.load(str(tmp_path / "config.yaml")), FakeEngine())  # type: ignore[arg-type]
    task = {"ContainerSpec": {"Image": "busybox"},
            "Resources": {"Reservations": {"GenericResources": [
                {"DiscreteResourceSpec": {"Kind": kind, "Value": 1}}]}}}  # fmt: skip
    spec = services.pin({"Name": "train", "TaskTemplate": task}, kind)
    uri = "/v1.41/services/create"
    route = decide.route_of("POST", uri)
    assert not isinstance(route, decide.Deny) and decide.reads_facts(route)
    body, signing = json.dumps(spec).encode(), alloc.lookups.service_signing()
    got = alloc.gather.decide(
        lambda facts: decide.authz_request(route, "POST", uri, body, facts, signing=signing),
        decide.reads_facts(route),
    )
    assert got == decide.ALLOW, got


@pytest.mark.parametrize("declared", [frozenset(), frozenset({Fact.ENGINE})])
def test_a_verdict_that_reads_a_fact_it_does_not_declare_fails_in_the_tests(
    alloc: Allocator, declared: frozenset[Fact]
) -> None:
    with pytest.raises(Unread, match="swarm_kind"):
        alloc.gather.decide(lambda facts: facts.swarm_kind, declared)


@pytest.mark.parametrize("declared", [frozenset(), frozenset({Fact.ENGINE})])
def test_a_running_service_judges_such_a_verdict_again_on_every_fact(
    alloc: Allocator,
    declared: frozenset[Fact],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Never a default: the kind configured, read on the facts gathered in full."""
    monkeypatch.delenv(STRICT_ENV)
    config = alloc.gather.config
    monkeypatch.setattr(
        alloc.gather, "config", replace(config, swarm=replace(config.swarm, kind="nvidia_gpu"))
    )
    assert alloc.gather.decide(lambda facts: facts.swarm_kind, declared) == "nvidia_gpu"
    assert "a verdict read swarm_kind, a fact not gathered for it" in caplog.text


def test_a_verdict_gets_only_the_facts_it_declares(alloc: Allocator) -> None:
    seen: list[decide.Facts] = []
    alloc.gather.decide(lambda facts: seen.append(facts), frozenset({Fact.ENGINE}))
    assert seen[0].gathered == {Fact.ENGINE}


def test_every_decision_gets_its_facts_through_the_driver() -> None:
    """Creates, starts, updates, services, reconcile and explain: `Gatherer.decide` is the
    one way to facts, so each verdict gets only those it declares."""
    root = Path(__file__).resolve().parents[2]
    callers = [
        str(path.relative_to(root))
        for package in ("allocator", "plugin", "shim")
        for path in (root / package).rglob("*.py")
        if path.name != "gather.py" and re.search(r"\.facts\(\)", path.read_text())
    ]
    assert callers == []


def test_a_state_dir_given_through_a_link_is_protected_where_it_leads(tmp_path: Path) -> None:
    """``/var/run`` is ``/run`` on Debian: a bind of the link's target reaches the ledger."""
    real, link = tmp_path / "real", tmp_path / "link"
    real.mkdir()
    link.symlink_to(real)
    cfg = {"state_dir": str(link / "state"), "mps": {"dir": str(link / "mps")},
           "gpus": str(sim.write_sim_gpus(tmp_path / "gpus.yaml", 1))}  # fmt: skip
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    alloc = Allocator(configmod.load(str(tmp_path / "config.yaml")), None, Host())
    host = alloc.gather.facts().host
    assert {str(link / "state"), str(real / "state")} <= set(host.protected)
    assert isinstance(host, Host) and host.mps_dir == str(real / "mps")
    bind = json.loads(body(HostConfig={"Binds": [f"{real}/state:/st"]}))
    got = alloc.gather.decide(lambda facts: decide.shim_ask(bind, facts))
    assert isinstance(got, decide.Deny) and f"exposes {real}/state" in got.msg


def test_an_engine_socket_named_through_a_link_is_known_where_it_leads(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "var-run").symlink_to(tmp_path / "run")
    host = Host().with_engine_sockets(str(tmp_path / "var-run/docker.sock")).with_resolved()
    assert str(tmp_path / "run/docker.sock") in host.engine_sockets
    assert str(tmp_path / "run/docker.sock") in host.protected
