"""core.access.facts: a host not asked answers as an empty one, and says what a verdict asked of
it."""

from __future__ import annotations

import json

import pytest

from allocator.core.access.facts import (
    HOST_FILES,
    OTHER_CONTAINER,
    VOLUME_OPTIONS,
    EngineView,
    NotAsked,
)
from allocator.core.judging import verdicts as decide
from allocator.core.judging.ask import Ask
from allocator.core.machine.inventory import Inventory
from tests.support.enforcement_cases import body, request


def at_hand(protected: tuple[str, ...] = ()) -> decide.Facts:
    """Facts as an event loop holds them: the host and the Engine's lookups not asked."""
    unasked = NotAsked(protected)
    return decide.Facts(
        Inventory(()), EngineView(), unasked, unasked.container_of, "", unasked.volume_of
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
    assert facts.needs == OTHER_CONTAINER


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


@pytest.mark.parametrize(
    ("text", "version"),
    [("20.10.24+dfsg1", (20, 10, 24)), ("28.5.2", (28, 5, 2)), ("27.3.0-rc.1", (27, 3, 0)),
     ("dev", None), ("", None), ("1.2", None)],
)  # fmt: skip
def test_the_engine_version_is_read_from_what_the_engine_says(text, version):
    assert EngineView.from_info({}, {"Version": text}).version == version


def test_the_engine_view_names_the_authorization_plugins_dockerd_consults():
    info = {"DefaultRuntime": "runc", "Plugins": {"Authorization": ["gpu-alloc"]}}
    assert EngineView.from_info(info).authz_plugins == ("gpu-alloc",)
    assert EngineView.from_info({"Plugins": {"Authorization": None}}).authz_plugins == ()


def test_a_runtime_is_nvidias_by_its_name_or_its_binary_and_the_default_counts() -> None:
    info = {
        "DefaultRuntime": "crun",
        "Runtimes": {"runc": {}, "gpu": {"path": "/usr/bin/nvidia-container-runtime"}},
    }
    view = EngineView.from_info(info)
    assert view.nvidia_runtimes == {"gpu"}
    assert view.is_nvidia("gpu") and not view.is_nvidia("runc") and not view.default_is_nvidia
    assert EngineView.from_info({"DefaultRuntime": "nvidia"}).default_is_nvidia


def test_a_daemon_json_edit_counts_before_dockerd_reloads_it() -> None:
    running = EngineView.from_info({"Plugins": {"Authorization": ["gpu-alloc"]}})
    edited = EngineView.from_daemon_json(
        {"default-runtime": "nvidia", "authorization-plugins": ["gpu-alloc", "other"]}
    )
    judged = running.with_pending(edited)
    assert judged.default_is_nvidia
    assert judged.authz_chain == ("gpu-alloc", "other")
    assert running.with_pending(EngineView()).default_runtime == "runc"


def test_count_zero_is_void_only_on_engines_that_pin_it_themselves() -> None:
    assert not EngineView(version=(27, 2, 9)).count_zero_is_void
    assert EngineView(version=(27, 3, 0)).count_zero_is_void
    assert not EngineView().count_zero_is_void  # unknown: judged as the oldest
