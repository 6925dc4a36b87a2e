"""What a build can reach on each Engine (allocator/core/access/builds.py), and the plugin's
answer to BuildKit's upgrades and to copies into a container (route_checks)."""

from __future__ import annotations

import json

import pytest

from allocator.core.access import builds
from allocator.core.access.builds import Builder, open_doors
from allocator.core.access.facts import EngineView
from allocator.core.api.routes import Check, classify, needs_check
from allocator.core.judging.decisions import ALLOW, Deny, Facts
from allocator.core.judging.route_checks import CHECKS
from allocator.core.judging.verdicts import reads_facts
from allocator.core.machine.inventory import Inventory
from tests.support.table_host import TableHost

CLOSED = Builder.from_daemon_json(builds.CLOSED)


@pytest.mark.parametrize(
    ("version", "builder", "opened"),
    [
        ((20, 10, 24), builds.UNSET, False),
        ((26, 1, 5), builds.UNSET, False),
        ((28, 5, 2), builds.UNSET, False),
        ((29, 0, 0), builds.UNSET, True),
        ((29, 7, 2), builds.UNSET, True),
        ((29, 7, 2), CLOSED, False),
        ((29, 7, 2), Builder(device=True), True),
        ((28, 5, 2), Builder(security_insecure=True), True),
        ((20, 10, 24), Builder().with_flags(["security.insecure"]), True),
        ((29, 7, 2), Builder(device=False).with_flags(["network.host"]), False),
        (None, builds.UNSET, False),  # not known: judged as the oldest, as everywhere
    ],
)
def test_a_build_reaches_gpus_by_the_device_entitlement_on_29_or_an_insecure_one_anywhere(
    version: tuple[int, int, int] | None, builder: Builder, opened: bool
) -> None:
    assert bool(open_doors(version, builder)) is opened


def test_daemon_json_builder_keys_are_read_as_go_decodes_them() -> None:
    def read(text: str) -> Builder:
        return Builder.from_daemon_json(json.loads(text))

    assert read('{"builder":{"entitlements":{"device":false}}}').device is False
    assert read('{"builder":{"Entitlements":{"DEVICE":false}}}').device is False
    assert read('{"builder":{"entitlements":{"device":"false"}}}').device is None
    assert read('{"builder":{"gc":{"enabled":true}}}') == builds.UNSET
    assert read('{"Builder":{"entitlements":{"device":false}}}').device is None
    assert read("{}") == builds.UNSET
    # The last key that folds to the field wins, as in Go.
    repeated = json.loads('{"builder":{"entitlements":{"device":false}}}')
    repeated["builder"]["entitlements"]["Device"] = True
    assert Builder.from_daemon_json(repeated).device is True
    insecure = read('{"builder":{"entitlements":{"security-insecure":true}}}')
    assert insecure.security_insecure is True and open_doors((20, 10, 24), insecure)


def test_native_grpc_is_spoken_from_29_2() -> None:
    assert not builds.native_grpc((29, 1, 9))
    assert builds.native_grpc((29, 2, 0))
    assert not builds.native_grpc(None)


def _facts(version: tuple[int, int, int] | None, builder: Builder = builds.UNSET) -> Facts:
    return Facts(Inventory(()), EngineView(version=version, builder=builder), TableHost())


def _judge(method: str, uri: str, facts: Facts) -> object:
    route = classify(method, uri)
    assert reads_facts(route)
    return CHECKS[route.check](route, method, uri, None, facts)


@pytest.mark.parametrize("path", ["/grpc", "/v1.51/grpc", "/session", "/v1.44/session"])
def test_buildkit_upgrades_are_refused_while_a_build_could_be_given_gpus(path: str) -> None:
    refused = _judge("POST", path, _facts((29, 7, 2)))
    assert isinstance(refused, Deny)
    assert "builder.entitlements.device" in refused.msg and "DOCKER_BUILDKIT=0" in refused.msg
    assert _judge("POST", path, _facts((29, 7, 2), CLOSED)) is ALLOW
    assert _judge("POST", path, _facts((28, 5, 2))) is ALLOW
    insecure = _judge("POST", path, _facts((28, 5, 2), Builder(security_insecure=True)))
    assert isinstance(insecure, Deny) and "security.insecure" in insecure.msg


def test_the_shim_splices_what_the_plugin_alone_judges() -> None:
    """An upgrade and a tar stream of any size are never collected by the shim."""
    assert classify("POST", "/grpc").check is Check.BUILDKIT
    assert classify("PUT", "/v1.41/containers/x/archive?path=/").check is Check.ARCHIVE
    assert not needs_check("POST", "/v1.41/grpc")
    assert not needs_check("POST", "/session")
    assert not needs_check("PUT", "/v1.41/containers/x/archive?path=/")


@pytest.mark.parametrize(
    ("version", "refused"),
    [
        ((20, 10, 24), False),
        ((28, 5, 2), False),
        ((29, 0, 0), True),
        ((29, 5, 0), True),
        ((29, 5, 1), False),
        ((29, 7, 2), False),
        (None, False),
    ],
)
def test_a_copy_into_a_container_is_refused_where_cve_2026_41567_applies(
    version: tuple[int, int, int] | None, refused: bool
) -> None:
    got = _judge("PUT", "/v1.41/containers/job/archive?path=/tmp", _facts(version))
    assert isinstance(got, Deny) is refused
    if isinstance(got, Deny):
        assert "CVE-2026-41567" in got.msg and "29.5.1" in got.msg
