"""Which daemon.json dockerd reads, from a /proc laid out as the kernel lays it out."""

from __future__ import annotations

import os

import pytest

from allocator.host import dockerd


def fake_proc(tmp_path, procs: dict[int, tuple[str, list[str]]]) -> str:
    proc = tmp_path / "proc"
    for pid, (comm, args) in procs.items():
        d = proc / str(pid)
        d.mkdir(parents=True)
        (d / "comm").write_text(comm + "\n")
        (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in args) + b"\0")
        os.symlink("/srv/docker", d / "cwd")
        os.symlink("/", d / "root")
    return str(proc)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["dockerd", "-H", "fd://"], "/etc/docker/daemon.json"),
        (["dockerd", "--config-file", "/opt/d.json"], "/opt/d.json"),
        (["dockerd", "--config-file=/opt/d.json"], "/opt/d.json"),
        (["dockerd", "--config-file=/a.json", "--config-file", "/b.json"], "/b.json"),
        (["dockerd", "--config-file=d.json"], "/srv/docker/d.json"),
    ],
    ids=["default", "spaced", "equals", "last-wins", "relative"],
)
def test_the_config_file_is_read_as_dockerd_reads_its_flags(tmp_path, args, named):
    proc = fake_proc(tmp_path, {1: ("systemd", ["/sbin/init"]), 4242: ("dockerd", args)})
    found = dockerd.config_file(str(tmp_path / "no.sock"), proc)
    assert found is not None
    assert found[0] == named
    assert str(found[1]) == f"{proc}/4242/root{named}"


def test_two_dockerds_and_a_socket_that_names_neither_tell_nothing(tmp_path):
    proc = fake_proc(tmp_path, {10: ("dockerd", ["dockerd"]), 11: ("dockerd", ["dockerd"])})
    assert dockerd.config_file(str(tmp_path / "no.sock"), proc) is None
