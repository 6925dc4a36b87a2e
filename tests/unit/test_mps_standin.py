"""The ``nvidia-cuda-mps-control`` stand-in behaves as NVIDIA documents the real one
(tests/support/mps_control.py cites where each behaviour comes from), alone and driven
by gpu-alloc's `allocator.host.mps.Daemons`: a test that passes on it does not hide a
command the real daemon would refuse."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from allocator.host import mps as host_mps
from tests.support import mps_control

UUID = "GPU-0"  # short: a control socket's path must fit AF_UNIX's 108 bytes


@pytest.fixture
def control(tmp_path):
    """The stand-in, recording in ``calls.log``; any daemon it started quits after."""
    path = mps_control.install(tmp_path / "nvidia-cuda-mps-control", tmp_path / "calls.log")
    yield path
    mps_control.quit_all(tmp_path)


def run(control: Path, pipe: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
           "CUDA_MPS_LOG_DIRECTORY": str(pipe.parent / "log")}  # fmt: skip
    return subprocess.run([str(control), *args], input=stdin, env=env, text=True,
                          capture_output=True, timeout=30)  # fmt: skip


# (stdin to a running daemon, exit status, stdout): the documented commands and forms
COMMANDS = [
    ("get_server_list\n", 0, ""),  # no client yet: no server
    ("get_default_active_thread_percentage\n", 0, "100.0\n"),  # "The default is 100"
    ("set_default_active_thread_percentage 25\n", 0, ""),
    (
        "set_default_active_thread_percentage 25\nget_default_active_thread_percentage\n",
        0,
        "25.0\n",
    ),
    ("set_default_active_thread_percentage 0\n", 1, ""),
    ("set_default_active_thread_percentage 120\n", 1, ""),
    ("set_default_active_thread_percentage 25%\n", 1, ""),
    ("set_default_device_pinned_mem_limit 0 20480M\n", 0, ""),
    (
        "set_default_device_pinned_mem_limit 0 10G\nget_default_device_pinned_mem_limit 0\n",
        0,
        "10G\n",
    ),
    ("set_default_device_pinned_mem_limit 0 20480\n", 1, ""),  # no M/G qualifier
    ("set_default_device_pinned_mem_limit 0 20480MB\n", 1, ""),
    ("set_default_device_pinned_mem_limit 20480M\n", 1, ""),  # no device
    ("set_default_device_pinned_mem_limit GPU-0 20480M\n", 1, ""),  # by index, never UUID
    ("no_such_command\n", 1, ""),
]


@pytest.mark.parametrize("stdin,status,out", COMMANDS)
def test_a_running_daemon_takes_the_documented_commands_and_refuses_others(
    control, tmp_path, stdin, status, out
):
    pipe = tmp_path / "pipe"
    assert run(control, pipe, "-d").returncode == 0
    done = run(control, pipe, stdin=stdin)
    assert (done.returncode, done.stdout) == (status, out), done.stderr


def test_d_starts_a_daemon_with_its_socket_pid_file_and_control_log_then_returns(control, tmp_path):
    pipe = tmp_path / "pipe"
    assert run(control, pipe, "-d").returncode == 0
    assert (pipe / "control").is_socket()
    pid = int((pipe / "nvidia-cuda-mps-control.pid").read_text())
    assert Path(f"/proc/{pid}").exists()
    log = (tmp_path / "log" / "control.log").read_text()
    assert f"Starting control daemon using socket {pipe}/control" in log
    assert f"set env CUDA_MPS_PIPE_DIRECTORY={pipe}" in log


def test_a_second_d_for_the_same_pipe_directory_fails(control, tmp_path):
    pipe = tmp_path / "pipe"
    assert run(control, pipe, "-d").returncode == 0
    assert run(control, pipe, "-d").returncode == 1


def test_a_command_with_no_daemon_fails_saying_it_finds_none(control, tmp_path):
    done = run(control, tmp_path / "pipe", stdin="get_server_list\n")
    assert done.returncode == 1
    assert done.stdout.strip() == "Cannot find MPS control daemon process"


def test_quit_stops_the_daemon_and_removes_its_socket_and_defaults(control, tmp_path):
    pipe = tmp_path / "pipe"
    run(control, pipe, "-d")
    run(control, pipe, stdin="set_default_active_thread_percentage 25\n")
    assert run(control, pipe, stdin="quit\n").returncode == 0
    assert not (pipe / "control").exists()
    assert run(control, pipe, stdin="get_server_list\n").returncode == 1
    run(control, pipe, "-d")  # "The set value is lost if a quit command is executed"
    assert run(control, pipe, stdin="get_default_active_thread_percentage\n").stdout == "100.0\n"


def test_get_server_list_prints_each_server_pid_and_quit_ends_them(control, tmp_path):
    pipe = tmp_path / "pipe"
    run(control, pipe, "-d")
    assert run(control, pipe, stdin=f"start_server -uid {os.getuid()}\n").returncode == 0
    [pid] = run(control, pipe, stdin="get_server_list\n").stdout.split()
    assert Path(f"/proc/{pid}").exists()
    run(control, pipe, stdin="quit\n")
    assert not Path(f"/proc/{pid}").exists()


def test_each_call_and_command_is_recorded_for_the_tests(control, tmp_path):
    pipe = tmp_path / "pipe"
    run(control, pipe, "-d")
    run(control, pipe, stdin="quit\n")
    assert (tmp_path / "calls.log").read_text().splitlines() == [
        f"call gpu= pipe={pipe} args=-d",
        f"call gpu= pipe={pipe} args=",
        "cmd gpu= quit",
    ]


@pytest.fixture
def daemons(control, tmp_path, monkeypatch):
    """gpu-alloc's daemons on the stand-in, started as ``control -d`` (the unshare or
    systemd-run around it needs root and is pinned in test_sharing.py)."""
    monkeypatch.setattr(
        host_mps, "launch", lambda uuid, top, control, env, systemd: [control, "-d"]
    )
    return host_mps.Daemons(str(tmp_path / "mps"), control=str(control))


def ask(control: Path, daemons: host_mps.Daemons, stdin: str) -> str:
    env = daemons.env(UUID)
    return subprocess.run([str(control)], input=stdin, env=env, text=True,
                          capture_output=True, check=True).stdout  # fmt: skip


def test_gpu_alloc_starts_a_daemon_sets_its_caps_quits_it_and_starts_it_again(
    control, daemons, tmp_path
):
    caps = [
        "set_default_device_pinned_mem_limit 0 20480M",
        "set_default_active_thread_percentage 25",
    ]
    daemons.start(UUID, caps)
    assert daemons.running() == {UUID}
    assert (tmp_path / "mps" / UUID / "pipe" / "control").is_socket()
    assert (tmp_path / "mps" / UUID / "log" / "control.log").exists()
    query = "get_default_device_pinned_mem_limit 0\nget_default_active_thread_percentage\n"
    assert ask(control, daemons, query) == "20480M\n25.0\n"
    daemons.stop(UUID)
    assert daemons.running() == set()
    assert not (tmp_path / "mps" / UUID / "pipe" / "control").exists()
    daemons.start(UUID, caps)  # a share after the last one ended
    assert daemons.running() == {UUID}


def test_gpu_alloc_refuses_a_start_whose_caps_the_daemon_refuses_and_leaves_none(
    control, daemons, tmp_path, monkeypatch
):
    monkeypatch.setattr(host_mps, "READY_TRIES", 2)  # a refusal is retried as "not ready"
    with pytest.raises(host_mps.MpsError, match="exited 1"):
        daemons.start(UUID, ["set_default_device_pinned_mem_limit 0 20480"])
    assert daemons.running() == set()
    assert not (tmp_path / "mps" / UUID / "pipe" / "control").exists()
