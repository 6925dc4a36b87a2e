"""core.facts: a host not asked answers as an empty one, and says what a verdict asked of it."""

from __future__ import annotations

import json

from allocator.core import verdicts as decide
from allocator.core.ask import Ask
from allocator.core.facts import CONTAINER_MOUNTS, HOST_FILES, VOLUME_OPTIONS, EngineView, NotAsked
from allocator.core.inventory import Inventory
from tests.support.enforcement_cases import body, request


def at_hand(protected: tuple[str, ...] = ()) -> decide.Facts:
    """Facts as an event loop holds them: the host and the Engine's lookups not asked."""
    unasked = NotAsked(protected)
    return decide.Facts(
        Inventory(()), EngineView(), unasked, unasked.mounts_of, "", unasked.volume_of
    )


def spec(**fields: object) -> dict:
    return json.loads(body(**fields))


def test_a_gpu_create_is_decided_on_the_facts_at_hand() -> None:
    facts = at_hand()
    got = decide.shim_ask(spec(HostConfig={"DeviceRequests": [request(1)]}), facts)
    assert isinstance(got, Ask) and got.count == 1
    assert facts.needs == ""


def test_a_bind_needs_the_hosts_filesystem() -> None:
    facts = at_hand()
    decide.shim_ask(spec(HostConfig={"Binds": ["/srv/data:/data"]}), facts)
    assert facts.needs == HOST_FILES


def test_a_named_volume_needs_its_options_and_volumes_from_anothers_mounts() -> None:
    facts = at_hand()
    decide.shim_ask(spec(HostConfig={"Binds": ["scratch:/scratch"]}), facts)
    assert facts.needs == VOLUME_OPTIONS
    facts = at_hand()
    decide.shim_ask(spec(HostConfig={"VolumesFrom": ["other"]}), facts)
    assert facts.needs == CONTAINER_MOUNTS


def test_the_first_fact_asked_is_the_one_named() -> None:
    unasked = NotAsked(())
    assert unasked.node("/dev/nvidia0") is None
    assert unasked.volume_of("scratch") is None
    assert unasked.needs == HOST_FILES


def test_routes_that_read_no_fact_are_decided_on_unread_facts() -> None:
    facts = decide.unread()
    route = decide.route_of("POST", "/v1.41/containers/job/start")
    assert not isinstance(route, decide.Deny) and not decide.reads_facts(route)
    got = decide.authz_request(route, "POST", "/v1.41/containers/job/start", None, facts)
    assert isinstance(got, decide.StartCheck) and facts.needs == ""
    create = decide.route_of("POST", "/v1.41/containers/create")
    assert not isinstance(create, decide.Deny) and decide.reads_facts(create)
