"""Whose a shim connection is, by the peer's cgroup and the container it names: the pure
decision (allocator/core/judging/owners.py) and its reads (allocator/host/owners.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from allocator.core.judging import owners
from allocator.core.judging.owners import Asker, Container
from allocator.core.rules.policy import NOBODY, Owner
from allocator.host import owners as host_owners
from allocator.host.peers import Peer
from tests.support.fake_engine import FakeEngine

ALICE_C = "a" * 64
OTHER_C = "b" * 64
ALICES = (1001, "alice")  # the ledger's owner of the lease bound to her container

# One container as each driver and cgroup version spells it: (its first process's
# cgroup file, a process in it by `docker exec`).
SPELLINGS = {
    "cgroupfs v2": f"0::/docker/{ALICE_C}\n",
    "systemd v2": f"0::/system.slice/docker-{ALICE_C}.scope\n",
    "custom parent v2": f"0::/ga-test-7/{ALICE_C}\n",
    "cgroupfs v1": (
        f"12:pids:/docker/{ALICE_C}\n4:memory:/docker/{ALICE_C}\n"
        f"3:cpu,cpuacct:/docker/{ALICE_C}\n1:name=systemd:/docker/{ALICE_C}\n0::/\n"
    ),
    "systemd v1": (
        f"4:memory:/system.slice/docker-{ALICE_C}.scope\n"
        f"1:name=systemd:/system.slice/docker-{ALICE_C}.scope\n0::/system.slice/docker.service\n"
    ),
}


def alices(cgroup: str | None, leased: tuple | None = ALICES) -> Container:
    return Container(ALICE_C, leased, cgroup)


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_a_root_process_in_alices_container_is_alice(spelling):
    cgroup = SPELLINGS[spelling]
    assert owners.container_in(cgroup) == ALICE_C
    got = owners.asker(0, 0, cgroup, alices(cgroup))
    assert (got.uid, got.gid, got.user) == (1001, None, "alice")


def test_a_sub_cgroup_of_the_container_is_still_the_container():
    got = owners.asker(
        0, 0, f"0::/docker/{ALICE_C}/init.scope\n", alices(f"0::/docker/{ALICE_C}\n")
    )
    assert got.uid == 1001


def test_a_host_process_is_its_own_uid_and_gid():
    for cgroup in ("0::/user.slice/user-1002.slice/session-4.scope\n", "4:memory:/\n0::/\n"):
        assert owners.container_in(cgroup) is None
        assert owners.asker(1002, 1003, cgroup, None) == Asker(1002, 1003, why="a host process")


@pytest.mark.parametrize(
    "cgroup", [None, "", "garbage", "0:/docker\n", "x::/docker\n", f"0::docker/{ALICE_C}\n"]
)
def test_an_unreadable_or_garbled_cgroup_is_unknown_never_the_uid(cgroup):
    got = owners.asker(0, 0, cgroup, None)
    assert got.uid is None and got.user == "unknown"


def test_a_cgroup_naming_two_containers_is_unknown():
    cgroup = f"4:memory:/docker/{ALICE_C}\n0::/docker/{OTHER_C}\n"
    assert owners.container_in(cgroup) is None
    assert owners.asker(0, 0, cgroup, alices(f"0::/docker/{ALICE_C}\n")).uid is None


def test_a_container_the_engine_does_not_know_is_unknown():
    assert owners.asker(0, 0, f"0::/docker/{ALICE_C}\n", None).uid is None


def test_a_delegated_cgroup_named_after_alices_container_is_not_alices():
    """bob may make cgroups under his own systemd delegation and call them anything."""
    fake = f"0::/user.slice/user-1002.slice/user@1002.service/docker-{ALICE_C}.scope\n"
    assert owners.asker(1002, 1002, fake, alices(SPELLINGS["systemd v2"])).uid is None


def test_a_stopped_container_holds_no_process():
    assert owners.asker(0, 0, f"0::/docker/{ALICE_C}\n", alices(None)).uid is None


def test_a_container_holding_no_lease_is_unknown_whatever_its_labels():
    """Labels prove nothing: dockerd merges an image's (`LABEL io.gpu-alloc.owner=0:root`)
    into every container made from it.  Only the ledger's lease names an owner."""
    cgroup = f"0::/docker/{ALICE_C}\n"
    assert owners.asker(0, 0, cgroup, alices(cgroup, None)).uid is None
    assert owners.asker(0, 0, cgroup, alices(cgroup, (None, "unknown"))).uid is None


def test_the_owner_carries_over_to_what_a_container_creates():
    """A container made from inside alice's container is leased as alice's; a process in
    that one is alice's again, whatever uid it runs as."""
    cgroup = f"0::/docker/{OTHER_C}\n"
    nested = Container(OTHER_C, ALICES, cgroup)
    assert owners.asker(4242, 4242, cgroup, nested).uid == 1001


def proc_with(tmp_path, cgroups: dict[int, str]) -> str:
    for pid, text in cgroups.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(text)
    return str(tmp_path)


def live_peer(pid: int, uid: int = 0) -> Peer:
    return Peer(pid, uid, uid, os.pidfd_open(os.getpid()))


def test_each_container_is_inspected_once_and_each_connection_decided_once(tmp_path):
    engine = FakeEngine()
    forged = {"io.gpu-alloc.lease": "l-1", "io.gpu-alloc.owner": "0:root"}  # an image's
    engine.add("alices", cid=ALICE_C, labels_=forged, pid=900)
    cgroup = f"0::/docker/{ALICE_C}\n"
    asked = []

    def leased(cid: str):
        asked.append(cid)
        return ALICES if cid == ALICE_C else None

    proc = proc_with(tmp_path, {900: cgroup, 901: cgroup})
    found = host_owners.Owners(engine, leased, proc)  # type: ignore[arg-type]
    first, second = live_peer(901), live_peer(901)
    try:
        assert found.of(first).uid == found.of(second).uid == found.of(first).uid == 1001
        assert engine.inspected == [ALICE_C] and asked == [ALICE_C]
        assert first.asker is not None and first.asker.uid == 1001
    finally:
        first.close()
        second.close()


def test_a_peer_that_exited_before_its_cgroup_was_read_is_unknown(tmp_path):
    """Its pid may be another process's by now: what /proc says under it proves nothing."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    peer = Peer(child.pid, 0, 0, os.pidfd_open(child.pid))
    child.wait()
    proc = proc_with(tmp_path, {child.pid: "0::/\n"})
    try:
        assert host_owners.Owners(None, lambda cid: None, proc).of(peer) == NOBODY
    finally:
        peer.close()


def test_a_host_peer_is_named_by_nss(tmp_path):
    peer = live_peer(902)
    try:
        got = host_owners.Owners(None, lambda cid: None, proc_with(tmp_path, {902: "0::/\n"})).of(
            peer
        )
        assert got == Owner(0, "root", got.groups) and "root" in got.groups
    finally:
        peer.close()


def test_a_peer_the_shim_may_not_signal_still_counts_as_running(monkeypatch):
    """The shim's unit has no CAP_KILL: probing another user's process is EPERM, and
    only a process that is gone answers ESRCH."""
    import signal

    def refuse(fd: int, sig: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    peer = live_peer(os.getpid())
    try:
        monkeypatch.setattr(signal, "pidfd_send_signal", refuse)
        assert peer.alive()
    finally:
        peer.close()
    assert not peer.alive()
