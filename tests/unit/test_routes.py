"""allocator.routes: classify a request target the way dockerd's router reads it."""

import re

import pytest

from allocator.core.api import routes
from allocator.core.api.routes import (
    Check,
    Route,
    RouteError,
    api_version,
    classify,
    needs_check,
    spliced_door,
)

NAME = "a/b"  # names may hold slashes: routes are told apart by their fixed suffix
WRITE_METHODS = ("POST", "PUT", "DELETE")


def examples(pattern: str) -> list[str]:
    """Every concrete path a table pattern names, with NAME for {name}."""
    pattern = pattern.replace("(?P<name>.*)", NAME).replace("(?P<checkpoint>[^/]*)", "cp1")
    group = re.search(r"\(\?:([^()]*)\)(\??)", pattern)
    if group is None:
        assert not set(pattern) & set("()[]?*+|\\"), f"expand {pattern!r} in examples()"
        return [pattern]
    options = group[1].split("|") + ([""] if group[2] else [])
    head, tail = pattern[: group.start()], pattern[group.end() :]
    return [path for option in options for path in examples(head + option + tail)]


WRITE_CASES = [
    pytest.param(method, path, check, "<name>" in pattern, id=f"{method} {path}")
    for method, pattern, check in routes._WRITES
    for path in examples(pattern)
]


def test_the_example_expansion_covers_each_alternative() -> None:
    assert examples("/images/(?:create|load|prune)") == [
        "/images/create",
        "/images/load",
        "/images/prune",
    ]
    assert examples("/build(?:/prune|/cancel)?") == ["/build/prune", "/build/cancel", "/build"]
    assert len(WRITE_CASES) > len(routes._WRITES)


def test_the_table_holds_only_write_methods() -> None:
    assert {method for method, _, _ in routes._WRITES} == set(WRITE_METHODS)


# --- every row of the table --------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path", "check", "named"), WRITE_CASES)
def test_every_write_route_is_classified_as_its_check(
    method: str, path: str, check: Check, named: bool
) -> None:
    assert classify(method, path) == Route(check, path, None, NAME if named else "")


@pytest.mark.parametrize(("method", "path", "check", "named"), WRITE_CASES)
def test_every_write_route_keeps_its_check_behind_a_version_prefix_and_a_query(
    method: str, path: str, check: Check, named: bool
) -> None:
    route = classify(method, f"/v1.41{path}?force=1&name=x%2Fy")
    assert (route.check, route.path, route.version) == (check, path, (1, 41))


@pytest.mark.parametrize(("method", "path", "check", "named"), WRITE_CASES)
def test_every_write_route_is_harmless_to_read(
    method: str, path: str, check: Check, named: bool
) -> None:
    for read in ("GET", "HEAD"):
        assert classify(read, f"/v1.41{path}") == Route(Check.ALLOW, path, (1, 41))


# --- how the target is read --------------------------------------------------------------------

CLASSIFIED = {
    "plain create": ("POST", "/containers/create", Check.CREATE, None, ""),
    "create on API 1.41": ("POST", "/v1.41/containers/create", Check.CREATE, (1, 41), ""),
    "create on API 1.24": ("POST", "/v1.24/containers/create", Check.CREATE, (1, 24), ""),
    "create with a query": ("POST", "/containers/create?name=web", Check.CREATE, None, ""),
    "a query that looks like a route": (
        "POST",
        "/v1.41/containers/create?x=/start",
        Check.CREATE,
        (1, 41),
        "",
    ),
    "an invalid escape in the query is not the router's business": (
        "POST",
        "/containers/create?name=%zz",
        Check.CREATE,
        None,
        "",
    ),
    "encoded slash": ("POST", "/containers%2Fcreate", Check.CREATE, None, ""),
    "encoded slash, lower case": ("POST", "/v1.41/containers%2fcreate", Check.CREATE, (1, 41), ""),
    "encoded letter": ("POST", "/v1.41/containers/%63reate", Check.CREATE, (1, 41), ""),
    "encoded version prefix": ("POST", "/v1.41%2Fcontainers/create", Check.CREATE, (1, 41), ""),
    "absolute-form target": (
        "POST",
        "http://localhost/v1.41/containers/create",
        Check.CREATE,
        (1, 41),
        "",
    ),
    "absolute-form https with port and query": (
        "POST",
        "https://docker:2376/containers/create?name=x",
        Check.CREATE,
        None,
        "",
    ),
    "name with a slash": ("POST", "/containers/a/b/start", Check.START, None, "a/b"),
    "name with an encoded slash": ("POST", "/containers/a%2Fb/start", Check.START, None, "a/b"),
    "name ending like another route": (
        "POST",
        "/containers/x/exec/start",
        Check.START,
        None,
        "x/exec",
    ),
    "name that is 'create'": ("POST", "/containers/create/start", Check.START, None, "create"),
    "old API start": ("POST", "/v1.19/containers/web/start", Check.START, (1, 19), "web"),
    "harmless write": ("POST", "/v1.41/containers/web/kill?signal=9", Check.ALLOW, (1, 41), "web"),
    "rename": ("POST", "/containers/web/rename?name=db", Check.RENAME, None, "web"),
    "container prune": ("POST", "/v1.41/containers/prune", Check.PRUNE, (1, 41), ""),
    "exec create": ("POST", "/containers/web/exec", Check.EXEC, None, "web"),
    "exec start takes the exec's stream": (
        "POST",
        "/exec/abc/start",
        Check.EXEC_START,
        None,
        "abc",
    ),
    "exec resize is harmless": ("POST", "/exec/abc/resize?h=1&w=2", Check.ALLOW, None, "abc"),
    "attach": ("POST", "/v1.41/containers/web/attach?stdin=1", Check.ATTACH, (1, 41), "web"),
    "websocket attach is the read that is a way in": (
        "GET",
        "/v1.44/containers/web/attach/ws",
        Check.ATTACH,
        (1, 44),
        "web",
    ),
    "websocket attach spelt with an encoded slash": (
        "GET",
        "/containers/web/attach%2Fws",
        Check.ATTACH,
        None,
        "web",
    ),
    "HEAD of a websocket attach: no route serves it": (
        "HEAD",
        "/containers/web/attach/ws",
        Check.ALLOW,
        None,
        "",
    ),
    "update": ("POST", "/containers/web/update", Check.UPDATE, None, "web"),
    "service update": ("POST", "/services/svc/update", Check.SERVICE, None, "svc"),
    "plugin set": (
        "POST",
        "/plugins/vieux/sshfs:latest/set",
        Check.PLUGIN_SET,
        None,
        "vieux/sshfs:latest",
    ),
    "volume create": ("POST", "/volumes/create", Check.VOLUME_CREATE, None, ""),
    "a version with an empty part": (
        "POST",
        "/v1..2/containers/create",
        Check.CREATE,
        (1, 0, 2),
        "",
    ),
    "a one-part version": ("POST", "/v1/containers/create", Check.CREATE, (1,), ""),
    "GET is always allowed": ("GET", "/v1.41/containers/json?all=1", Check.ALLOW, (1, 41), ""),
    "GET of a write path": ("GET", "/containers/create", Check.ALLOW, None, ""),
    "HEAD is always allowed": ("HEAD", "/_ping", Check.ALLOW, None, ""),
    "GET of an unknown path": ("GET", "/containers/x/frobnicate", Check.ALLOW, None, ""),
}


@pytest.mark.parametrize(
    ("method", "target", "check", "version", "name"), CLASSIFIED.values(), ids=CLASSIFIED.keys()
)
def test_classify(
    method: str, target: str, check: Check, version: tuple[int, ...] | None, name: str
) -> None:
    route = classify(method, target)
    assert (route.check, route.version, route.name) == (check, version, name)


def test_the_route_path_is_decoded_without_version_or_query() -> None:
    route = classify("POST", "/v1.41/containers/a%2Fb/start?x=1")
    assert route.path == "/containers/a/b/start"


UNKNOWN = {
    "an unknown container action": ("POST", "/containers/x/frobnicate"),
    "capital C: dockerd routes case-sensitively": ("POST", "/Containers/create"),
    "upper-case action": ("POST", "/containers/x/START"),
    "an empty segment": ("POST", "/containers//create"),
    "a trailing slash": ("POST", "/containers/create/"),
    "a suffix that only starts like a route": ("POST", "/containers/x/startx"),
    "an encoded '?' is part of the path": ("POST", "/v1.41/containers/create%3Fname=x"),
    "the right path with the wrong method": ("PUT", "/containers/create"),
    "an unknown method": ("PATCH", "/containers/x/update"),
    "a delete without a name": ("DELETE", "/containers"),
    "a version prefix that is not one": ("POST", "/v1.41x/containers/create"),
    "nothing after the version": ("POST", "/v1.41"),
    "the root": ("POST", "/"),
    "absolute-form without a path": ("POST", "http://localhost"),
}


@pytest.mark.parametrize(("method", "target"), UNKNOWN.values(), ids=UNKNOWN.keys())
def test_a_write_that_is_not_in_the_table_is_unknown(method: str, target: str) -> None:
    assert classify(method, target).check is Check.UNKNOWN
    assert needs_check(method, target)


INVALID = {
    "non-hex escape": "/containers/%zzcreate",
    "escape cut short at the end": "/containers/create%",
    "escape with one digit": "/containers/create%2",
    "escape with a non-hex second digit": "/v1.41/containers/%6Greate",
    "decodes to invalid UTF-8": "/containers/%ff/start",
    "not an absolute path": "containers/create",
    "asterisk-form": "*",
}


@pytest.mark.parametrize("target", INVALID.values(), ids=INVALID.keys())
@pytest.mark.parametrize("method", ["POST", "GET"])
def test_a_target_dockerd_would_read_differently_is_a_route_error(method: str, target: str) -> None:
    with pytest.raises(RouteError, match=re.escape(target)):
        classify(method, target)


# --- API versions ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("1.41", (1, 41)),
        ("1.24", (1, 24)),
        ("1.9", (1, 9)),
        ("1..2", (1, 0, 2)),
        ("1.41.", (1, 41, 0)),
        (".41", (0, 41)),
        ("1.4a", (1, 0)),
        ("1.041", (1, 41)),
        ("", (0,)),
    ],
)
def test_api_version_reads_like_dockerds_versions_compare(
    text: str, version: tuple[int, ...]
) -> None:
    assert api_version(text) == version


def test_api_versions_compare_numerically_not_as_text() -> None:
    assert api_version("1.9") < api_version("1.24") < api_version("1.41") < api_version("2.0")


# --- the shim's pre-filter ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "target", "expected"),
    [
        ("GET", "/v1.41/containers/json", False),
        ("HEAD", "/_ping", False),
        ("GET", "/containers/%zz/json", False),  # reads pass before any parsing
        ("POST", "/v1.41/containers/web/kill", False),
        ("DELETE", "/containers/web?force=1", False),
        ("POST", "/containers/web/rename?name=db", False),  # the plugin sees to these
        ("POST", "/containers/prune", False),
        ("POST", "/images/create?fromImage=busybox", False),
        ("POST", "/v1.41/containers/create", True),
        ("POST", "/containers%2Fcreate", True),
        ("POST", "/containers/web/start", True),
        ("POST", "/containers/web/update", True),
        ("POST", "/containers/web/exec", True),
        ("POST", "/volumes/create", True),
        ("POST", "/plugins/pull", True),
        ("POST", "/services/create", True),
        ("POST", "/containers/web/frobnicate", True),
        ("POST", "/containers/%zz/start", True),  # unreadable: vetted, never waved through
        ("POST", "/containers/web/attach?stdin=1", False),  # spliced unless owned: below
        ("POST", "/exec/abc/start", False),
    ],
)
def test_needs_check(method: str, target: str, expected: bool) -> None:
    assert needs_check(method, target) is expected


@pytest.mark.parametrize(
    ("method", "target", "expected"),
    [
        ("POST", "/v1.41/containers/web/attach?stream=1&stdin=1", True),
        ("GET", "/containers/web/attach/ws?stdin=1", True),
        ("POST", "/exec/abc/start", True),
        ("POST", "/exec/abc/resize", False),
        ("POST", "/containers/web/rename?name=db", True),  # could move an owned container
        ("POST", "/containers/web/exec", False),  # exec create: needs_check has it
        ("GET", "/containers/web/json", False),
        ("GET", "/containers/%zz/attach/ws", False),  # unreadable: dockerd refuses it too
    ],
)
def test_spliced_doors_are_the_attaches_the_exec_starts_and_the_renames(
    method: str, target: str, expected: bool
) -> None:
    assert spliced_door(method, target) is expected
