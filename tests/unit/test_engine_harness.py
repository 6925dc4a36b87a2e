"""The private-Engine harness's own checks that need no dockerd: refusing a state dir too
long for a socket path, forgetting the plugin specs of test plugins that are gone."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.support import engine


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
