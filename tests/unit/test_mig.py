"""MIG slices as leasable units: inventory, policy.mig (none, single, mixed), placement that
never grants a GPU and one of its slices at once, and access judgement of MIG ids."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from allocator.core.access import access
from allocator.core.access.facts import EngineView, Node
from allocator.core.access.grants import Refusal
from allocator.core.access.mounts import Mount
from allocator.core.judging.ask import Ask
from allocator.core.leases.holders import Holder
from allocator.core.machine.inventory import GPU, Inventory, InventoryError, MigPolicy
from allocator.core.placement import POLICIES, Shortage, place
from allocator.host import config as configmod
from allocator.host.inventory import load_file

A, B, C = "GPU-aaaa0000", "GPU-bbbb1111", "GPU-cccc2222"
A0, A1, A2 = "MIG-a0000000", "MIG-a1111111", "MIG-a2222222"
B0, B1 = "MIG-b0000000", "MIG-b1111111"


def slice_of(gpu: GPU, uuid: str, k: int, profile: str) -> GPU:
    return GPU(uuid, gpu.index, minor=gpu.minor, numa_node=gpu.numa_node, parent=gpu.uuid,
               profile=profile, mig_index=k)  # fmt: skip


GA = GPU(A, 0, minor=0, numa_node=0, mig_mode=True)
GB = GPU(B, 1, minor=1, numa_node=0, mig_mode=True)
GC = GPU(C, 2, minor=2, numa_node=0)
INV = Inventory(
    (GA, GB, GC),
    migs=(
        slice_of(GA, A0, 0, "1g.10gb"),
        slice_of(GA, A1, 1, "1g.10gb"),
        slice_of(GA, A2, 2, "3g.40gb"),
        slice_of(GB, B0, 0, "1g.10gb"),
        slice_of(GB, B1, 1, "3g.40gb"),
    ),
)
WHO = Holder("c" * 64, "job", "leased by gpu-alloc", "l1", "bound")


def ask(count: int = 0, required: tuple[str, ...] = (), profile: str = "", every: bool = False):
    return Ask(required, count, every, ("gpu",), profile)


def uuids(picked: list[GPU] | Shortage) -> list[str]:
    assert not isinstance(picked, Shortage), picked.msg
    return [g.uuid for g in picked]


# --- inventory ---------------------------------------------------------------------------------

UNITS = {
    "none: whole GPUs without MIG mode": (MigPolicy.NONE, [C]),
    "single: slices are units too": (MigPolicy.SINGLE, [C, A0, A1, A2, B0, B1]),
    "mixed: the same units, asked by profile": (MigPolicy.MIXED, [C, A0, A1, A2, B0, B1]),
}


@pytest.mark.parametrize(("mig", "units"), UNITS.values(), ids=UNITS.keys())
def test_the_units_of_each_mig_policy(mig: MigPolicy, units: list[str]) -> None:
    assert [g.uuid for g in INV.units(mig)] == units


def test_a_slice_is_named_by_uuid_prefix_or_gpu_colon_slice() -> None:
    assert INV.resolve(A1).uuid == A1
    assert INV.resolve("MIG-a111").uuid == A1
    assert INV.resolve("1:1").uuid == B1
    with pytest.raises(LookupError, match="1:0=MIG-b0000000"):
        INV.resolve("1:5")


def test_a_gpu_and_its_slices_are_one_family() -> None:
    assert INV.family(A0) == {A0, A}
    assert INV.family(A) == {A, A0, A1, A2}
    assert INV.family(C) == {C}
    assert {A0, A1, A2, B0, B1} <= INV.uuids  # an unpinned grant holds every slice too


def test_a_slice_of_a_gpu_not_in_mig_mode_is_an_inventory_error() -> None:
    with pytest.raises(InventoryError, match="not in MIG mode"):
        Inventory((GC,), migs=(slice_of(GC, "MIG-x", 0, "1g.10gb"),))


def test_the_simulated_file_describes_slices(tmp_path: Path) -> None:
    f = tmp_path / "gpus.yaml"
    f.write_text(yaml.safe_dump([
        {"uuid": A, "index": 0, "numa_node": 1, "migs": [
            {"uuid": A0, "profile": "1g.10gb", "memory_mib": 9984},
            {"uuid": A1, "profile": "3g.40gb", "memory_mib": 40192}]},
        {"uuid": C, "index": 1},
    ]))  # fmt: skip
    inv = load_file(str(f))
    assert inv.gpus[0].mig_mode and not inv.gpus[1].mig_mode
    assert [(m.uuid, m.parent, m.profile, m.memory_mib, m.mig_index, m.numa_node)
            for m in inv.migs] == [(A0, A, "1g.10gb", 9984, 0, 1),
                                   (A1, A, "3g.40gb", 40192, 1, 1)]  # fmt: skip


@pytest.mark.parametrize(
    ("migs", "why"),
    [
        ([{"uuid": "GPU-x"}], "needs a 'uuid' starting MIG-"),
        ([{"uuid": "MIG-x", "colour": 1}], "unknown keys"),
        ({"uuid": "MIG-x"}, "must be a list"),
    ],
)
def test_bad_simulated_slices_are_named(tmp_path: Path, migs: object, why: str) -> None:
    f = tmp_path / "gpus.yaml"
    f.write_text(yaml.safe_dump([{"uuid": A, "index": 0, "migs": migs}]))
    with pytest.raises(InventoryError, match=why):
        load_file(str(f))


# --- placement ---------------------------------------------------------------------------------

NUMA, FIRST = POLICIES["numa"], POLICIES["first-fit"]


def test_single_leases_two_gpus_as_two_distinct_slices() -> None:
    picked = uuids(
        place(ask(2), Inventory((GA,), migs=INV.migs[:3]), {}, FIRST, mig=MigPolicy.SINGLE)
    )
    assert picked == [A0, A1]


def test_none_never_leases_a_gpu_in_mig_mode_or_a_slice() -> None:
    assert uuids(place(ask(1), INV, {}, FIRST, mig=MigPolicy.NONE)) == [C]
    assert isinstance(place(ask(2), INV, {}, FIRST, mig=MigPolicy.NONE), Shortage)
    refused = place(ask(required=(A0,)), INV, {}, FIRST, mig=MigPolicy.NONE)
    assert isinstance(refused, Shortage) and "policy.mig is 'none'" in refused.msg


def test_a_profile_under_none_is_refused_naming_the_policy() -> None:
    refused = place(ask(1, profile="1g.10gb"), INV, {}, FIRST, mig=MigPolicy.NONE)
    assert isinstance(refused, Shortage) and "policy.mig is 'none'" in refused.msg


def test_a_gpu_in_mig_mode_is_never_leased_whole() -> None:
    refused = place(ask(required=(A,)), INV, {}, FIRST, mig=MigPolicy.SINGLE)
    assert isinstance(refused, Shortage)
    assert "in MIG mode, so it is leased only as its slices" in refused.msg


def test_mixed_leases_by_profile_and_whole_gpus_without_one() -> None:
    assert uuids(place(ask(2, profile="3g.40gb"), INV, {}, FIRST, mig=MigPolicy.MIXED)) == [A2, B1]
    assert uuids(place(ask(1), INV, {}, FIRST, mig=MigPolicy.MIXED)) == [C]
    short = place(ask(3, profile="3g.40gb"), INV, {}, FIRST, mig=MigPolicy.MIXED)
    assert isinstance(short, Shortage) and "3 MIG slices of profile 3g.40gb" in short.msg


def test_explicit_slices_are_leased_like_uuids() -> None:
    assert uuids(place(ask(required=(B1, A0)), INV, {}, NUMA, mig=MigPolicy.MIXED)) == [A0, B1]


def test_a_leased_slice_is_not_leased_again() -> None:
    short = place(ask(required=(A0,)), INV, {A0: WHO}, FIRST, mig=MigPolicy.SINGLE)
    assert isinstance(short, Shortage) and f"MIG 0:0 (1g.10gb) ({A0})" in short.msg
    assert A0 not in uuids(place(ask(5), INV, {A0: WHO}, FIRST, mig=MigPolicy.SINGLE))


def test_a_gpu_held_whole_blocks_its_slices_and_a_held_slice_blocks_its_gpu() -> None:
    # Held whole (a claim of /dev/nvidia0, or a lease from before MIG mode was turned on).
    assert uuids(place(ask(3), INV, {A: WHO}, FIRST, mig=MigPolicy.SINGLE)) == [B0, B1, C]
    # A whole-GPU request never overlaps a leased slice, whatever the inventory says.
    plain = Inventory((GPU(A, 0), GC), migs=())
    blocked = Inventory((GPU(A, 0, mig_mode=True), GC), migs=(slice_of(GA, A0, 0, "1g"),))
    assert uuids(place(ask(1), plain, {}, FIRST, mig=MigPolicy.SINGLE)) == [A]
    assert uuids(place(ask(1), blocked, {A0: WHO}, FIRST, mig=MigPolicy.SINGLE)) == [C]


def test_a_slice_of_an_unhealthy_gpu_is_unhealthy() -> None:
    sick = {A: "Xid 79 at 2026-01-01 00:00:00 UTC"}
    assert uuids(place(ask(3), INV, {}, FIRST, unhealthy=sick, mig=MigPolicy.SINGLE)) == [B0, B1, C]
    refused = place(ask(required=(A0,)), INV, {}, FIRST, unhealthy=sick, mig=MigPolicy.SINGLE)
    assert isinstance(refused, Shortage) and "had Xid 79" in refused.msg


def test_every_gpu_under_single_is_every_unit() -> None:
    assert len(uuids(place(ask(every=True), INV, {}, FIRST, mig=MigPolicy.SINGLE))) == 6


# --- access ------------------------------------------------------------------------------------


@dataclass
class Facts:
    """HostFacts from a table: path -> Node; 240 is nvidia-caps' dynamic major."""

    nodes: dict[str, Node]
    protected: tuple[str, ...] = ("/dev",)

    def resolve(self, path: str) -> str:
        return path

    def node(self, path: str) -> Node | None:
        return self.nodes.get(path)

    def walk(self, top: str) -> Iterable[str]:
        return [p for p in self.nodes if p.startswith(top + "/")]

    def drm_bus_id(self, minor: int) -> str | None:
        return None

    def dynamic_majors(self) -> frozenset[int]:
        return frozenset({240})

    def mounts(self) -> tuple[Mount, ...]:
        return (Mount("/", "ext4"), Mount("/dev", "devtmpfs"))


HOST = Facts(
    {
        "/dev/nvidia-caps": Node("dir"),
        "/dev/nvidia-caps/nvidia-cap21": Node("chr", 240, 21),
        "/dev/nvidia0": Node("chr", 195, 0),
    }
)
ENGINE = EngineView()


def create(**fields: object) -> access.Access:
    return access.of_create(fields, ENGINE, INV, HOST)


def device_request(*ids: str) -> dict[str, object]:
    return {"DeviceRequests": [{"Driver": "", "DeviceIDs": list(ids), "Capabilities": [["gpu"]]}]}


def test_a_device_request_for_a_slice_is_pinned_to_that_slice() -> None:
    got = create(HostConfig=device_request(A1))
    assert got.pinned and got.gpus(INV) == {A1}
    assert got.grants[0].leasable
    assert create(HostConfig=device_request("0:2")).gpus(INV) == {A2}


def test_nvidia_visible_devices_with_a_slice_is_pinned_to_it() -> None:
    got = create(HostConfig={"Runtime": "nvidia"}, Env=[f"NVIDIA_VISIBLE_DEVICES={B0}"])
    assert got.gpus(INV) == {B0} and got.grants[0].leasable


def test_an_unknown_mig_id_is_refused_at_create_and_holds_everything_on_a_container() -> None:
    with pytest.raises(Refusal, match="MIG-ffff"):
        create(HostConfig=device_request("MIG-ffff0000"))
    inspect = {"HostConfig": device_request("MIG-ffff0000"), "Config": {"Env": []}}
    found = access.of_container(inspect, ENGINE, INV, HOST)
    assert not found.pinned and found.gpus(INV) == INV.uuids


def test_a_mig_capability_device_node_reaches_every_slice() -> None:
    dev = {"PathOnHost": "/dev/nvidia-caps/nvidia-cap21", "PathInContainer": "/dev/x"}
    got = create(HostConfig={"Devices": [dev]})
    assert not got.pinned and not got.grants[0].leasable
    assert got.gpus(INV) >= {A0, A1, A2, B0, B1}
    whole = create(HostConfig={"Devices": [{"PathOnHost": "/dev/nvidia-caps"}]})
    assert not whole.pinned


# --- config and labels -------------------------------------------------------------------------


def test_policy_mig_defaults_to_none_and_is_parsed_once_into_its_enum() -> None:
    assert configmod.Config().policy.mig is MigPolicy.NONE
    assert configmod.parse("policy: {mig: mixed}").policy.mig is MigPolicy.MIXED
    with pytest.raises(configmod.ConfigError, match=r"key 'policy\.mig': must be one of none"):
        configmod.parse("policy: {mig: all}")
