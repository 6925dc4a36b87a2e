"""The private-Engine harness's own checks that need no dockerd: refusing a state dir too
long for a socket path, forgetting the plugin specs of test plugins that are gone, the
CDI spec of the simulated GPUs."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.support import cdi, engine


def test_state_dir_too_long_is_refused() -> None:
    with pytest.raises(engine.EngineError, match="too long"):
        engine.Dockerd("/tmp/" + "x" * 80)


def test_dead_test_plugin_specs_are_forgotten_and_live_ones_kept(tmp_path: Path) -> None:
    live_sock = tmp_path / "live.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(live_sock))
    server.listen()
    try:
        (tmp_path / "gpu-alloc-test-1-0.spec").write_text(f"unix://{live_sock}\n")
        (tmp_path / "gpu-alloc-test-2-0.spec").write_text(f"unix://{tmp_path}/gone.sock\n")
        (tmp_path / "someone-else.spec").write_text(f"unix://{tmp_path}/gone.sock\n")
        engine.forget_dead_specs(tmp_path)
        left = sorted(p.name for p in tmp_path.glob("*.spec"))
        assert left == ["gpu-alloc-test-1-0.spec", "someone-else.spec"]
    finally:
        server.close()


def test_the_cdi_spec_names_each_gpu_by_index_and_uuid_and_all_of_them() -> None:
    spec = cdi.spec(["GPU-a", "GPU-b"])
    names = [d["name"] for d in spec["devices"]]
    assert spec["kind"] == "nvidia.com/gpu" and names == ["0", "GPU-a", "1", "GPU-b", "all"]
    edits = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    assert edits["GPU-b"]["env"] == ["GA_CDI_GPU_1=GPU-b"]
    assert edits["GPU-b"]["deviceNodes"] == [{"path": "/dev/nvidia1", "hostPath": "/dev/null"}]
    assert edits["all"]["env"] == ["GA_CDI_GPU_0=GPU-a", "GA_CDI_GPU_1=GPU-b"]


def test_cdi_mode_is_refused_on_an_engine_without_cdi(tmp_path: Path, monkeypatch) -> None:
    with pytest.raises(RuntimeError, match=r"CDI mode needs Engine 25\.0 or later, not 20"):
        cdi.prepare(tmp_path, tmp_path, 20, ["GPU-a"])
    (tmp_path / "bin").mkdir()
    adds = cdi.prepare(tmp_path, tmp_path / "bin", 26, ["GPU-a"])
    assert adds == {"cdi-spec-dirs": [str(tmp_path / "cdi")], "features": {"cdi": True}}
    assert (tmp_path / "bin" / "nvidia-cdi-hook").stat().st_mode & 0o111
    monkeypatch.setenv("GA_GPU_MODE", "nvml")
    with pytest.raises(ValueError, match="choose one of hook, cdi"):
        cdi.mode()
