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


def stat_line(pid: int, comm: str, start_ticks: int) -> str:
    """/proc/<pid>/stat with starttime (field 22) set and every other field zero."""
    after = ["S"] + ["0"] * 18 + [str(start_ticks)] + ["0"] * 30
    return f"{pid} ({comm}) " + " ".join(after) + "\n"


def test_a_start_is_placed_by_the_boot_s_fraction_of_a_second_too(tmp_path):
    """The host booted at 1000.99 (btime says 1000) and dockerd started 5 s later, at
    1005.99; daemon.json was written at 1005.5, before it: that is no late edit, as a
    start placed by btime (1005.0) would have said."""
    tick = os.sysconf("SC_CLK_TCK")
    proc = fake_proc(tmp_path, {4242: ("dockerd", ["dockerd"])})
    (tmp_path / "proc" / "4242" / "stat").write_text(stat_line(4242, "dockerd", 5 * tick))
    (tmp_path / "proc" / "stat").write_text("cpu  1 2 3 4\nbtime 1000\n")  # whole seconds
    boot = 1000.99
    born = dockerd.started(4242, proc, clocks=lambda: (boot + 3600.0, 3600.0))
    assert born == pytest.approx(1005.99)
    assert not dockerd.after_start(1005.5, born)
    assert dockerd.after_start(1006.5, born)


def test_a_file_stamped_within_a_tick_of_the_start_was_read_by_it(tmp_path):
    """The start's ticks are truncated, so it reads up to one tick early."""
    born = 2000.0
    assert not dockerd.after_start(born + 1 / os.sysconf("SC_CLK_TCK"), born)
    assert dockerd.after_start(born + 0.5, born)


def test_a_name_with_a_parenthesis_does_not_move_the_start(tmp_path):
    proc = fake_proc(tmp_path, {7: ("a) b", ["x"])})
    (tmp_path / "proc" / "7" / "stat").write_text(stat_line(7, "a) b", 0))
    assert dockerd.started(7, proc, clocks=lambda: (50.0, 10.0)) == pytest.approx(40.0)


def test_a_process_gone_has_no_start(tmp_path):
    assert dockerd.started(99, str(tmp_path), clocks=lambda: (50.0, 10.0)) is None
