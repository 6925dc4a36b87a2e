"""One server per socket: a live one is never taken over, a stale file is replaced."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from allocator.host import listener


def test_a_stale_socket_file_is_replaced(tmp_path: Path) -> None:
    path = str(tmp_path / "s.sock")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(path)  # bound, never listening: what a killed server leaves behind
    held = listener.claim(path, "gpu-alloc shim")
    try:
        assert not Path(path).exists()  # free to bind
    finally:
        held.close()


def test_a_socket_that_answers_is_never_removed(tmp_path: Path) -> None:
    """A live server that holds no lock (an older version, say) still wins."""
    path = str(tmp_path / "s.sock")
    with socket.socket(socket.AF_UNIX) as live:
        live.bind(path)
        live.listen()
        with pytest.raises(
            listener.AlreadyRunning, match=f"gpu-alloc shim is already running on {path}"
        ):
            listener.claim(path, "gpu-alloc shim")
        assert Path(path).is_socket()


def test_the_lock_refuses_a_second_copy_before_the_socket_exists(tmp_path: Path) -> None:
    """Two copies starting at once: the second loses on the lock, not on a race to bind."""
    path = str(tmp_path / "s.sock")
    held = listener.claim(path, "gpu-alloc plugin")
    try:
        with pytest.raises(listener.AlreadyRunning, match="gpu-alloc plugin is already running"):
            listener.claim(path, "gpu-alloc plugin")
    finally:
        held.close()
    listener.claim(path, "gpu-alloc plugin").close()  # released: the next copy may start


def test_a_file_that_is_not_a_socket_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    path.write_text("not a socket")
    with pytest.raises(FileExistsError, match="not a socket"):
        listener.claim(str(path), "gpu-alloc shim")
    assert path.read_text() == "not a socket"


def test_waiting_for_a_socket_needs_it_to_answer(tmp_path: Path) -> None:
    """systemd's ExecStartPost: a stale socket file exists, but does not count as up."""
    path = str(tmp_path / "s.sock")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(path)
        assert not listener.wait_until_answers(path, 0.2)
        s.listen()
        assert listener.wait_until_answers(path, 0.2)


def test_gpu_alloc_ready_waits_for_the_socket_the_config_names(tmp_path) -> None:
    """The units' ExecStartPost: the socket's path comes from the config, not the unit."""
    sock = tmp_path / "elsewhere.sock"
    config = tmp_path / "config.yaml"
    config.write_text(f"shim:\n  socket: {sock}\nplugin:\n  socket: {tmp_path / 'p.sock'}\n")
    argv = [sys.executable, "-m", "allocator.ops.cli", "--config", str(config), "ready"]
    late = subprocess.run([*argv, "shim", "--timeout", "0.2"], capture_output=True, text=True)
    assert late.returncode == 1 and f"{sock} did not answer within 0.2 s" in late.stderr
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(sock))
        s.listen()
        assert subprocess.run([*argv, "shim", "--timeout", "5"]).returncode == 0
