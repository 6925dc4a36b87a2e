"""Exec and copies into an owned container (allocator/core/access/owned.py): what makes a
container owned, who may use its doors, and the shim's mark that says who asks."""

from __future__ import annotations

import json

import pytest

from allocator.core.access import owned, socket_binds
from allocator.core.access.grants import Access, Grant
from allocator.core.judging import verdicts as decide
from allocator.core.judging.service_marks import Signing
from tests.unit.test_verdicts import FACTS

KEY = b"k" * 32
EXEC_URI = "/v1.41/containers/dind/exec"
PRIVILEGED = Grant("HostConfig.Privileged", "privileged mode opens every device", None)
CLOCK = Grant("HostConfig.CapAdd", "SYS_TIME sets the host's clock", None, power=True)
SOCKET = Grant("HostConfig.Binds[0]", socket_binds.bind_refusal("/s", "/run/docker.sock"), None)
GPU = Grant("HostConfig.DeviceCgroupRules[0]", "c 195:* rwm", None)


def test_a_container_is_owned_by_privileged_mode_a_power_or_the_engines_socket():
    assert owned.held(Access((PRIVILEGED, CLOCK, SOCKET))) == (
        "HostConfig.Privileged", "HostConfig.CapAdd", "HostConfig.Binds[0]",
    )  # fmt: skip
    assert owned.held(Access((GPU,))) == () and owned.held(Access()) == ()


def test_its_doors_are_its_owners_and_roots_alone():
    fields = ("HostConfig.Privileged",)
    for asker in ("ci", "root"):
        assert owned.refusal(owned.DoorCheck("dind", owned.EXEC, asker), fields, "ci") is None
    for asker in ("eve", "", "unknown"):
        why = owned.refusal(owned.DoorCheck("dind", owned.EXEC, asker), fields, "ci")
        assert why is not None and why.startswith("gpu-alloc refused to exec into dind")
        assert "grants ci alone (HostConfig.Privileged)" in why and "gpu-alloc context" in why
    nobodys = owned.refusal(owned.DoorCheck("x", owned.EXEC, "unknown"), fields, "unknown")
    assert nobodys is not None  # an asker the shim could not name is nobody's owner
    assert owned.refusal(owned.DoorCheck("box", owned.EXEC, "eve"), (), "ci") is None


def test_a_copy_into_an_owned_container_is_refused_to_all_with_the_way_to_write_a_file():
    for asker in ("ci", "root", ""):
        why = owned.refusal(owned.DoorCheck("dind", owned.COPY, asker), ("X",), "ci")
        assert why is not None and why.startswith("gpu-alloc refused to copy files into dind")
        assert "docker exec -i dind sh -c 'cat > PATH' < FILE" in why
    assert owned.refusal(owned.DoorCheck("box", owned.COPY, ""), (), "ci") is None


def test_the_mark_names_the_asker_for_this_method_and_uri_alone():
    headers = {owned.HEADER: owned.mark(KEY, "POST", EXEC_URI, "ci")}
    assert owned.asker(headers, KEY, "POST", EXEC_URI) == "ci"
    assert owned.asker(headers, KEY, "POST", "/v1.41/containers/other/exec") == ""
    assert owned.asker(headers, b"x" * 32, "POST", EXEC_URI) == ""  # another key: forged
    forged = {owned.HEADER: "root " + owned.mark(KEY, "POST", EXEC_URI, "ci").split()[1]}
    assert owned.asker(forged, KEY, "POST", EXEC_URI) == ""
    assert (
        owned.asker({}, KEY, "POST", EXEC_URI) == ""
        and owned.asker(headers, b"", "POST", EXEC_URI) == ""
    )


def test_an_exec_is_settled_on_its_container_with_the_asker_the_mark_names():
    route = decide.route_of("POST", EXEC_URI)
    assert not isinstance(route, decide.Deny)
    body = json.dumps({"Cmd": ["sh"]}).encode()
    headers = {owned.HEADER: owned.mark(KEY, "POST", EXEC_URI, "ci")}
    got = decide.authz_request(route, "POST", EXEC_URI, body, FACTS, headers, Signing(KEY))
    assert got == owned.DoorCheck("dind", owned.EXEC, "ci")
    privileged = json.dumps({"Cmd": ["sh"], "Privileged": True}).encode()
    assert isinstance(decide.authz_request(route, "POST", EXEC_URI, privileged, FACTS), decide.Deny)


ATTACHES = {
    "docker attach": ("POST", "/v1.43/containers/dind/attach?stream=1&stdin=1&stdout=1", {}),
    "stdin spelt as Go reads true": ("POST", "/containers/dind/attach?stdin=%20On%20", {}),
    "a second stdin: any true value counts": (
        "POST",
        "/containers/dind/attach?stdin=0&stdin=1",
        {},
    ),
    "a form body may set stdin": (
        "POST",
        "/containers/dind/attach?stdin=0",
        {"Content-Type": "application/x-www-form-urlencoded"},
    ),
    "a multipart body may too": (
        "POST",
        "/containers/dind/attach",
        {"content-type": "Multipart/Form-Data; boundary=x"},
    ),
    "a websocket before API 1.42 always feeds stdin": (
        "GET",
        "/v1.41/containers/dind/attach/ws?stdin=0",
        {},
    ),
    "a websocket with no version may be served at 1.41": (
        "GET",
        "/containers/dind/attach/ws?stdin=0",
        {},
    ),
    "a websocket from 1.42 reads stdin": ("GET", "/v1.42/containers/dind/attach/ws?stdin=1", {}),
    "\\x1c is no space to Go: the value reads true": (
        "POST",
        "/containers/dind/attach?stdin=%1C0",
        {},
    ),
}
READERS = {
    "docker attach --no-stdin": ("POST", "/containers/dind/attach?stream=1&stdout=1&stderr=1", {}),
    "stdin off, as Go spells false": ("POST", "/containers/dind/attach?stdin=+NONE%09", {}),
    "a JSON body sets no form value": (
        "POST",
        "/containers/dind/attach?stdin=no",
        {"Content-Type": "application/json"},
    ),
    "a websocket from 1.42 without stdin": ("GET", "/v1.44/containers/dind/attach/ws?stdout=1", {}),
}


@pytest.mark.parametrize(("method", "uri", "headers"), ATTACHES.values(), ids=ATTACHES.keys())
def test_an_attach_that_may_feed_stdin_is_settled_on_its_container(method, uri, headers):
    route = decide.route_of(method, uri)
    assert not isinstance(route, decide.Deny)
    got = decide.authz_request(route, method, uri, b"", FACTS, headers, Signing(KEY))
    assert got == owned.DoorCheck("dind", owned.ATTACH, "")


@pytest.mark.parametrize(("method", "uri", "headers"), READERS.values(), ids=READERS.keys())
def test_an_attach_that_only_reads_output_is_anyones(method, uri, headers):
    route = decide.route_of(method, uri)
    assert not isinstance(route, decide.Deny)
    assert decide.authz_request(route, method, uri, b"", FACTS, headers) == decide.ALLOW


def test_an_execs_start_is_settled_on_the_exec_it_names():
    uri = "/v1.41/exec/" + "e" * 64 + "/start"
    route = decide.route_of("POST", uri)
    assert not isinstance(route, decide.Deny)
    headers = {owned.HEADER: owned.mark(KEY, "POST", uri, "ci")}
    got = decide.authz_request(route, "POST", uri, b"{}", FACTS, headers, Signing(KEY))
    assert got == owned.DoorCheck("e" * 64, owned.EXEC_START, "ci")


def test_a_call_that_names_no_container_is_told_to_check_the_name():
    why = owned.unnamed(owned.DoorCheck("vv1", owned.ATTACH, "eve"))
    assert why.startswith("gpu-alloc refused to attach to the input of vv1: no container is vv1")
    assert why.endswith("Check the name (docker ps -a); if it was just renamed, try again")


def test_a_rename_is_settled_on_its_container_with_the_asker_the_mark_names():
    uri = "/v1.41/containers/dind/rename?name=x"
    route = decide.route_of("POST", uri)
    assert not isinstance(route, decide.Deny)
    headers = {owned.HEADER: owned.mark(KEY, "POST", uri, "ci")}
    got = decide.authz_request(route, "POST", uri, b"", FACTS, headers, Signing(KEY))
    assert got == owned.DoorCheck("dind", owned.RENAME, "ci")
