"""Live use read from the host's facts (allocator/core/machine/usage.py): a process's container,
the idle mark."""

from __future__ import annotations

import pytest

from allocator.core.machine.usage import Process, Usage, container_of_cgroup, idle_since, known

CID = "c0ffee" + "0" * 58


@pytest.mark.parametrize(
    "text",
    [
        f"0::/system.slice/docker-{CID}.scope\n",  # cgroup v2, systemd driver
        f"0::/docker/{CID}\n",  # cgroup v2, cgroupfs driver
        f"12:memory:/docker/{CID}\n11:cpu:/docker/{CID}\n",  # cgroup v1
        f"0::/docker/{CID}/init.scope\n",  # a container running systemd
    ],
)
def test_a_process_cgroup_names_its_container(text: str) -> None:
    assert container_of_cgroup(text) == CID


def test_a_host_process_has_no_container() -> None:
    assert container_of_cgroup("0::/user.slice/user-1000.slice/session-2.scope\n") is None


def test_idle_counts_from_the_later_of_grant_and_last_use() -> None:
    assert idle_since(100.0, None, False, 159.0, 60.0) is None
    assert idle_since(100.0, None, False, 160.0, 60.0) == 100.0
    assert idle_since(100.0, 150.0, False, 200.0, 60.0) is None
    assert idle_since(100.0, 150.0, False, 210.0, 60.0) == 150.0
    assert idle_since(100.0, None, True, 1e9, 60.0) is None


@pytest.mark.parametrize(
    "use, expected",
    [
        (Usage(utilization=0.0), "unused"),
        (Usage(utilization=0.2), "active"),
        (Usage(utilization=None, processes=(Process(7),)), "active"),
        # 30 GB used and 250 W, but no utilisation figure: not known to be unused
        (Usage(utilization=None, memory_used_bytes=30 << 30, power_w=250.0), "unknown"),
        (Usage(utilization=0.0, processes_read=False), "unknown"),
        (Usage(), "unknown"),
    ],
)
def test_only_a_gpu_read_as_running_nothing_at_zero_is_unused(use: Usage, expected: str) -> None:
    assert use.use == expected
    assert (use.use != "unknown") == bool(known({"G": use}))
