"""Paths resolved inside another process's root, as dockerd resolves them in its own."""

from __future__ import annotations

import pytest

from allocator.core.access import inroot
from allocator.core.access.facts import Unresolvable


def links(table: dict[str, str]):
    return table.get


def test_an_absolute_link_starts_again_at_the_root_not_at_ours():
    readlink = links({"/home/u/link": "/var/lib/gpu-alloc"})
    assert inroot.resolve("/home/u/link/state.json", readlink) == "/var/lib/gpu-alloc/state.json"


def test_a_relative_link_is_read_from_its_own_directory():
    readlink = links({"/tmp/a/link": "../b/c"})
    assert inroot.resolve("/tmp/a/link/d", readlink) == "/tmp/b/c/d"


def test_dot_dot_at_the_root_stays_at_the_root():
    assert inroot.resolve("/../../etc/../../dev", links({})) == "/dev"
    readlink = links({"/x": "../../../../var/lib/docker"})
    assert inroot.resolve("/x", readlink) == "/var/lib/docker"


def test_dot_dot_after_a_link_climbs_from_its_target():
    readlink = links({"/tmp/link": "/var/lib/gpu-alloc/sub"})
    assert inroot.resolve("/tmp/link/..", readlink) == "/var/lib/gpu-alloc"


def test_a_chain_of_links_is_followed_to_its_end():
    chain = {f"/tmp/l{i}": f"/tmp/l{i + 1}" for i in range(30)}
    chain["/tmp/l30"] = "/run/docker"
    assert inroot.resolve("/tmp/l0", links(chain)) == "/run/docker"


def test_a_relative_path_starts_at_dockerds_working_directory():
    assert inroot.resolve("data/../dev", links({}), cwd="/srv") == "/srv/dev"
    assert inroot.resolve("link", links({"/srv/link": "/dev"}), cwd="/srv") == "/dev"


def test_what_does_not_exist_is_kept_as_spelled():
    assert inroot.resolve("/nowhere/./x//y", links({})) == "/nowhere/x/y"


@pytest.mark.parametrize(
    "table",
    [{"/a": "/a"}, {"/a": "/b", "/b": "/a"}, {"/a": "a/x"}],
    ids=["self", "pair", "growing"],
)
def test_a_link_loop_cannot_be_resolved(table):
    with pytest.raises(Unresolvable, match="more than 40 links"):
        inroot.resolve("/a", links(table))


def test_forty_links_resolve_and_forty_one_do_not():
    chain = {f"/l{i}": f"/l{i + 1}" for i in range(41)}
    assert inroot.resolve("/l1", links(chain)) == "/l41"
    with pytest.raises(Unresolvable):
        inroot.resolve("/l0", links(chain))


@pytest.mark.parametrize(
    "path",
    [
        "/proc/4242/root/l",
        "/proc/self/cwd/x",
        "/dev/fd/3/y",
        "/proc/1/fd/5",
        "/proc/4242/../4242/root",
    ],
)
def test_a_link_in_proc_cannot_be_judged_by_its_text(path):
    # /proc/<pid>/root reads as "/" but leads into that process's own root, where an
    # absolute link is then followed from dockerd's: its text says nothing of where it goes.
    table = {
        "/proc/4242/root": "/",
        "/proc/self": "4242",
        "/proc/4242/cwd": "/",
        "/dev/fd": "/proc/self/fd",
        "/proc/4242/fd/3": "/tmp/x",
        "/proc/1/fd/5": "/etc",
    }
    with pytest.raises(Unresolvable, match=r"a link in /proc .*name the path itself"):
        inroot.resolve(path, links(table))


def test_proc_itself_and_plain_files_in_it_resolve():
    assert inroot.resolve("/proc/4242/status", links({})) == "/proc/4242/status"
    assert inroot.resolve("/proc", links({})) == "/proc"
