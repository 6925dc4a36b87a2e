"""`gpu-alloc swarm configure`: daemon.json's and the toolkit's swarm settings
(allocator/core/rules/swarm_files.py), and the command that writes them."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from allocator.core.rules import swarm_files
from tests.support.engine import gpu_alloc

GPUS = ("GPU-aaaa", "GPU-bbbb")
SHIPPED_TOML = (
    '#swarm-resource = "DOCKER_RESOURCE_GPU"\n'
    "accept-nvidia-visible-devices-envvar-when-unprivileged = true\n\n"
    '[nvidia-container-cli]\nldconfig = "@/sbin/ldconfig"\n'
)


def test_daemon_json_gets_the_gpus_and_the_nvidia_default_keeping_everything_else() -> None:
    current = {"log-level": "warn", "node-generic-resources": ["fpga=F1", "gpu=GPU-old"]}
    out = swarm_files.daemon_json(current, "gpu", GPUS)
    assert out["node-generic-resources"] == ["fpga=F1", "gpu=GPU-aaaa", "gpu=GPU-bbbb"]
    assert out["default-runtime"] == "nvidia" and "nvidia" in out["runtimes"]
    assert out["log-level"] == "warn"


def test_an_existing_nvidia_runtime_is_kept_as_declared() -> None:
    current = {"runtimes": {"nvidia": {"path": "/opt/nv/runtime", "runtimeArgs": []}}}
    out = swarm_files.daemon_json(current, "gpu", GPUS)
    assert out["runtimes"]["nvidia"] == {"path": "/opt/nv/runtime", "runtimeArgs": []}


def test_giving_swarm_no_gpus_removes_only_this_kind() -> None:
    current = {"node-generic-resources": ["gpu=GPU-old"], "default-runtime": "nvidia"}
    out = swarm_files.daemon_json(current, "gpu", ())
    assert "node-generic-resources" not in out and out["default-runtime"] == "nvidia"


def test_the_toolkit_gets_its_swarm_resource_in_place_of_the_shipped_example() -> None:
    out = swarm_files.toolkit_toml(SHIPPED_TOML, "DOCKER_RESOURCE_GPU")
    assert out.splitlines()[0] == 'swarm-resource = "DOCKER_RESOURCE_GPU"'
    assert out.count("swarm-resource") == 1 and "[nvidia-container-cli]" in out


def test_a_swarm_resource_line_inside_a_section_is_not_the_top_level_key() -> None:
    text = '[nvidia-container-runtime]\nswarm-resource = "X"\n'
    out = swarm_files.toolkit_toml(text, "DOCKER_RESOURCE_GPU")
    assert out.startswith('swarm-resource = "DOCKER_RESOURCE_GPU"\n[nvidia-container-runtime]')


def node(tmp_path: Path) -> Path:
    (tmp_path / "daemon.json").write_text('{"log-level": "warn"}\n')
    (tmp_path / "config.toml").write_text(SHIPPED_TOML)
    config = {
        "engine": {
            "daemon_json": str(tmp_path / "daemon.json"),
            "socket": str(tmp_path / "no-engine.sock"),
        },
        "state_dir": str(tmp_path / "state"),
        "swarm": {"gpus": list(GPUS), "toolkit_config": str(tmp_path / "config.toml")},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_dry_run_prints_the_diff_and_writes_nothing(tmp_path: Path) -> None:
    done = gpu_alloc(node(tmp_path), "swarm", "configure", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert '+    "gpu=GPU-aaaa",' in done.stdout and "+swarm-resource" in done.stdout
    assert "restart" in done.stdout
    assert json.loads((tmp_path / "daemon.json").read_text()) == {"log-level": "warn"}


def test_configure_writes_both_files_once_and_is_idempotent(tmp_path: Path) -> None:
    config = node(tmp_path)
    first = gpu_alloc(config, "swarm", "configure")
    assert first.returncode == 0 and "needs a restart" in first.stdout
    daemon = json.loads((tmp_path / "daemon.json").read_text())
    assert daemon["node-generic-resources"] == ["gpu=GPU-aaaa", "gpu=GPU-bbbb"]
    assert 'swarm-resource = "DOCKER_RESOURCE_GPU"' in (tmp_path / "config.toml").read_text()
    again = gpu_alloc(config, "swarm", "configure")
    assert again.returncode == 0 and "already configured" in again.stdout


# ------------------------------------------------------------------ doctor's swarm line


def doctor(tmp_path: Path) -> tuple[str, str, str]:
    from allocator.host.config import load
    from allocator.ops import swarm_doctor

    return swarm_doctor.check(load(str(tmp_path / "config.yaml")))


def test_doctor_fails_a_node_whose_files_lack_its_swarm_gpus(tmp_path: Path) -> None:
    node(tmp_path)
    status, what, fix = doctor(tmp_path)
    assert status == "FAIL" and "daemon.json" in what and "swarm configure" in fix


def test_doctor_says_to_drain_a_node_whose_swarm_gpu_is_unhealthy(tmp_path: Path) -> None:
    from allocator.core.machine.health import GpuEvent, GpuHealth
    from allocator.host.health import HealthFile
    from allocator.host.ledger import Ledger

    assert gpu_alloc(node(tmp_path), "swarm", "configure").returncode == 0
    assert doctor(tmp_path)[0] == "ok"
    sick = GpuHealth(healthy=False, event=GpuEvent(GPUS[1], "xid", 0.0, 79))
    with HealthFile(Ledger(tmp_path / "state")).transaction() as box:
        box[0] = box[0].with_gpu(GPUS[1], sick)
    status, what, fix = doctor(tmp_path)
    assert status == "warn" and "GPU-bbbb (Xid 79" in what
    assert "docker node update --availability drain" in fix and "health clear GPU-bbbb" in fix
