"""gpu-alloc doctor against the test Engine: healthy, then with each fault."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from allocator.core import advisories
from allocator.core.facts import engine_version
from allocator.host.engine import Engine, EngineError
from allocator.ops.doctor import CHECKS
from tests.support import engine


def make_stack() -> engine.Stack:
    return engine.Stack(gpus=2)


def doctor(stack: engine.Stack, tmp_path, context: bool = True) -> subprocess.CompletedProcess:
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
        [*engine.gpu_alloc_command(), "--config", str(stack.config_path), "doctor"],
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
        "docker context 'gpu-alloc'",
        f"[  ok] dockerd reads {stack.engine_dir / 'daemon.json'}, the engine.daemon_json",
    ):
        assert what in out.stdout
    assert out.stdout.strip().endswith("healthy")


def test_a_missing_context_is_a_warning_with_the_command(stack, tmp_path):
    out = doctor(stack, tmp_path, context=False)
    assert "[warn] no docker context points at" in out.stdout
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
    # The test dockerd names its plugin with a flag: daemon.json would stop it starting.
    assert "add --authorization-plugin=not-gpu-alloc beside the other" in out.stdout
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
    assert f"[warn] dockerd reads {real} (its --config-file)" in out.stdout
    assert f"fix: set engine.daemon_json: {real} in {cfg}" in out.stdout


def test_doctor_lines_all_say_ok_warn_or_fail(stack, tmp_path):
    lines = [ln for ln in doctor(stack, tmp_path).stdout.splitlines() if ln.startswith("[")]
    assert len(lines) == len(CHECKS)
    assert all(ln[1:5].strip() in ("ok", "warn", "FAIL") for ln in lines), json.dumps(lines)


def test_the_build_door_and_the_engines_advisories_have_their_lines(stack, tmp_path):
    """The stack's daemon.json closes the build door as the installer's does; the
    advisories named are those of this Engine's version, as a warning unless severe."""
    out = doctor(stack, tmp_path).stdout
    assert "[  ok] builds: no build step can be given a device" in out, out
    version = Engine(stack.engine_sock).version()["Version"]
    found = advisories.affecting(engine_version(version))
    for advisory in found:
        assert advisory.cve in out
    if not found:
        assert f"[  ok] Engine {version}: none of the known advisories" in out, out
    elif not any(a.severe for a in found):
        assert f"[warn] Engine {version} is affected by" in out, out


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
