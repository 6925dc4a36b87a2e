"""deploy/: install.sh, uninstall.sh, daemon_json.py, the units and config.json.

Everything runs against a DESTDIR staging root, so no systemd, docker or root
is needed: the scripts must then touch nothing outside DESTDIR and print the
service-manager steps instead of running them.  The managed-plugin manifest is
checked against moby's plugin Config schema (api/types/plugin/plugin.go and the
`required:` lists of api/swagger.yaml), since dockerd itself validates almost
nothing and decodes with Go's case-insensitive, unknown-key-ignoring JSON.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import stat
import subprocess
from dataclasses import replace
from pathlib import Path, PurePosixPath

import pytest

from allocator.host import config as allocator_config

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
INSTALL = DEPLOY / "install.sh"
UNINSTALL = DEPLOY / "uninstall.sh"
BUILD_PLUGIN = DEPLOY / "build-plugin.sh"
PREFIX = "/opt/gpu-alloc"
UNIT_DIR = "etc/systemd/system"
DAEMON_JSON = "etc/docker/daemon.json"
OPERATOR_DAEMON_JSON = {
    "data-root": "/srv/docker",
    "log-driver": "journald",
    "authorization-plugins": ["opa-docker-authz"],
    "runtimes": {"nvidia": {"path": "nvidia-container-runtime", "runtimeArgs": []}},
}


def _load_helper():
    spec = importlib.util.spec_from_file_location("daemon_json", DEPLOY / "daemon_json.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


daemon_json = _load_helper()
CLOSED_BUILDS = {"builder": {"entitlements": {"device": False}}}


def run(script: Path, root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "DESTDIR": str(root)}
    proc = subprocess.run(
        ["bash", str(script), *args], env=env, capture_output=True, text=True, timeout=120
    )
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def install(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run(INSTALL, root, "--skip-venv", "--no-restart", *args, check=check)


def snapshot(root: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every path under root with its mode and (for files) its content."""
    out: dict[str, tuple[int, bytes | None]] = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        out[str(path.relative_to(root))] = (
            st.st_mode,
            path.read_bytes() if stat.S_ISREG(st.st_mode) else None,
        )
    return out


def write_daemon_json(root: Path, content: str | dict) -> Path:
    path = root / DAEMON_JSON
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else json.dumps(content, indent=4))
    return path


def backups(root: Path) -> list[Path]:
    return sorted((root / "etc/docker").glob("daemon.json.bak.*"))


def unit(root: Path, name: str) -> dict[str, dict[str, list[str]]]:
    """A unit file as section -> key -> values (systemd allows repeated keys)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for line in (root / UNIT_DIR / name).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        assert current is not None, f"{name}: key outside a section: {line}"
        key, _, value = line.partition("=")
        current.setdefault(key, []).append(value)
    return sections


@pytest.fixture
def staged(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    write_daemon_json(root, OPERATOR_DAEMON_JSON)
    install(root)
    return root


# ---------------------------------------------------------------------------------------------
# install.sh


def test_units_run_the_venv_binary_with_the_config(staged: Path) -> None:
    for name, command in (
        ("gpu-alloc-plugin.service", "plugin"),
        ("gpu-alloc-shim.service", "shim"),
    ):
        text = (staged / UNIT_DIR / name).read_text()
        assert "@" not in re.sub(r"#.*", "", text), f"{name}: placeholder left"
        service = unit(staged, name)["Service"]
        assert service["ExecStart"] == [
            f"{PREFIX}/venv/bin/gpu-alloc --config /etc/gpu-alloc/config.yaml {command}"
        ]
        assert service["NoNewPrivileges"] == ["yes"]
        assert service["ProtectSystem"] == ["strict"]
        assert service["StateDirectory"] == ["gpu-alloc"]
        assert service["StateDirectoryMode"] == ["0700"]
        assert int(service["LimitNOFILE"][0]) >= 65536  # not systemd's 1024


def test_plugin_unit_starts_before_docker_and_never_gives_up(staged: Path) -> None:
    plugin = unit(staged, "gpu-alloc-plugin.service")
    assert "docker.service" in plugin["Unit"]["Before"][0].split()
    assert "docker.service" in plugin["Install"]["WantedBy"][0].split()
    assert plugin["Service"]["Restart"] == ["always"]
    assert plugin["Unit"]["StartLimitIntervalSec"] == ["0"]
    # The socket dir is dockerd's too: it must survive the plugin's stop.
    assert plugin["Service"]["RuntimeDirectory"][0].split() == ["docker", "docker/plugins"]
    assert plugin["Service"]["RuntimeDirectoryPreserve"] == ["yes"]
    # Started once the socket the config names answers: no path of its own in the unit.
    ready = f"{PREFIX}/venv/bin/gpu-alloc --config /etc/gpu-alloc/config.yaml ready plugin"
    assert plugin["Service"]["ExecStartPost"] == [ready]
    assert ".sock" not in "".join(
        plugin["Service"]["ExecStartPost"] + plugin["Service"]["ExecStart"]
    )


def test_shim_unit_follows_docker(staged: Path) -> None:
    shim = unit(staged, "gpu-alloc-shim.service")
    assert "docker.service" in shim["Unit"]["After"][0].split()
    assert "gpu-alloc-plugin.service" in shim["Unit"]["After"][0].split()
    assert shim["Unit"]["Requires"] == ["docker.service"]
    assert shim["Service"]["Restart"] == ["on-failure"]
    assert shim["Service"]["RuntimeDirectory"] == ["gpu-alloc"]
    assert shim["Service"]["RuntimeDirectoryPreserve"] == ["yes"]  # MPS dirs outlive it
    ready = f"{PREFIX}/venv/bin/gpu-alloc --config /etc/gpu-alloc/config.yaml ready shim"
    assert shim["Service"]["ExecStartPost"] == [ready]  # install says done once it answers


def test_prefix_is_substituted(tmp_path: Path) -> None:
    install(tmp_path, "--prefix", "/srv/ga")
    for name in ("gpu-alloc-plugin.service", "gpu-alloc-shim.service"):
        start = unit(tmp_path, name)["Service"]["ExecStart"][0]
        assert start.startswith("/srv/ga/venv/bin/gpu-alloc ")
    install(tmp_path, "--venv-from", "/usr/local/ga-venv")
    start = unit(tmp_path, "gpu-alloc-plugin.service")["Service"]["ExecStart"][0]
    assert start.startswith("/usr/local/ga-venv/bin/gpu-alloc ")


def test_prefix_with_odd_characters_is_refused(tmp_path: Path) -> None:
    proc = install(tmp_path, "--prefix", "/opt/gpu alloc", check=False)
    assert proc.returncode != 0
    assert not (tmp_path / UNIT_DIR).exists()


def test_the_command_is_linked_onto_the_path(staged: Path) -> None:
    link = staged / "usr/local/bin/gpu-alloc"
    assert os.readlink(link) == "/opt/gpu-alloc/venv/bin/gpu-alloc"
    run(UNINSTALL, staged)
    assert not link.is_symlink()


def test_config_installed_once_and_never_overwritten(staged: Path) -> None:
    installed = staged / "etc/gpu-alloc/config.yaml"
    assert installed.read_text() == (DEPLOY / "config.example.yaml").read_text()
    installed.write_text("state_dir: /srv/leases\n")
    install(staged)
    assert installed.read_text() == "state_dir: /srv/leases\n"


def test_state_and_socket_dirs(staged: Path) -> None:
    state = staged / "var/lib/gpu-alloc"
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    if os.geteuid() == 0:
        assert (state.stat().st_uid, state.stat().st_gid) == (0, 0)
    assert (staged / "run/gpu-alloc").is_dir()
    assert stat.S_IMODE((staged / "run/docker/plugins").stat().st_mode) == 0o700


def test_nothing_is_written_outside_destdir(tmp_path: Path) -> None:
    root = tmp_path / "root"
    install(root)
    written = {p.relative_to(root).parts[0] for p in root.iterdir()}
    assert written == {"etc", "run", "usr", "var"}


def test_daemon_json_merge_keeps_the_operators_keys(staged: Path) -> None:
    merged = json.loads((staged / DAEMON_JSON).read_text())
    assert merged == {
        **OPERATOR_DAEMON_JSON,
        "authorization-plugins": ["opa-docker-authz", "gpu-alloc"],
        **CLOSED_BUILDS,
    }
    [backup] = backups(staged)
    assert json.loads(backup.read_text()) == OPERATOR_DAEMON_JSON


def test_second_install_changes_nothing(staged: Path) -> None:
    before = snapshot(staged)
    proc = install(staged)
    assert snapshot(staged) == before  # no duplicate entry, no second backup, same units
    assert "already lists gpu-alloc" in proc.stdout


def test_missing_daemon_json_is_created_without_backup(tmp_path: Path) -> None:
    install(tmp_path)
    assert json.loads((tmp_path / DAEMON_JSON).read_text()) == {
        "authorization-plugins": ["gpu-alloc"],
        **CLOSED_BUILDS,
    }
    assert backups(tmp_path) == []


@pytest.mark.parametrize(
    "content",
    [
        '{"log-driver": "journald",}',  # trailing comma: dockerd cannot read it either
        '{"authorization-plugins": ["a"], "authorization-plugins": ["b"]}',
        '["gpu-alloc"]',
        '{"authorization-plugins": "gpu-alloc"}',
    ],
)
def test_unusable_daemon_json_is_refused_before_any_change(tmp_path: Path, content: str) -> None:
    write_daemon_json(tmp_path, content)
    before = snapshot(tmp_path)
    proc = install(tmp_path, check=False)
    assert proc.returncode != 0
    assert "daemon.json" in proc.stderr
    assert snapshot(tmp_path) == before


def test_nvidia_default_runtime_is_refused_unless_forced(tmp_path: Path) -> None:
    write_daemon_json(tmp_path, {**OPERATOR_DAEMON_JSON, "default-runtime": "nvidia"})
    before = snapshot(tmp_path)
    proc = install(tmp_path, check=False)
    assert proc.returncode != 0
    assert 'remove "default-runtime": "nvidia"' in proc.stderr
    assert snapshot(tmp_path) == before
    proc = install(tmp_path, "--force")
    assert "WARNING" in proc.stdout
    assert "gpu-alloc" in json.loads((tmp_path / DAEMON_JSON).read_text())["authorization-plugins"]


def test_missing_nvidia_runtime_is_only_noted(tmp_path: Path) -> None:
    write_daemon_json(tmp_path, {"log-driver": "journald"})
    proc = install(tmp_path)
    assert "no 'nvidia' runtime" in proc.stdout


def test_dry_run_changes_nothing_but_prints_every_step(tmp_path: Path) -> None:
    write_daemon_json(tmp_path, OPERATOR_DAEMON_JSON)
    before = snapshot(tmp_path)
    proc = run(INSTALL, tmp_path, "--dry-run")  # venv creation included, and still nothing
    assert snapshot(tmp_path) == before
    out = proc.stdout
    for step in (
        "-m venv",
        "pip install",
        "config.example.yaml",
        "gpu-alloc-plugin.service",
        "systemctl daemon-reload",
        "would add gpu-alloc",
        "systemctl restart docker.service",
        "gpu-alloc-shim.service",
    ):
        assert step in out, step
    assert out.index("Plugin.Activate") < out.index("systemctl restart docker.service")


def test_service_steps_are_printed_in_order_not_run(staged: Path) -> None:
    out = run(INSTALL, staged, "--skip-venv").stdout  # no --no-restart: DESTDIR alone skips
    order = [
        "skipped (DESTDIR): systemctl daemon-reload",
        "skipped (DESTDIR): systemctl start gpu-alloc-plugin.service",
        "Plugin.Activate",
        "skipped (DESTDIR): systemctl restart docker.service",
        "skipped (DESTDIR): systemctl start gpu-alloc-shim.service",
    ]
    positions = [out.index(step) for step in order]
    assert positions == sorted(positions)
    assert "docker context create gpu-alloc --docker host=unix:///run/gpu-alloc/docker.sock" in out
    assert "docker --context gpu-alloc run --rm --gpus 1" in out


def test_unknown_option_is_a_usage_error(tmp_path: Path) -> None:
    proc = run(INSTALL, tmp_path, "--bogus", check=False)
    assert proc.returncode == 2
    assert "--prefix DIR" in proc.stderr
    assert not any(tmp_path.iterdir())


def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    prefix = tmp_path / "prefix"  # a real path, so verify finds ExecStart's binary
    (prefix / "venv/bin").mkdir(parents=True)
    for name in ("gpu-alloc",):  # ExecStart, and ExecStartPost's readiness wait
        binary = prefix / "venv/bin" / name
        binary.write_text("#!/bin/sh\n")
        binary.chmod(0o755)
    root = tmp_path / "root"
    install(root, "--prefix", str(prefix))
    units = [
        str(root / UNIT_DIR / n) for n in ("gpu-alloc-plugin.service", "gpu-alloc-shim.service")
    ]
    proc = subprocess.run(
        ["systemd-analyze", "verify", *units], capture_output=True, text=True, timeout=60
    )
    # verify only warns (exit 0) about unknown keys and bad values: no output is the pass.
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == "", proc.stderr


def fake_python(tmp_path: Path, runs_from: str) -> Path:
    """An interpreter of 3.11+ that says it runs from ``runs_from`` (a pyenv under /root).

    Each run is logged to ``calls`` beside it, so a test can tell whether it ran at all."""
    py = tmp_path / "bin" / "python3"
    py.parent.mkdir(parents=True)
    py.write_text(
        f'#!/bin/sh\necho "$*" >> {tmp_path}/calls\n'
        f"printf '%s\\n' {runs_from}/bin/python3.11 {runs_from}\n"
    )
    py.chmod(0o755)
    return py


def test_an_interpreter_under_root_is_refused_naming_a_system_one(tmp_path: Path) -> None:
    py = fake_python(tmp_path, "/root/.pyenv/versions/3.11.7")
    proc = run(INSTALL, tmp_path / "root", "--no-restart", "--python", str(py), check=False)
    assert proc.returncode == 1
    assert f"--python {py} runs from /root/.pyenv/versions/3.11.7/bin/python3.11" in proc.stderr
    assert "ProtectHome=yes hides /root and /home" in proc.stderr
    assert "use a system interpreter (3.11 or newer), e.g. --python /usr/" in proc.stderr
    assert not (tmp_path / "root").exists()


def test_a_venv_under_home_is_refused(tmp_path: Path) -> None:
    proc = install(tmp_path, "--venv-from", "/home/alice/venv", check=False)
    assert proc.returncode == 1
    assert "'/home/alice/venv' is under /root or /home" in proc.stderr


def test_the_default_interpreter_is_the_systems_not_the_first_on_path(tmp_path: Path) -> None:
    if subprocess.run(
        ["/usr/bin/python3", "-c", "import sys; sys.exit(sys.version_info < (3, 11))"]
    ).returncode:
        pytest.skip("/usr/bin/python3 is older than 3.11 here")
    fake_python(tmp_path / "path", "/root/.pyenv/versions/3.11.7")
    env = {
        **os.environ,
        "DESTDIR": str(tmp_path / "root"),
        "PATH": f"{tmp_path}/path/bin:/usr/bin:/bin",
    }
    proc = subprocess.run(["bash", str(INSTALL), "--no-restart", "--dry-run"], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert f"+ /usr/bin/python3 -m venv {tmp_path}/root{PREFIX}/venv" in proc.stdout
    assert not (tmp_path / "path" / "calls").exists(), "install.sh ran the first python3 on PATH"


# ---------------------------------------------------------------------------------------------
# uninstall.sh


def test_uninstall_removes_the_entry_first_and_keeps_state(staged: Path) -> None:
    (staged / "var/lib/gpu-alloc/leases.json").write_text("{}")
    (staged / "opt/gpu-alloc/venv/bin").mkdir(parents=True)
    backups_before = backups(staged)
    out = run(UNINSTALL, staged).stdout
    assert json.loads((staged / DAEMON_JSON).read_text()) == {
        **OPERATOR_DAEMON_JSON,
        **CLOSED_BUILDS,
    }
    assert len(backups(staged)) == len(backups_before) + 1
    # docker stops consulting the plugin before the plugin goes away
    assert out.index("removed gpu-alloc") < out.index("systemctl restart docker.service")
    assert out.index("systemctl restart docker.service") < out.index("systemctl stop")
    assert out.index("systemctl stop") < out.index("rm -f")
    assert not (staged / UNIT_DIR / "gpu-alloc-plugin.service").exists()
    assert not (staged / UNIT_DIR / "gpu-alloc-shim.service").exists()
    assert not (staged / "opt/gpu-alloc").exists()
    assert (staged / "var/lib/gpu-alloc/leases.json").read_text() == "{}"
    assert (staged / "etc/gpu-alloc/config.yaml").exists()


def test_uninstall_drops_an_emptied_key(tmp_path: Path) -> None:
    install(tmp_path)
    run(UNINSTALL, tmp_path)
    assert json.loads((tmp_path / DAEMON_JSON).read_text()) == CLOSED_BUILDS


def test_uninstall_purge_removes_state_and_config(staged: Path) -> None:
    run(UNINSTALL, staged, "--purge")
    assert not (staged / "var/lib/gpu-alloc").exists()
    assert not (staged / "etc/gpu-alloc").exists()


def test_uninstall_dry_run_and_second_run_change_nothing(staged: Path) -> None:
    before = snapshot(staged)
    proc = run(UNINSTALL, staged, "--dry-run", "--purge")
    assert snapshot(staged) == before
    assert "would remove gpu-alloc" in proc.stdout
    run(UNINSTALL, staged)
    after_first = snapshot(staged)
    run(UNINSTALL, staged)
    assert snapshot(staged) == after_first


def test_uninstall_refuses_invalid_daemon_json(staged: Path) -> None:
    write_daemon_json(staged, "{not json")
    before = snapshot(staged)
    proc = run(UNINSTALL, staged, check=False)
    assert proc.returncode != 0
    assert snapshot(staged) == before


# ---------------------------------------------------------------------------------------------
# daemon_json.py


@pytest.mark.parametrize(
    ("builder", "want"),
    [
        ({}, {"entitlements": {"device": False}}),
        ({"gc": {"enabled": True}}, {"gc": {"enabled": True}, "entitlements": {"device": False}}),
        (
            {"entitlements": {"device": True, "network-host": False}},
            {"entitlements": {"device": False, "network-host": False}},
        ),
    ],
)
def test_helper_add_closes_the_build_door_keeping_the_builder_settings(
    builder: dict, want: dict
) -> None:
    path = Path("daemon.json")
    base = {"authorization-plugins": ["gpu-alloc"], "builder": builder}
    assert daemon_json.updated(base, path, "add", "gpu-alloc") == {**base, "builder": want}
    closed = {**base, "builder": want}
    assert daemon_json.updated(closed, path, "add", "gpu-alloc") is None


@pytest.mark.parametrize(
    "data",
    [
        {"builder": []},
        {"builder": {"Entitlements": {"device": True}}},
        {"builder": {"entitlements": {"Device": True}}},
        {"builder": {"entitlements": "none"}},
    ],
)
def test_helper_refuses_a_builder_it_cannot_close_unambiguously(data: dict) -> None:
    with pytest.raises(daemon_json.Refused):
        daemon_json.updated(data, Path("daemon.json"), "add", "gpu-alloc")


def test_helper_add_and_remove_are_inverse_and_idempotent() -> None:
    path = Path("daemon.json")
    base = {"b": 1, "authorization-plugins": ["x"]}
    added = daemon_json.updated(base, path, "add", "gpu-alloc")
    assert added == {"b": 1, "authorization-plugins": ["x", "gpu-alloc"], **CLOSED_BUILDS}
    assert daemon_json.updated(added, path, "add", "gpu-alloc") is None
    # The builder setting stays: harmless without gpu-alloc, and builds stay closed.
    assert daemon_json.updated(added, path, "remove", "gpu-alloc") == {**base, **CLOSED_BUILDS}
    assert daemon_json.updated(base, path, "remove", "gpu-alloc") is None
    assert (
        daemon_json.updated({"authorization-plugins": ["gpu-alloc"]}, path, "remove", "gpu-alloc")
        == {}
    )


def test_helper_check_reports_without_writing(tmp_path: Path) -> None:
    path = write_daemon_json(tmp_path, OPERATOR_DAEMON_JSON)
    before = path.read_bytes()
    assert daemon_json.main(["add", str(path), "--check"]) == daemon_json.EXIT_CHANGE_NEEDED
    assert path.read_bytes() == before
    assert daemon_json.main(["remove", str(path), "--check"]) == 0
    path.write_text("{")
    assert daemon_json.main(["add", str(path), "--check"]) == daemon_json.EXIT_REFUSED


def test_helper_keeps_file_mode(tmp_path: Path) -> None:
    path = write_daemon_json(tmp_path, {"debug": True})
    path.chmod(0o600)
    assert daemon_json.main(["add", str(path)]) == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [
        p.name for p in tmp_path.joinpath("etc/docker").iterdir() if p.name.startswith(".")
    ] == []


def test_helper_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_daemon_json(tmp_path, {**OPERATOR_DAEMON_JSON, "default-runtime": "runc"})
    assert daemon_json.main(["inspect", str(path)]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "default_runtime": "runc",
        "runtimes": ["nvidia"],
        "authorization_plugins": ["opa-docker-authz"],
        "build_devices_closed": False,
    }


# ---------------------------------------------------------------------------------------------
# config.example.yaml, config.json, shell hygiene


def test_example_config_is_exactly_the_defaults_but_turns_metrics_on() -> None:
    path = str(DEPLOY / "config.example.yaml")
    parsed = allocator_config.parse(Path(path).read_text(), path)
    metrics = allocator_config.MetricsConfig(listen="127.0.0.1:9403")
    assert parsed == allocator_config.Config(source=path, metrics=metrics)


def test_example_config_says_nvidia_as_default_runtime_is_refused_except_on_a_swarm_node(
    tmp_path: Path,
) -> None:
    """What the example says is what the plugin does: nvidia as dockerd's default runtime is
    refused, unless swarm.gpus gives GPUs to swarm (whose setup makes it the default)."""
    from allocator.ops import cli

    text = (DEPLOY / "config.example.yaml").read_text()
    said = text[text.index('reads "default-runtime"') :].split("daemon_json:")[0]
    assert "refuses to run if it is an nvidia runtime" in said and "unless swarm.gpus" in said
    daemon = tmp_path / "daemon.json"
    daemon.write_text('{"default-runtime": "nvidia", "runtimes": {"nvidia": {"path": "x"}}}')
    plain = allocator_config.Config(engine=allocator_config.EngineConfig(daemon_json=str(daemon)))
    with pytest.raises(cli.StartupError):
        cli.check_default_runtime(plain)
    swarm = replace(plain, swarm=replace(plain.swarm, gpus=("GPU-1",)))
    cli.check_default_runtime(swarm)  # the swarm setup's own default runtime: allowed


# moby api/types/plugin: Config (json tags) and the `required:` lists in api/swagger.yaml.
PLUGIN_CONFIG_FIELDS = {
    "Args", "Description", "Documentation", "Entrypoint", "Env", "Interface", "IpcHost",
    "Linux", "Mounts", "Network", "PidHost", "PropagatedMount", "User", "WorkDir", "rootfs",
}  # fmt: skip
PLUGIN_CONFIG_REQUIRED = {
    "Description", "Documentation", "Interface", "Entrypoint", "WorkDir", "Network", "Linux",
    "PidHost", "PropagatedMount", "IpcHost", "Mounts", "Env", "Args",
}  # fmt: skip
MOUNT_REQUIRED = {"Name", "Description", "Settable", "Source", "Destination", "Type", "Options"}
ENV_REQUIRED = {"Name", "Description", "Settable", "Value"}
DEVICE_REQUIRED = {"Name", "Description", "Settable", "Path"}
ARGS_REQUIRED = {"Name", "Description", "Settable", "Value"}


@pytest.fixture(scope="module")
def manifest() -> dict:
    return json.loads((REPO / "config.json").read_text())


def test_manifest_has_exactly_moby_plugin_config_fields(manifest: dict) -> None:
    # Go decodes case-insensitively and drops unknown keys: a typo would vanish silently.
    assert set(manifest) <= PLUGIN_CONFIG_FIELDS
    assert set(manifest) >= PLUGIN_CONFIG_REQUIRED
    assert "rootfs" not in manifest  # dockerd fills it in at `docker plugin create`
    assert set(manifest["Interface"]) >= {"Types", "Socket"}
    assert set(manifest["Linux"]) == {"Capabilities", "AllowAllDevices", "Devices"}
    assert set(manifest["Args"]) == ARGS_REQUIRED
    assert manifest["Network"]["Type"] in {"", "bridge", "host", "none"}
    assert isinstance(manifest["PidHost"], bool) and isinstance(manifest["IpcHost"], bool)


def test_manifest_interface_is_authz_on_the_configured_socket(manifest: dict) -> None:
    types = manifest["Interface"]["Types"]
    assert "docker.authz/1.0" in types
    for t in types:  # moby CapabilityID: prefix.capability/version
        assert re.fullmatch(r"docker\.[a-z]+/\d+\.\d+", t), t
    socket = manifest["Interface"]["Socket"]
    # dockerd creates it in the plugin's /run/docker/plugins: a bare name
    assert "/" not in socket and socket.endswith(".sock")
    default = PurePosixPath(allocator_config.PluginConfig().socket)
    assert (str(default.parent), default.name) == ("/run/docker/plugins", socket)


def test_manifest_entrypoint_and_env(manifest: dict) -> None:
    entry = manifest["Entrypoint"]
    assert entry and all(isinstance(a, str) and a for a in entry)
    assert entry[0] == f"{PREFIX}/venv/bin/gpu-alloc"
    assert "plugin" in entry
    env = {e["Name"]: e for e in manifest["Env"]}
    for e in manifest["Env"]:
        assert set(e) == ENV_REQUIRED
        assert isinstance(e["Value"], str)  # a null Value is silently dropped
        assert set(e["Settable"]) <= {"value"}
    config_path = PurePosixPath(env[allocator_config.ENV_VAR]["Value"])
    mounted = {m["Destination"] for m in manifest["Mounts"]}
    assert str(config_path.parent) in mounted


def test_manifest_mounts_are_well_formed(manifest: dict) -> None:
    names = [m["Name"] for m in manifest["Mounts"]]
    assert len(names) == len(set(names))
    for m in manifest["Mounts"]:
        assert set(m) == MOUNT_REQUIRED, m["Name"]
        # dockerd fails `plugin enable` with "mount source is not specified" on a null Source
        assert isinstance(m["Source"], str) and m["Source"].startswith("/"), m["Name"]
        assert m["Destination"].startswith("/"), m["Name"]
        assert m["Type"] == "bind"
        assert {"bind", "rbind"} & set(m["Options"]), m["Name"]
        assert set(m["Settable"]) <= {"source"}  # the only settable mount field
    by_dest = {m["Destination"]: m for m in manifest["Mounts"]}
    state = by_dest[allocator_config.Config().state_dir]
    assert state["Source"] == allocator_config.Config().state_dir  # shared with the shim
    assert "rw" in state["Options"]
    assert "ro" in by_dest["/dev"]["Options"]
    assert allocator_config.EngineConfig().socket in by_dest


def test_manifest_devices_for_nvml(manifest: dict) -> None:
    linux = manifest["Linux"]
    # GPU count varies per host, so the device cgroup allows all and /dev is bind-mounted.
    assert linux["AllowAllDevices"] is True
    for d in linux["Devices"]:
        assert set(d) == DEVICE_REQUIRED and isinstance(d["Path"], str)
    assert all(c.startswith("CAP_") for c in linux["Capabilities"])


def test_build_plugin_says_so_without_an_engine(tmp_path: Path) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "docker").write_text(
        "#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n"
    )
    (fake / "docker").chmod(0o755)
    out = tmp_path / "plugin"
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    proc = subprocess.run(
        ["bash", str(BUILD_PLUGIN), "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "no Docker Engine reachable" in proc.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    "script", [INSTALL, UNINSTALL, BUILD_PLUGIN, DEPLOY / "lib.sh"], ids=lambda p: p.name
)
def test_shell_is_clean(script: Path) -> None:
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed")
    # -x follows `source deploy/lib.sh`, whose path is given from the repository root.
    proc = subprocess.run(["shellcheck", "-x", str(script)], capture_output=True, text=True,
                          cwd=DEPLOY.parent)  # fmt: skip
    assert proc.returncode == 0, proc.stdout
