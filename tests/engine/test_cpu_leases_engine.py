"""CPU leases on the real Engine, with the docker CLI through the shim.

dockerd checks ``CpusetCpus`` against the host's own CPUs, so here the CPU
topology is this machine's real sysfs (the default ``sysfs: /sys``); the 8-core
case on a 2-socket machine runs through the real interceptor in test_cpu_leases.py.
"""

from __future__ import annotations

import json
import os
import subprocess

from allocator.core.machine.cpus import format_list, parse_list
from allocator.host import cpus as host_cpus
from tests.support import engine
from tests.support.engine import gpu_alloc


def shim(stack: engine.Stack, *args: str) -> subprocess.CompletedProcess:
    return engine.docker_cli(stack.shim_sock, *args)


def host_config(stack: engine.Stack, name: str) -> dict:
    out = shim(stack, "inspect", "--format", "{{json .HostConfig}}", name)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_dockerd_itself_refuses_a_cpuset_naming_cpus_the_host_lacks(stack: engine.Stack) -> None:
    out = shim(
        stack, "create", "--cpuset-cpus", f"0-{os.cpu_count() or 1}", engine.BUSYBOX_TAG, "true"
    )
    assert out.returncode != 0 and "Requested CPUs are not available" in out.stderr


def test_a_gpu_container_gets_whole_cores_of_its_gpus_node_and_keeps_them(
    stack: engine.Stack,
) -> None:
    node = host_cpus.read("/sys").nodes[0]
    first = node.cores[0]
    out = shim(stack, "run", "-d", "--name", "cores", "--gpus", "2", "--label",
               "io.gpu-alloc.request.cpus=1", engine.BUSYBOX_TAG, "sleep", "60")  # fmt: skip
    try:
        assert out.returncode == 0, out.stderr
        hc = host_config(stack, "cores")
        assert parse_list(hc["CpusetCpus"]) == list(first)
        env = shim(stack, "inspect", "--format", "{{json .Config.Env}}", "cores").stdout
        assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in json.loads(env)
        moved = shim(stack, "update", "--cpuset-cpus", "0", "cores")
        assert moved.returncode != 0
        assert "CpusetCpus of cores were leased with its GPUs" in moved.stderr
        assert shim(stack, "update", "--restart", "always", "cores").returncode == 0
        assert (
            engine.docker_cli(stack.engine_sock, "update", "--cpuset-cpus", "0", "cores").returncode
            != 0
        )
    finally:
        shim(stack, "rm", "-f", "cores")


def test_a_reset_ledger_keeps_an_adopted_containers_cores_from_the_next_lease(
    stack: engine.Stack,
) -> None:
    asked = ("--gpus", "1", "--label", "io.gpu-alloc.request.cpus=1", engine.BUSYBOX_TAG)
    out = shim(stack, "run", "-d", "--name", "kept", *asked, "sleep", "60")
    try:
        assert out.returncode == 0, out.stderr
        kept = set(parse_list(host_config(stack, "kept")["CpusetCpus"]))
        found = shim(stack, "inspect", "--format", "{{json .Config.Labels}}", "kept").stdout
        assert json.loads(found)["io.gpu-alloc.placed"] == "cpus"
        reset = gpu_alloc(stack, "repair", "--reset")
        assert reset.returncode == 0 and "adopted 1 container" in reset.stdout, reset.stderr
        table = gpu_alloc(stack, "status", "--no-reconcile").stdout
        assert f"'kept': CPUs {format_list(kept)}" in table, table
        snap = json.loads(gpu_alloc(stack, "status", "--json", "--no-reconcile").stdout)
        (holder,) = snap["holders"]
        assert holder["owner"] == {"uid": os.getuid(), "user": "root"}  # still counts as theirs

        after = shim(stack, "run", "-d", "--name", "next", *asked, "sleep", "60")
        if after.returncode == 0:  # a host of two cores or more: the other one
            assert not set(parse_list(host_config(stack, "next")["CpusetCpus"])) & kept
        else:
            assert "not enough free CPU cores" in after.stderr, after.stderr
        moved = shim(stack, "update", "--cpuset-cpus", "0", "kept")
        assert moved.returncode != 0
        assert "CpusetCpus of kept were leased with its GPUs (adopted after a repair)" in (
            moved.stderr
        )
    finally:
        shim(stack, "rm", "-f", "kept", "next")
