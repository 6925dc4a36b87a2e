"""Plugin calls that would change the authorization chain (allocator/core/access/plugins.py).

The real-Engine side is tests/engine/test_plugin_chain_engine.py; these pin how names and
references are read, as moby's distribution/reference and plugin store read them.
"""

from __future__ import annotations

import pytest

from allocator.core.access import plugins
from allocator.core.access.access import EngineView
from allocator.core.access.plugins import PluginCheck, familiar, pull_name, refusal
from allocator.core.judging import verdicts as decide

OWN_ID = "abc123" + "0" * 58
AUTHZ_ID = "abd456" + "1" * 58
VOLUME_ID = "fed789" + "2" * 58


def plugin(name: str, pid: str, kind: str) -> dict:
    return {"Id": pid, "Name": name, "Config": {"Interface": {"Types": [f"docker.{kind}/1.0"]}}}


LISTED = [
    plugin("gpu-alloc:latest", OWN_ID, "authz"),
    plugin("tools/impostor:v2", AUTHZ_ID, "authz"),
    plugin("vieux/sshfs:latest", VOLUME_ID, "volumedriver"),
]


@pytest.mark.parametrize(
    ("ref", "kept_as"),
    [
        ("gpu-alloc", "gpu-alloc:latest"),
        ("gpu-alloc:latest", "gpu-alloc:latest"),
        ("library/gpu-alloc", "gpu-alloc:latest"),
        ("docker.io/gpu-alloc", "gpu-alloc:latest"),
        ("docker.io/library/gpu-alloc:latest", "gpu-alloc:latest"),
        ("index.docker.io/library/gpu-alloc", "gpu-alloc:latest"),
        ("GPU-Alloc", "gpu-alloc:latest"),  # dockerd refuses it; compared without case
        ("gpu-alloc@sha256:" + "0" * 64, "gpu-alloc:latest"),
        ("gpu-alloc:v2", "gpu-alloc:v2"),
        ("vieux/sshfs", "vieux/sshfs:latest"),
        ("localhost:5000/gpu-alloc", "localhost:5000/gpu-alloc:latest"),
        ("registry.example/library/gpu-alloc", "registry.example/library/gpu-alloc:latest"),
    ],
)
def test_a_name_is_kept_as_dockerds_plugin_store_keeps_it(ref, kept_as):
    assert familiar(ref) == kept_as


def test_a_pull_is_named_by_name_else_by_remote():
    assert pull_name("/v1.41/plugins/pull?remote=evil/authz:1&name=gpu-alloc") == "gpu-alloc"
    assert pull_name("/plugins/pull?remote=gpu-alloc%3Alatest") == "gpu-alloc:latest"
    assert pull_name("/plugins/pull?remote=a&name=&name=b") == "a"  # Go's FormValue: the first


def pull(uri: str, chain=("gpu-alloc",)) -> decide.Decision:
    facts = decide.Facts(None, EngineView(authz_plugins=tuple(chain)), host=None)  # type: ignore[arg-type]
    route = decide.route_of("POST", uri)
    return decide.authz_request(route, "POST", uri, b"[]", facts)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "query",
    ["remote=x&name=gpu-alloc", "remote=x&name=gpu-alloc:latest", "remote=gpu-alloc",
     "remote=x&name=docker.io/library/gpu-alloc", "remote=x&name=GPU-ALLOC"],
)  # fmt: skip
def test_a_pull_under_the_authorization_plugins_name_is_refused(query):
    decision = pull(f"/v1.41/plugins/pull?{query}")
    assert isinstance(decision, decide.Deny)
    assert "authorization plugin 'gpu-alloc'" in decision.msg
    assert "--alias OTHER" in decision.msg and "daemon.json" in decision.msg


def test_a_pull_under_another_name_or_tag_is_allowed():
    assert pull("/plugins/pull?remote=x&name=gpu-alloc:v2") == decide.ALLOW
    assert pull("/plugins/pull?remote=vieux/sshfs") == decide.ALLOW
    assert pull("/plugins/pull?remote=gpu-alloc", chain=()) == decide.ALLOW


def test_a_name_daemon_json_gives_dockerd_for_its_next_reload_is_in_the_chain():
    running = EngineView.from_info({"Plugins": {"Authorization": ["gpu-alloc"]}})
    pending = EngineView.from_daemon_json({"authorization-plugins": ["gpu-alloc", "opa"]})
    assert running.with_pending(pending).authz_chain == ("gpu-alloc", "opa")
    assert running.with_pending(pending).authz_plugins == ("gpu-alloc",)  # what runs now


@pytest.mark.parametrize(
    ("method", "path", "action"),
    [("POST", "/plugins/x/enable", "enable"), ("POST", "/plugins/x/disable", "disable"),
     ("DELETE", "/plugins/x", "remove"), ("POST", "/plugins/x/set", "set"),
     ("POST", "/plugins/x/upgrade", "upgrade")],
)  # fmt: skip
def test_plugin_state_calls_are_settled_against_the_managed_plugins(method, path, action):
    facts = decide.Facts(None, EngineView(authz_plugins=("gpu-alloc",)), host=None)  # type: ignore[arg-type]
    route = decide.route_of(method, path)
    decision = decide.authz_request(route, method, path, b"[]", facts)  # type: ignore[arg-type]
    assert decision == PluginCheck("x", action, ("gpu-alloc",))


def test_push_is_still_answered_from_the_table():
    route = decide.route_of("POST", "/plugins/gpu-alloc/push")
    assert decide.cleared(route)  # type: ignore[arg-type]


@pytest.mark.parametrize("ref", ["tools/impostor:v2", "abd4", AUTHZ_ID, "gpu-alloc"])
def test_no_authorization_plugin_is_enabled(ref):
    why = refusal(PluginCheck(ref, "enable", ("gpu-alloc",)), LISTED)
    assert why is not None and "implements docker.authz/1.0" in why


def test_other_plugins_are_enabled():
    assert refusal(PluginCheck("vieux/sshfs", "enable", ("gpu-alloc",)), LISTED) is None
    assert refusal(PluginCheck("nothing-here", "enable", ("gpu-alloc",)), LISTED) is None


@pytest.mark.parametrize("action", ["disable", "remove", "upgrade", "set"])
@pytest.mark.parametrize(
    "ref", ["gpu-alloc", "gpu-alloc:latest", "docker.io/library/gpu-alloc", "abc1", OWN_ID]
)
def test_the_plugin_dockerd_consults_stays_as_installed(ref, action):
    why = refusal(PluginCheck(ref, action, ("gpu-alloc",)), LISTED)
    assert why is not None and f"{action} plugin '{ref}'" in why
    assert "authorization plugin 'gpu-alloc' dockerd consults" in why


def test_a_reference_that_could_name_the_authorization_plugin_later_is_refused_now():
    """``abc`` names the plugin called abc:latest now; once that is gone, dockerd would
    resolve it as an id prefix, to gpu-alloc's: the verdict holds for both."""
    listed = [*LISTED, plugin("abc:latest", "9" * 64, "volumedriver")]
    assert refusal(PluginCheck("abc", "disable", ("gpu-alloc",)), listed) is not None


def test_plugins_outside_the_chain_are_managed_freely():
    for ref in ("vieux/sshfs", "tools/impostor:v2", "fed7", "gpu-alloc:v2"):
        assert refusal(PluginCheck(ref, "remove", ("gpu-alloc",)), LISTED) is None
    # The chain's name kept by a spec file (no managed plugin of that name): nothing to keep.
    assert refusal(PluginCheck("abc1", "remove", ("opa",)), LISTED) is None


def test_an_ambiguous_prefix_in_the_chain_names_no_plugin():
    assert plugins.resolves("ab", LISTED) == []
    assert plugins.resolves("abc", LISTED) == [LISTED[0]]


def _nothing(path: str) -> str:
    """`exposes` for a host where no absolute path is protected."""
    return ""


def _installed(privileges: list, path: str = "/v1.41/plugins/pull?remote=x") -> object:
    route = decide.route_of("POST", path)
    return plugins.verdict(route, "POST", path, privileges, ("gpu-alloc",), _nothing)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "source",
    ["../../../../../../var/lib/gpu-alloc", "..", "../x", "rootfs/../../x", "./../../x",
     "a/b/../../../x", "rootfs//..//..//etc"],
)  # fmt: skip
@pytest.mark.parametrize("path", ["/plugins/pull?remote=x", "/plugins/x/upgrade?remote=x"])
def test_a_relative_plugin_mount_that_climbs_out_of_its_bundle_is_refused(source, path):
    """runc joins a relative source to the plugin's bundle; ``..`` climbs out, to ``/``."""
    why = _installed([{"Name": "mount", "Value": [source]}], path)
    assert isinstance(why, str) and "climbs out of the plugin's bundle" in why, why


@pytest.mark.parametrize("source", ["rootfs/data", "data", "./data", "a/../data", "rootfs/./x"])
def test_a_relative_plugin_mount_inside_its_bundle_installs(source):
    assert _installed([{"Name": "mount", "Value": [source]}]) is None


@pytest.mark.parametrize(
    "setting", ["st.source=../../../../var/lib/gpu-alloc", "st.Source=..", "m.source=x/../../y"]
)
def test_a_plugin_setting_that_points_a_mount_out_of_its_bundle_is_refused(setting):
    route = decide.route_of("POST", "/plugins/x/set")
    why = plugins.verdict(route, "POST", "/plugins/x/set", [setting], (), _nothing)
    assert isinstance(why, str) and "climbs out" in why and setting in why


def test_plugin_settings_that_name_no_mount_source_keep_their_relative_values():
    route = decide.route_of("POST", "/plugins/x/set")
    decision = plugins.verdict(
        route, "POST", "/plugins/x/set", ["DEBUG=../1", "st.source=d"], (), _nothing
    )
    assert decision == PluginCheck("x", "set", ())


@pytest.mark.parametrize(
    "types",
    [["docker.authz/2.0"], ["docker.volumedriver/1.0", "docker.authz/1.1"], ["docker.authz"],
     ["docker.AuthZ/1.0"], ["x.docker.authz/9"]],
)  # fmt: skip
def test_an_authorization_plugin_is_known_by_its_capability_whatever_its_version(types):
    listed = [{"Id": "e" * 64, "Name": "other:latest", "Config": {"Interface": {"Types": types}}}]
    why = refusal(PluginCheck("other", "enable", ()), listed)
    assert why is not None and "authz capability" in why and types[-1] in why


@pytest.mark.parametrize("types", [["docker.volumedriver/1.0"], ["docker.authzx/1.0"], []])
def test_plugins_of_other_capabilities_are_enabled(types):
    listed = [{"Id": "e" * 64, "Name": "other:latest", "Config": {"Interface": {"Types": types}}}]
    assert refusal(PluginCheck("other", "enable", ()), listed) is None


@pytest.mark.parametrize(
    "privileges",
    [
        [{"Name": "host pid namespace", "Value": ["true"]},
         {"Name": "capabilities", "Value": ["CAP_SYS_PTRACE"]}],
        [{"Name": "capabilities", "Value": ["CAP_DAC_READ_SEARCH"]}],
        [{"Name": "capabilities", "Value": ["CAP_SYS_ADMIN", "CAP_SYS_MODULE"]}],
        # no AppArmor profile confines a managed plugin: SYS_ADMIN mounts the devices cgroup
        [{"Name": "capabilities", "Value": ["CAP_SYS_ADMIN"]}],
        [{"Name": "host pid namespace", "Value": ["true"]}],  # it can stop dockerd
    ],
)  # fmt: skip
def test_a_plugin_with_powers_outside_the_allow_list_is_refused(privileges):
    why = _installed(privileges)
    assert isinstance(why, str) and "policy.powers grants it nothing" in why, why


@pytest.mark.parametrize(
    "privileges",
    [
        [{"Name": "capabilities", "Value": ["CAP_SYS_PTRACE"]}],  # in its own PID namespace
        [{"Name": "capabilities", "Value": ["CAP_IPC_LOCK", "CAP_NET_ADMIN"]}],
        [{"Name": "network", "Value": ["host"]}],
    ],
)
def test_other_plugin_privileges_install(privileges):
    assert _installed(privileges) is None
