"""Cores and memory leased with GPUs, through the shim's real interceptor and the plugin.

The machine: a DGX-like board (GPUs 0-3 on NUMA node 0, 4-7 on node 1) on a
2-socket host with 8 physical cores of 2 threads per node (node 0: CPUs 0-7 and
their siblings 16-23; node 1: 8-15 and 24-31) and 64 GiB per node.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from allocator.core.api import labels
from allocator.core.machine.cpus import parse_list
from allocator.host import config as configmod
from allocator.ops.status import render_json, render_table
from allocator.service.views import status
from allocator.service.wiring import Allocator
from plugin.app import create_dispatcher
from shim.create import CreateInterceptor
from shim.framing import Response
from tests.root.test_enforcement import DEVDIR, World
from tests.support import engine
from tests.support.enforcement_cases import body, make_nodes, request
from tests.support.sysfs import GIB, two_socket

NODE0 = set(range(0, 8)) | set(range(16, 24))
NODE1 = set(range(8, 16)) | set(range(24, 32))


class Machine(World):
    def __init__(self, root: Path, reserved: str = "") -> None:
        super().__init__(root, gpus=8)
        gpus = yaml.safe_load((root / "gpus.yaml").read_text())
        for g in gpus:  # a DGX-like board: NVSwitch, PCIe switch pairs
            g["numa_node"] = g["index"] // 4
            g["pcie_switch"] = f"sw{g['index'] // 2}"
            g["nvlinks"] = {p: 12 for p in range(8) if p != g["index"]}
        (root / "gpus.yaml").write_text(yaml.safe_dump(gpus))
        cfg = yaml.safe_load((root / "config.yaml").read_text())
        cfg |= {"sysfs": str(two_socket(root / "sys")), "policy": {"reserved_cpus": reserved}}
        (root / "config.yaml").write_text(yaml.safe_dump(cfg))
        self.config = configmod.load(str(root / "config.yaml"))
        self.alloc = Allocator(self.config)
        self.plugin = create_dispatcher(self.config, self.alloc)
        self.shim = CreateInterceptor(self.alloc)

    def create(self, gpus: int = 2, hc: dict | None = None, **asked: str) -> Response:
        request_labels = {labels.PREFIX + "request." + k: v for k, v in asked.items()}
        hc = ({"DeviceRequests": [request(gpus)]} if gpus else {}) | (hc or {})
        return self.via_shim(body(Labels=request_labels, HostConfig=hc))

    def forwarded_host_config(self) -> dict:
        return json.loads(self.forwarded[-1].body)["HostConfig"]

    def forwarded_env(self) -> list[str]:
        return json.loads(self.forwarded[-1].body)["Env"]


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    make_nodes(DEVDIR)
    return Machine(tmp_path)


def message(r: Response) -> str:
    return json.loads(r.body)["message"]


def test_gpus_2_with_8_cores_gets_8_physical_cores_on_the_gpus_node(machine: Machine) -> None:
    r = machine.create(2, cpus="8")
    assert r.status == 201, r.body
    hc = machine.forwarded_host_config()
    got = set(parse_list(hc["CpusetCpus"]))
    assert got == NODE0  # GPUs 0-1 are on node 0: its 8 cores with their siblings
    assert hc["DeviceRequests"][0]["DeviceIDs"] == [engine.sim_gpu_uuid(0), engine.sim_gpu_uuid(1)]
    lease = next(iter(machine.alloc.ledger.read().leases.values()))
    assert set(lease.cpus) == NODE0
    # what a repair that lost the lease reads back: the cpuset was gpu-alloc's
    assert json.loads(machine.forwarded[-1].body)["Labels"][labels.PLACED] == "cpus"


def test_leased_cores_are_never_given_twice(machine: Machine) -> None:
    seen: set[int] = set()
    for _ in range(4):
        assert machine.create(2, cpus="4").status == 201
        got = set(parse_list(machine.forwarded_host_config()["CpusetCpus"]))
        assert len(got) == 8 and not got & seen
        seen |= got
    assert seen == NODE0 | NODE1


def test_the_reserved_cores_are_never_leased(tmp_path: Path) -> None:
    make_nodes(DEVDIR)
    machine = Machine(tmp_path, reserved="0-1")
    assert machine.create(2, cpus="6").status == 201
    got = set(parse_list(machine.forwarded_host_config()["CpusetCpus"]))
    assert got == NODE0 - {0, 1, 16, 17}  # cores 0 and 1 with their siblings stay out
    r = machine.create(2, cpus="1", topology="strict")
    assert r.status == 409 and "not enough free CPU cores" in message(r)


def test_strict_refuses_when_the_gpus_node_is_short_and_prefer_spills(machine: Machine) -> None:
    r = machine.create(2, cpus="9", topology="strict")
    assert r.status == 409, r.body
    assert "asked for 9 physical cores on the GPUs' NUMA node (0)" in message(r)
    assert machine.alloc.ledger.read().leases == {}  # the GPUs were not leased either
    assert machine.create(2, cpus="9").status == 201
    got = set(parse_list(machine.forwarded_host_config()["CpusetCpus"]))
    assert got >= NODE0 and len(got & NODE1) == 2


def test_memory_is_admitted_against_the_nodes_size(machine: Machine) -> None:
    assert machine.create(2, memory="48g", topology="strict").status == 201
    hc = machine.forwarded_host_config()
    assert (hc["Memory"], hc["CpusetMems"]) == (48 * GIB, "0")
    r = machine.create(2, memory="24g", topology="strict")  # 0-1 taken: GPUs 2-3, node 0 again
    assert r.status == 409 and "not enough free memory" in message(r)
    r = machine.create(2, memory="65g")
    assert r.status == 409 and "asked for 65 GiB" in message(r)


def test_a_leased_container_numbers_cuda_devices_like_nvidia_smi(machine: Machine) -> None:
    assert machine.create(1).status == 201
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in machine.forwarded_env()
    own = body(Env=["CUDA_DEVICE_ORDER=FASTEST_FIRST"], HostConfig={"DeviceRequests": [request(1)]})
    assert machine.via_shim(own).status == 201
    assert [e for e in machine.forwarded_env() if e.startswith("CUDA_DEVICE_ORDER=")] == [
        "CUDA_DEVICE_ORDER=FASTEST_FIRST"
    ]


REFUSED = {
    "cores without GPUs": (0, {}, {"cpus": "2"}, "asks for none; add --gpus"),
    "cores and the client's own cpuset": (
        2,
        {"CpusetCpus": "0-3"},
        {"cpus": "2"},
        "sets CpusetCpus and asks gpu-alloc to lease",
    ),
    "memory and the client's own --memory": (
        2,
        {"Memory": 1 << 30},
        {"memory": "2g"},
        "sets Memory and asks",
    ),
    "a malformed count": (2, {}, {"cpus": "many"}, "io.gpu-alloc.request.cpus=many: expected"),
    "a malformed topology": (2, {}, {"topology": "tight"}, "expected prefer or strict"),
}


@pytest.mark.parametrize(("gpus", "hc", "asked", "why"), REFUSED.values(), ids=REFUSED.keys())
def test_wrong_requests_are_refused_before_anything_is_leased(
    machine: Machine, gpus: int, hc: dict, asked: dict[str, str], why: str
) -> None:
    r = machine.create(gpus, hc, **asked)
    assert r.status == 400, r.body
    assert why in message(r) and message(r).startswith("gpu-alloc refused the container create")
    assert machine.forwarded == [] and machine.alloc.ledger.read().leases == {}


def test_docker_update_of_leased_cores_is_refused_other_updates_pass(machine: Machine) -> None:
    assert machine.create(2, cpus="2", memory="1g").status == 201
    cid = "c" * 64
    for field, value in (("CpusetCpus", "0-3"), ("Memory", 1 << 31), ("CpusetMems", "1")):
        answer = machine.authz(
            "POST", f"/v1.41/containers/{cid}/update", json.dumps({field: value}).encode()
        )
        assert answer["Allow"] is False, field
        assert f"{field} of {cid} were leased with its GPUs" in answer["Msg"]
    restart = json.dumps({"RestartPolicy": {"Name": "always"}}).encode()
    assert machine.authz("POST", f"/v1.41/containers/{cid}/update", restart)["Allow"] is True
    shares = json.dumps({"CpuShares": 512}).encode()
    assert machine.authz("POST", f"/v1.41/containers/{cid}/update", shares)["Allow"] is True


def test_updating_the_cpuset_of_a_container_without_a_cpu_lease_passes(machine: Machine) -> None:
    assert machine.create(2).status == 201
    update = json.dumps({"CpusetCpus": "0-3"}).encode()
    assert machine.authz("POST", f"/v1.41/containers/{'c' * 64}/update", update)["Allow"] is True


def test_status_shows_the_cores_and_memory_of_each_lease(machine: Machine) -> None:
    assert machine.create(2, cpus="2", memory="4g").status == 201
    snap = status.snapshot(machine.alloc)
    (lease,) = snap["leases"]
    assert (lease["cpus"], lease["mems"], lease["memory"]) == ([0, 1, 16, 17], [0], 4 * GIB)
    assert f"lease {lease['id']} 'job': CPUs 0-1,16-17, memory 4 GiB on node 0" in (
        render_table(snap).splitlines()
    )
    json.loads(render_json(snap))


def test_the_readmes_eight_gpu_table(machine: Machine) -> None:
    """The eight-GPU table of docs/users.md ("Placement that knows the machine")."""
    index = {engine.sim_gpu_uuid(i): i for i in range(8)}
    placed = []
    for gpus in (1, 2, 4):
        assert machine.create(gpus, cpus="4").status == 201
        hc = machine.forwarded_host_config()
        placed.append(([index[u] for u in hc["DeviceRequests"][0]["DeviceIDs"]], hc["CpusetCpus"]))
    assert placed == [
        ([0], "0-3,16-19"),
        ([2, 3], "4-7,20-23"),
        ([4, 5, 6, 7], "8-11,24-27"),
    ]


def test_an_unreadable_ledger_does_not_stop_cpuset_updates(machine: Machine) -> None:
    assert machine.create(2, cpus="2").status == 201
    machine.alloc.ledger.path.write_text("{not json")
    update = json.dumps({"CpusetCpus": "0-3"}).encode()
    assert machine.authz("POST", f"/v1.41/containers/{'c' * 64}/update", update)["Allow"] is True


def test_every_leased_create_says_what_was_placed_even_nothing(machine: Machine) -> None:
    assert machine.create(1).status == 201
    assert json.loads(machine.forwarded[-1].body)["Labels"][labels.PLACED] == ""
