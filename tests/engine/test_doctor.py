"""gpu-alloc doctor against the test Engine: healthy, then with each fault."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from allocator.core.access import advisories
from allocator.core.access.facts import engine_version
from allocator.host.engine import Engine, EngineError
from allocator.ops.doctor import CHECKS
from tests.support import engine


def make_stack() -> engine.Stack:
    return engine.Stack(gpus=2)


def doctor(
    stack: engine.Stack, tmp_path, *args: str, context: bool = True
) -> subprocess.CompletedProcess:
    """Run doctor as a user whose docker config has (or lacks) the gpu-alloc context."""
    cfg = tmp_path / "docker-config"
    cfg.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "DOCKER_CONFIG": str(cfg),
        "PATH": f"{stack.engine_dir / 'bin'}:{os.environ['PATH']}",
    }  # the fake toolkit hook
    if context:
        subprocess.run(["docker", "context", "create", "gpu-alloc", "--docker",
                        f"host=unix://{stack.shim_sock}"], env=env, capture_output=True,
                       check=False)  # fmt: skip
    return subprocess.run(
        [*engine.gpu_alloc_command(), "--config", str(stack.config_path), "doctor", *args],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip


def test_a_healthy_host_has_no_failures(stack, tmp_path):
    os.chmod(stack.state_dir, 0o700)
    out = doctor(stack, tmp_path)
    assert out.returncode == 0, out.stdout
    assert "[FAIL]" not in out.stdout
    for what in (
        "GPU inventory: 2 GPU(s)",
        "NVIDIA Container Toolkit",
        "default runtime runc",
        "answers Plugin.Activate",
        f"managed plugins: 0, none under an authorization plugin's name ({stack.plugin_name})",
        "answers /_ping",
        "[  ok] context: 'gpu-alloc' points at the shim",
        f"[  ok] dockerd's config file: {stack.engine_dir / 'daemon.json'}, the engine.daemon_json",
    ):
        assert what in out.stdout
    assert out.stdout.strip().endswith("healthy")


def test_a_missing_context_is_a_warning_with_the_command(stack, tmp_path):
    out = doctor(stack, tmp_path, context=False)
    assert "[warn] context: none points at" in out.stdout
    assert f"docker context create gpu-alloc --docker host=unix://{stack.shim_sock}" in out.stdout


def test_a_corrupt_state_file_fails_with_the_repair_command(stack, tmp_path):
    state = stack.state_dir / "state.json"
    saved = state.read_bytes() if state.exists() else None
    state.write_text("{not json")
    try:
        out = doctor(stack, tmp_path)
    finally:
        if saved is None:
            state.unlink()
        else:
            state.write_bytes(saved)
    assert out.returncode == 1
    assert "corrupt JSON" in out.stdout and "gpu-alloc repair --reset" in out.stdout


def test_a_dead_shim_and_a_wrong_plugin_name_are_failures(stack, tmp_path):
    cfg = tmp_path / "broken.yaml"
    import yaml

    data = yaml.safe_load(stack.config_path.read_text())
    data["shim"]["socket"] = str(tmp_path / "nobody.sock")
    data["plugin"]["name"] = "not-gpu-alloc"
    cfg.write_text(yaml.safe_dump(data))
    out = subprocess.run([*engine.gpu_alloc_command(), "--config", str(cfg), "doctor"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 1
    assert "shim at" in out.stdout and "not answering" in out.stdout
    # dockerd reaches the plugin by its spec file under another name: naming
    # not-gpu-alloc to dockerd (flag or daemon.json) would stop it starting.
    assert f"set plugin.name: {stack.plugin_name} in {cfg}" in out.stdout
    assert "--authorization-plugin=not-gpu-alloc" not in out.stdout
    assert 'add "authorization-plugins"' not in out.stdout
    assert "systemctl restart gpu-alloc-shim" in out.stdout


def test_a_daemon_json_dockerd_does_not_read_is_a_warning_naming_the_one_it_does(stack, tmp_path):
    import yaml

    data = yaml.safe_load(stack.config_path.read_text())
    data["engine"]["daemon_json"] = "/etc/docker/daemon.json"
    cfg = tmp_path / "elsewhere.yaml"
    cfg.write_text(yaml.safe_dump(data))
    out = subprocess.run([*engine.gpu_alloc_command(), "--config", str(cfg), "doctor"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    real = stack.engine_dir / "daemon.json"
    assert f"[warn] dockerd's config file: dockerd reads {real} (its --config-file)" in out.stdout
    assert f"fix: set engine.daemon_json: {real} in {cfg}" in out.stdout


def test_doctor_lines_all_say_ok_warn_or_fail_and_are_named_as_install_md_names_them(
    stack, tmp_path
):
    lines = [ln for ln in doctor(stack, tmp_path).stdout.splitlines() if ln.startswith("[")]
    assert len(lines) == len(CHECKS)
    assert all(ln[1:5].strip() in ("ok", "warn", "FAIL") for ln in lines), json.dumps(lines)
    rows = doctor_rows()
    for row, line in zip(rows, lines, strict=True):
        # daemon.json's line starts with its path, which ends in the row's name
        assert line[7:].startswith(row) or line[7:].split(":")[0].endswith(row), (row, line)


def doctor_rows() -> list[str]:
    """The first column of docs/install.md's table of doctor's lines."""
    text = (Path(__file__).parents[2] / "docs" / "install.md").read_text()
    table = text.split("## What `gpu-alloc doctor` checks", 1)[1].split("\n\n")[1]
    return [r.split("|")[1].strip() for r in table.splitlines()[2:]]


def test_the_build_door_and_the_engines_advisories_have_their_lines(stack, tmp_path):
    """The stack's daemon.json closes the build door as the installer's does; the
    advisories named are those of this Engine's version, as a warning unless severe."""
    out = doctor(stack, tmp_path).stdout
    assert "[  ok] builds: no build step can be given a device" in out, out
    version = Engine(stack.engine_sock).version()["Version"]
    found = advisories.affecting(engine_version(version))
    for advisory in found:  # one line each, what it means only with --verbose
        assert f"\n       {advisory.cve}: {advisory.what}; fixed in" in out
        assert advisory.bearing not in out
    if not found:
        assert f"[  ok] Engine advisories: Engine {version} is affected by none" in out, out
    elif not any(a.severe for a in found):
        assert f"[warn] Engine advisories: Engine {version} is affected by {len(found)}:" in out
    said = doctor(stack, tmp_path, "--verbose").stdout if found else ""
    assert all(f"{a.cve} here: {a.bearing}" in said for a in found)


def test_an_engine_that_is_not_there_is_named_in_plain_words(tmp_path):
    for ask in (lambda e: e.info(), lambda e: e.inspect("job")):  # the SDK, and our own GET
        with pytest.raises(EngineError, match="no socket there: is dockerd running"):
            ask(Engine(str(tmp_path / "docker.sock"), 2))


def with_config(stack: engine.Stack, tmp_path, **engine_keys: str):
    import yaml

    data = yaml.safe_load(stack.config_path.read_text())
    data["engine"].update(engine_keys)
    cfg = tmp_path / "changed.yaml"
    cfg.write_text(yaml.safe_dump(data))
    return cfg


def test_the_toolkit_is_looked_for_on_dockerds_path_not_doctors(stack, tmp_path):
    env = {**os.environ, "PATH": "/usr/bin:/bin"}  # no fake hook here; dockerd has one
    argv = [*engine.gpu_alloc_command(), "--config", str(stack.config_path), "doctor"]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    hook = stack.engine_dir / "bin" / "nvidia-container-runtime-hook"
    assert f"[  ok] NVIDIA Container Toolkit: {hook}, on dockerd's PATH (pid" in out.stdout


def test_a_plugin_named_by_flag_needs_nothing_in_daemon_json(stack, tmp_path):
    empty = tmp_path / "daemon.json"
    empty.write_text("{}")
    cfg = with_config(stack, tmp_path, daemon_json=str(empty))
    out = subprocess.run([*engine.gpu_alloc_command(), "--config", str(cfg), "doctor"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert "leaves authorization plugins to dockerd's command line, which names" in out.stdout
    assert "run deploy/install.sh" not in out.stdout


def test_daemon_json_naming_plugins_beside_the_flag_fails_before_dockerd_does(stack, tmp_path):
    both = tmp_path / "daemon.json"
    both.write_text(json.dumps({"authorization-plugins": [stack.plugin_name]}))
    cfg = with_config(stack, tmp_path, daemon_json=str(both))
    out = subprocess.run([*engine.gpu_alloc_command(), "--config", str(cfg), "doctor"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 1
    assert f'[FAIL] {both}: "authorization-plugins" is set' in out.stdout
    assert "dockerd refuses to start with both" in out.stdout


# ----------------------------------------------- each piece of advice, followed on a dockerd


def run_doctor(cfg) -> subprocess.CompletedProcess:
    return subprocess.run([*engine.gpu_alloc_command(), "--config", str(cfg), "doctor"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def authz_lines(out: subprocess.CompletedProcess) -> str:
    """doctor's Engine and daemon.json lines, with their fixes (not the Engine's advisories
    by version, which say nothing of the plugin's name and differ by Engine)."""
    keep, lines = False, []
    for line in out.stdout.splitlines():
        if line.startswith("["):
            about = "authorization plugins" in line or "daemon.json" in line or "Engine" in line
            keep = about and " advisories" not in line and " is affected by " not in line
        if keep:
            lines.append(line)
    return "\n".join(lines)


def test_a_plugin_reached_under_another_name_is_told_to_set_plugin_name_and_that_works(
    stack, tmp_path
):
    import yaml

    data = yaml.safe_load(stack.config_path.read_text())
    data["plugin"]["name"] = "gpu-alloc"  # the default; dockerd knows it by its spec file
    cfg = tmp_path / "renamed.yaml"
    cfg.write_text(yaml.safe_dump(data))
    said = authz_lines(run_doctor(cfg))
    assert f"fix: set plugin.name: {stack.plugin_name} in {cfg}" in said, said
    assert "--authorization-plugin=gpu-alloc" not in said and "install.sh" not in said
    data["plugin"]["name"] = stack.plugin_name  # the advice, followed
    cfg.write_text(yaml.safe_dump(data))
    after = authz_lines(run_doctor(cfg))
    assert "[FAIL]" not in after and "[warn]" not in after, after
    assert engine.ping(stack.engine_sock)  # dockerd, untouched, still runs


class OwnDockerd(engine.Dockerd):
    """A dockerd that also sees the stack's plugin socket (a root Engine's dockerd sees
    only the directories bound into its root), so the advice's plugin name resolves."""

    def __init__(self, *args, also: str, **kw) -> None:
        super().__init__(*args, **kw)
        self.also = Path(also).parent.resolve()

    def _binds(self) -> list[Path]:
        found = super()._binds()
        inside = any(self.also == d or d in self.also.parents for d in found)
        return found if inside else [*found, self.also]


def own_dockerd(stack, tmp_path, **kw) -> tuple[engine.Dockerd, object]:
    """A dockerd of its own (no shim), and a config of the stack's plugin pointing at it."""
    import yaml

    d = OwnDockerd(tempfile.mkdtemp(prefix="ga-", dir="/tmp"), also=stack.plugin_sock, **kw)
    d.start()
    data = yaml.safe_load(stack.config_path.read_text())
    data["engine"].update(socket=d.sock, daemon_json=str(d.dir / "daemon.json"))
    cfg = tmp_path / "own.yaml"
    cfg.write_text(yaml.safe_dump(data))
    return d, cfg


def restarted(d: OwnDockerd, **kw) -> engine.Dockerd:
    d.stop(remove=False)
    return OwnDockerd(d.dir, also=str(d.also / "x"), **kw).start()  # raises if it does not start


def test_advice_for_a_dockerd_naming_no_plugins_is_daemon_json_and_dockerd_then_starts(
    stack, tmp_path
):
    d, cfg = own_dockerd(stack, tmp_path)
    try:
        said = authz_lines(run_doctor(cfg))
        assert f'add "authorization-plugins": ["{stack.plugin_name}"]' in said, said
        assert "--authorization-plugin" not in said
        (d.dir / "daemon.json").write_text(
            json.dumps({"authorization-plugins": [stack.plugin_name]})
        )
        d = restarted(d)
        after = authz_lines(run_doctor(cfg))
        assert "[FAIL]" not in after and "[warn]" not in after, after
    finally:
        d.stop()
        shutil.rmtree(d.dir, ignore_errors=True)  # own_dockerd's, kept by the restart


def test_advice_for_a_dockerd_naming_plugins_by_flag_is_a_flag_and_dockerd_then_starts(
    stack, tmp_path
):
    """dockerd names another plugin (gpu-alloc's, through a proxy socket it cannot tell
    is ours) by flag: the advice is a flag, never daemon.json, which would name plugins
    twice and stop dockerd starting."""
    from tests.support.faults import PluginProxy

    proxy = PluginProxy(str(tmp_path / "proxy.sock"), stack.plugin_sock)
    other = f"ga-proxy-{os.getpid()}"
    d, cfg = own_dockerd(stack, tmp_path, authz_plugin_socket=proxy.server_address,
                         plugin_name=other)  # fmt: skip
    try:
        said = authz_lines(run_doctor(cfg))
        assert f"--authorization-plugin={stack.plugin_name}" in said, said
        assert 'add "authorization-plugins"' not in said and "install.sh" not in said
        flag = f"--authorization-plugin={stack.plugin_name}"
        d = restarted(d, authz_plugin_socket=proxy.server_address, plugin_name=other,
                      extra_args=[flag])  # fmt: skip
        after = authz_lines(run_doctor(cfg))
        assert "[FAIL]" not in after and "[warn]" not in after, after
    finally:
        d.stop()
        shutil.rmtree(d.dir, ignore_errors=True)
        proxy.close()
