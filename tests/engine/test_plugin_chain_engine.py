"""The authorization chain is not the users' to change, on a real dockerd.

dockerd looks an authorization plugin's name up among its managed plugins first, at
every start and reload: a plugin installed under that name would answer instead of
gpu-alloc, and gpu-alloc's own managed plugin disabled or removed would leave nothing
guarding the GPUs.  The stack's dockerd holds three managed plugins, made on a bare
Engine on its data root before gpu-alloc's plugin vets anything (`docker plugin create`
is refused through gpu-alloc): an authz one, a second authz one that daemon.json names
as an authorization plugin (gpu-alloc's own, as the managed-plugin install has it), and
a volume plugin.  No registry is needed: a refusal comes before dockerd fetches anything,
and a pull that is let through fails on the unreachable registry instead.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile

import pytest

from allocator.host import config
from allocator.ops import authz_doctor, doctor
from tests.support import engine
from tests.support.plugin_registry import PluginRegistry

NOWHERE = "127.0.0.1:9/impostor:latest"  # nothing listens: dockerd's pull fails at once
OWN = "ga-own"  # daemon.json's authorization plugin, a managed one


def plugin_config(types: list[str]) -> dict:
    return {
        "Description": "a gpu-alloc test plugin",
        "Documentation": "tests/engine/test_plugin_chain_engine.py",
        "Interface": {"Types": types, "Socket": "p.sock"},
        "Entrypoint": ["/bin/sleep", "1000"],
        "Network": {"Type": "none"},
        "Env": [{"Name": "DEBUG", "Description": "", "Settable": ["value"], "Value": "0"}],
    }


def rootfs(name: str) -> bytes:
    """busybox with the plugin's own name in it: dockerd stores each layer once."""
    out = io.BytesIO()
    with (
        tarfile.open(fileobj=out, mode="w") as tar,
        tarfile.open(fileobj=io.BytesIO(engine.busybox_rootfs_tar())) as busybox,
    ):
        for member in busybox.getmembers():
            tar.addfile(member, busybox.extractfile(member) if member.isfile() else None)
        info = tarfile.TarInfo("name")
        info.size = len(name)
        tar.addfile(info, io.BytesIO(name.encode()))
    return out.getvalue()


def plugin_tar(name: str, types: list[str]) -> bytes:
    """`docker plugin create`'s context: config.json and the rootfs under rootfs/."""
    out = io.BytesIO()
    with (
        tarfile.open(fileobj=out, mode="w") as tar,
        tarfile.open(fileobj=io.BytesIO(rootfs(name))) as files,
    ):
        data = json.dumps(plugin_config(types)).encode()
        info = tarfile.TarInfo("config.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        for member in files.getmembers():
            content = files.extractfile(member) if member.isfile() else None
            member.name = f"rootfs/{member.name}"
            tar.addfile(member, content)
    return out.getvalue()


PLUGINS = {
    "ga-authz": ["docker.authz/1.0"],
    OWN: ["docker.authz/1.0"],
    "ga-volume": ["docker.volumedriver/1.0"],
}


class SeededStack(engine.Stack):
    def _new_dockerd(self) -> engine.Dockerd:
        with engine.Dockerd(self.engine_dir) as bare:
            api = engine.engine_api(bare.sock)
            for name, types in PLUGINS.items():
                answer = api.post(
                    api._url("/plugins/create"),
                    params={"name": name},
                    data=plugin_tar(name, types),
                    headers={"Content-Type": "application/x-tar"},
                )
                assert answer.status_code == 204, answer.text
            api.close()
        return super()._new_dockerd()

    def start(self) -> SeededStack:
        super().start()
        # daemon.json names gpu-alloc's own managed plugin for dockerd's next reload
        # (the flag names the test's spec-file plugin, so dockerd is not reloaded here).
        (self.engine_dir / "daemon.json").write_text(
            json.dumps({"authorization-plugins": [self.plugin_name, OWN]})
        )
        return self


def make_stack() -> engine.Stack:
    return SeededStack(gpus=1)


@pytest.fixture(params=["engine", "shim"])
def api(request, stack):
    client = engine.engine_api(getattr(stack, f"{request.param}_sock"))
    yield client
    client.close()


def call(api, method: str, path: str, body: object = None, **params: str):
    return api.request(
        method, api._url(path), params=params, data=None if body is None else json.dumps(body),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip


@pytest.fixture(scope="module")
def registry():
    served = PluginRegistry({
        "impostor": (plugin_config(["docker.authz/1.0"]), rootfs("impostor")),
        "tools": (plugin_config(["docker.volumedriver/1.0"]), rootfs("tools")),
    })  # fmt: skip
    yield served
    served.close()


def docker(sock: str, tmp_path, *args: str) -> subprocess.CompletedProcess:
    """The docker CLI on ``sock``, with a config of its own (no user context)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
    env.update(DOCKER_HOST=f"unix://{sock}", DOCKER_CONFIG=str(tmp_path / "docker-config"))
    return subprocess.run(["docker", *args], capture_output=True, text=True, env=env, timeout=120)


def listed(stack) -> dict[str, dict]:
    """The managed plugins by name, as dockerd keeps them (``name:tag``)."""
    api = engine.engine_api(stack.engine_sock)
    try:
        return {p["Name"]: p for p in call(api, "GET", "/plugins").json()}
    finally:
        api.close()


def plugin_id(stack, name: str) -> str:
    return listed(stack)[f"{name}:latest"]["Id"]


def assert_refused(answer, *words: str) -> None:
    message = answer.json().get("message", "")
    assert answer.status_code == 403, (answer.status_code, answer.text)
    assert "gpu-alloc refused" in message and all(w in message for w in words), message


def assert_not_refused(answer) -> None:
    assert answer.status_code != 403, answer.text
    assert "gpu-alloc refused" not in answer.text


@pytest.mark.parametrize(
    "alias",
    ["{name}", "{name}:latest", "docker.io/library/{name}", "{upper}", OWN, f"{OWN}:latest"],
)
def test_no_plugin_is_installed_under_an_authorization_plugins_name(api, stack, alias):
    name = alias.format(name=stack.plugin_name, upper=stack.plugin_name.upper())
    answer = call(api, "POST", "/plugins/pull", [], remote=NOWHERE, name=name)
    assert_refused(answer, "looks its authorization plugin", "daemon.json")


@pytest.mark.parametrize("sock", ["engine_sock", "shim_sock"])
@pytest.mark.parametrize("alias", ["{name}", "{name}:latest", OWN])
def test_docker_plugin_install_under_the_authorization_plugins_name_is_refused(
    stack, registry, tmp_path, sock, alias
):
    """The issue as reported: an allow-all authz plugin that asks for no device, installed
    under the name dockerd consults for authorization."""
    alias = alias.format(name=stack.plugin_name)
    before = listed(stack)
    out = docker(getattr(stack, sock), tmp_path, "plugin", "install", "--grant-all-permissions",
                 "--alias", alias, f"{registry.address}/impostor")  # fmt: skip
    assert out.returncode != 0
    assert "gpu-alloc refused the plugin install as" in out.stderr, out.stderr
    assert "--alias OTHER" in out.stderr and "daemon.json" in out.stderr
    assert listed(stack) == before  # nothing pulled, nothing replaced


@pytest.mark.parametrize("sock", ["engine_sock", "shim_sock"])
def test_docker_plugin_install_of_an_authz_plugin_stops_at_its_enable(
    stack, registry, tmp_path, sock
):
    """Under another tag of the authorization plugin's name, or any other name, the pull
    is allowed and the enable refused: the plugin stays installed, disabled."""
    for alias in (f"{stack.plugin_name}:other", "ga-other-authz"):
        out = docker(getattr(stack, sock), tmp_path, "plugin", "install",
                     "--grant-all-permissions", "--alias", alias,
                     f"{registry.address}/impostor")  # fmt: skip
        assert out.returncode != 0
        assert "implements docker.authz/1.0" in out.stderr, out.stderr
        name = alias if ":" in alias else f"{alias}:latest"
        assert listed(stack)[name]["Enabled"] is False
        assert docker(stack.engine_sock, tmp_path, "plugin", "rm", name).returncode == 0


def test_docker_plugin_install_disable_of_an_authz_plugin_installs_it_disabled(
    stack, registry, tmp_path
):
    out = docker(stack.shim_sock, tmp_path, "plugin", "install", "--grant-all-permissions",
                 "--disable", "--alias", "ga-kept", f"{registry.address}/impostor")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert listed(stack)["ga-kept:latest"]["Enabled"] is False
    assert docker(stack.engine_sock, tmp_path, "plugin", "rm", "ga-kept").returncode == 0


def test_other_plugins_install_as_before(stack, registry, tmp_path):
    out = docker(stack.shim_sock, tmp_path, "plugin", "install", "--grant-all-permissions",
                 "--disable", f"{registry.address}/tools")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert (
        docker(stack.engine_sock, tmp_path, "plugin", "rm", f"{registry.address}/tools").returncode
        == 0
    )


def test_a_pull_under_the_authorization_plugins_own_remote_name_is_refused(api, stack):
    """Without ``name`` the plugin is named after the remote, as dockerd's router does."""
    answer = call(api, "POST", "/plugins/pull", [], remote=f"{stack.plugin_name}:latest")
    assert_refused(answer, "looks its authorization plugin")


def test_a_plugin_under_another_tag_or_name_installs_as_before(api, stack):
    for name in (f"{stack.plugin_name}:other", "ga-tools"):
        assert_not_refused(call(api, "POST", "/plugins/pull", [], remote=NOWHERE, name=name))


@pytest.mark.parametrize("ref", ["name", "id prefix", "id"])
def test_no_authorization_plugin_is_enabled(api, stack, ref):
    pid = plugin_id(stack, "ga-authz")
    target = {"name": "ga-authz", "id prefix": pid[:10], "id": pid}[ref]
    answer = call(api, "POST", f"/plugins/{target}/enable", timeout="1")
    assert_refused(answer, "implements docker.authz/1.0", "daemon.json")


@pytest.mark.parametrize("ref", ["name", "name:latest", "id prefix", "id"])
@pytest.mark.parametrize(
    ("method", "action", "body", "params"),
    [
        ("POST", "disable", None, {"force": "1"}),
        ("DELETE", "", None, {"force": "1"}),
        ("POST", "upgrade", [], {"remote": NOWHERE}),
        ("POST", "set", ["DEBUG=1"], {}),
    ],
)
def test_the_managed_authorization_plugin_stays_as_installed(
    api, stack, ref, method, action, body, params
):
    pid = plugin_id(stack, OWN)
    target = {"name": OWN, "name:latest": f"{OWN}:latest", "id prefix": pid[:6], "id": pid}[ref]
    path = f"/plugins/{target}" + (f"/{action}" if action else "")
    answer = call(api, method, path, body, **params)
    assert_refused(answer, f"authorization plugin '{OWN}' dockerd consults", "daemon.json")
    assert plugin_id(stack, OWN) == pid  # still there, under its name


def test_volume_plugins_are_managed_as_before(stack):
    """Enable, set, disable and remove of a plugin that is no authorization plugin reach
    dockerd, which answers them itself (the test plugin never serves its socket)."""
    api = engine.engine_api(stack.engine_sock)
    assert call(api, "POST", "/plugins/ga-volume/set", ["DEBUG=1"]).status_code == 204
    assert_not_refused(call(api, "POST", "/plugins/ga-volume/enable", timeout="1"))
    assert_not_refused(call(api, "POST", "/plugins/ga-volume/disable"))
    assert call(api, "DELETE", "/plugins/ga-volume", force="1").status_code == 200
    listed = call(api, "GET", "/plugins").json()
    assert "ga-volume:latest" not in [p["Name"] for p in listed]


def test_doctor_names_a_managed_plugin_that_takes_a_spec_files_name(stack, tmp_path, monkeypatch):
    (tmp_path / f"{OWN}.spec").write_text("unix:///run/gpu-alloc/plugin.sock\n")
    monkeypatch.setattr(authz_doctor, "SPEC_DIRS", (str(tmp_path),))
    line = doctor.check_managed_plugins(config.load(str(stack.config_path)))
    pid = plugin_id(stack, OWN)
    assert line.status == doctor.FAIL
    assert f"{OWN}:latest (id {pid[:12]}) takes the authorization plugin name '{OWN}'" in line.what
    assert f"rm -rf {stack.engine_dir / 'root'}/plugins/{pid} && systemctl start" in line.fix


def test_doctor_names_a_disabled_managed_authorization_plugin(stack):
    line = doctor.check_managed_plugins(config.load(str(stack.config_path)))
    assert line.status == doctor.FAIL
    assert f"{OWN}:latest" in line.what and "disabled" in line.what
    assert line.fix.startswith(f"docker plugin enable {OWN}:latest, or systemctl stop docker")
