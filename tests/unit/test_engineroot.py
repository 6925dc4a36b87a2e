"""Paths asked of dockerd's root through a /proc laid out as the kernel lays it out."""

from __future__ import annotations

import os
import shutil

import pytest

from allocator.core.access import access
from allocator.core.access.access import EngineView
from allocator.core.access.facts import Unresolvable
from allocator.core.access.grants import Refusal
from allocator.core.machine.inventory import Inventory
from allocator.host.engineroot import EngineRoot
from allocator.host.filesystem import Host


def dockerd_at(proc, pid: int, root, started: int = 100) -> None:
    """A dockerd whose root (as a chroot's) is ``root`` and whose cwd is that root."""
    d = proc / str(pid)
    d.mkdir(parents=True)
    (d / "comm").write_text("dockerd\n")
    (d / "stat").write_text(f"{pid} (dockerd) S " + " ".join(["0"] * 18) + f" {started} 0 0\n")
    (d / "mountinfo").write_text("1 0 8:1 / / rw - ext4 /dev/sda1 rw\n")
    os.symlink(root, d / "root")
    os.symlink(root, d / "cwd")


@pytest.fixture
def chroot(tmp_path):
    """dockerd's root: a state directory the host does not have, and links to it."""
    root = tmp_path / "root"
    (root / "srv/ga-state").mkdir(parents=True)
    (root / "home/u").mkdir(parents=True)
    os.symlink("/srv/ga-state", root / "home/u/link")  # absolute: from dockerd's root
    os.symlink("../../srv", root / "home/u/rel")
    return root


def test_an_absolute_link_resolves_inside_dockerds_root(tmp_path, chroot):
    dockerd_at(tmp_path / "proc", 4242, chroot)
    root = EngineRoot(str(tmp_path / "no.sock"), str(tmp_path / "proc"))
    assert not os.path.exists("/srv/ga-state")  # only dockerd sees it
    assert root.resolve("/home/u/link/x") == "/srv/ga-state/x"
    assert root.resolve("/home/u/rel/ga-state") == "/srv/ga-state"
    assert root.resolve("home/u/link") == "/srv/ga-state"  # from its cwd, its root here
    assert Host(engine=root).node("/home/u/link").kind == "dir"


def test_a_bind_through_the_link_exposes_what_it_reaches_in_dockerds_root(tmp_path, chroot):
    dockerd_at(tmp_path / "proc", 4242, chroot)
    host = Host(protected=("/srv/ga-state",), engine=EngineRoot("/no.sock", str(tmp_path / "proc")))
    body = {"HostConfig": {"Binds": ["/home/u/link:/x"]}}
    (grant,) = access.of_container(body, EngineView(), Inventory(()), host).grants
    assert grant.detail == "bind mount of /home/u/link exposes /srv/ga-state"


def test_a_dockerd_started_again_is_found_again(tmp_path, chroot):
    proc = tmp_path / "proc"
    dockerd_at(proc, 4242, chroot)
    root = EngineRoot("/no.sock", str(proc))
    assert root.pid() == 4242
    shutil.rmtree(proc / "4242")
    dockerd_at(proc, 5151, chroot)
    assert root.pid() == 5151
    shutil.rmtree(proc / "5151")
    dockerd_at(proc, 5151, chroot, started=900)  # the same pid, another process
    (proc / "5151/root").unlink()
    os.symlink(tmp_path / "nowhere", proc / "5151/root")
    with pytest.raises(Unresolvable, match="cannot be read here"):
        root.resolve("/home/u/link")


def test_an_unreadable_root_refuses_binds_and_devices_and_says_why(tmp_path):
    dockerd_at(tmp_path / "proc", 4242, tmp_path / "nowhere")
    host = Host(engine=EngineRoot("/no.sock", str(tmp_path / "proc")))
    for hc in ({"Binds": ["/data:/x"]}, {"Devices": [{"PathOnHost": "/dev/null"}]}):
        with pytest.raises(Refusal, match=r"cannot be judged: dockerd's root .* cannot be read"):
            access.of_create({"HostConfig": hc}, EngineView(), Inventory(()), host)
    plain = {"HostConfig": {"Binds": ["named:/x"]}}
    assert access.of_create(plain, EngineView(), Inventory(()), host, volume_of=lambda _: None).none


def test_no_dockerd_to_be_found_refuses_binds(tmp_path):
    (tmp_path / "proc").mkdir()
    with pytest.raises(Unresolvable, match="no dockerd process answers"):
        EngineRoot(str(tmp_path / "no.sock"), str(tmp_path / "proc")).resolve("/data")
