"""CPU cores and memory leased with GPUs: the pure choice, the labels, the sysfs reader."""

from pathlib import Path

import pytest

from allocator.core.api import labels
from allocator.core.machine.cpus import (
    Node,
    Placed,
    Resources,
    Topology,
    conflicts,
    format_list,
    gpu_nodes,
    parse_list,
    parse_size,
    place,
    placed_of,
    resources,
)
from allocator.host import cpus as host_cpus
from tests.support.sysfs import GIB, two_socket


@pytest.fixture
def machine(tmp_path: Path) -> Topology:
    return host_cpus.read(str(two_socket(tmp_path, cores=8, memory_gib=64)))


# --- reading sysfs ---------------------------------------------------------------------------


def test_sysfs_gives_each_node_its_physical_cores_with_their_siblings(machine: Topology) -> None:
    node0, node1 = machine.nodes
    assert (node0.id, node1.id) == (0, 1)
    assert node0.cores == tuple((c, c + 16) for c in range(8))
    assert node1.cores == tuple((c, c + 16) for c in range(8, 16))
    assert node0.memory == node1.memory == 64 * GIB


def test_a_kernel_without_numa_nodes_is_one_node_without_known_memory(tmp_path: Path) -> None:
    for c in range(2):
        (tmp_path / f"devices/system/cpu/cpu{c}").mkdir(parents=True)
    assert host_cpus.read(str(tmp_path)) == Topology((Node(0, ((0,), (1,)), 0),))


def test_an_unreadable_sysfs_names_where_it_looked(tmp_path: Path) -> None:
    (tmp_path / "devices/system/node/node0").mkdir(parents=True)
    with pytest.raises(host_cpus.TopologyError, match=r"devices/system"):
        host_cpus.read(str(tmp_path))


# --- choosing cores --------------------------------------------------------------------------


def test_cores_come_from_the_gpus_node_with_their_siblings(machine: Topology) -> None:
    got = place(machine, Resources(cpus=4), [1], (), {})
    assert got == Placed((8, 9, 10, 11, 24, 25, 26, 27), (), 0)


def test_leased_and_reserved_cores_are_never_given(machine: Topology) -> None:
    got = place(machine, Resources(cpus=2), [0], taken=[2, 3, 18], used_memory={}, reserved=[0, 17])
    assert isinstance(got, Placed)
    assert got.cpus == (4, 5, 20, 21)  # core 1 has a reserved sibling, 2-3 are leased


def test_prefer_spills_to_the_next_node(machine: Topology) -> None:
    got = place(machine, Resources(cpus=10), [1], (), {})
    assert isinstance(got, Placed)
    assert set(got.cpus) == set(range(8, 16)) | set(range(24, 32)) | {0, 1, 16, 17}


def test_strict_refuses_when_the_gpus_node_is_short(machine: Topology) -> None:
    got = place(machine, Resources(cpus=10, strict=True), [1], (), {})
    assert got == (
        "not enough free CPU cores: asked for 10 physical cores on the GPUs' NUMA node (1), "
        "free (node 1: 8). Ask for fewer cores, or use io.gpu-alloc.request.topology=prefer"
    )


def test_memory_is_admitted_against_the_nodes_size(machine: Topology) -> None:
    assert place(machine, Resources(memory=48 * GIB, strict=True), [0], (), {0: 8 * GIB}) == Placed(
        (), (0,), 48 * GIB
    )
    refused = place(machine, Resources(memory=48 * GIB, strict=True), [0], (), {0: 32 * GIB})
    assert refused == (
        "not enough free memory: asked for 48 GiB on the GPUs' NUMA node (0), "
        "free (node 0: 32 GiB of 64 GiB). Ask for less memory"
    )
    spilled = place(machine, Resources(memory=48 * GIB), [0], (), {0: 32 * GIB})
    assert isinstance(spilled, Placed) and spilled.mems == (1,)


def test_more_memory_than_any_node_is_refused_even_with_prefer(machine: Topology) -> None:
    got = place(machine, Resources(memory=65 * GIB), [0], (), {})
    assert isinstance(got, str) and got.startswith("not enough free memory: asked for 65 GiB")


def test_the_gpus_node_is_the_one_with_most_of_them() -> None:
    assert gpu_nodes([1, 0, 1, None]) == [1, 0]
    assert gpu_nodes([None]) == []


# --- labels and conflicts --------------------------------------------------------------------

LABELS = {
    "nothing asked": ({}, Resources()),
    "cores": ({labels.REQUEST_CPUS: "8"}, Resources(cpus=8)),
    "memory in docker's format": ({labels.REQUEST_MEMORY: "4g"}, Resources(memory=4 * GIB)),
    "strict": (
        {labels.REQUEST_CPUS: "2", labels.REQUEST_TOPOLOGY: "strict"},
        Resources(2, 0, True),
    ),
    "a fraction of cores": ({labels.REQUEST_CPUS: "1.5"}, "expected a whole number"),
    "negative cores": ({labels.REQUEST_CPUS: "-1"}, "expected a whole number"),
    "a bad size": ({labels.REQUEST_MEMORY: "lots"}, "'lots' is not a size"),
    "a bad topology": ({labels.REQUEST_TOPOLOGY: "loose"}, "expected prefer or strict"),
}


@pytest.mark.parametrize(("given", "expected"), LABELS.values(), ids=LABELS.keys())
def test_request_labels(given: dict[str, str], expected: Resources | str) -> None:
    got = resources(given)
    if isinstance(expected, str):
        assert isinstance(got, str) and expected in got and got.startswith("io.gpu-alloc.request.")
    else:
        assert got == expected


def inspect_of(labels_: dict, **host_config) -> dict:
    return {"Config": {"Labels": labels_}, "HostConfig": host_config}


LEASED = {labels.LEASE: "1a2b3c"}


@pytest.mark.parametrize(
    ("container", "held"),
    [
        (inspect_of({**LEASED, labels.PLACED: "cpus"}, CpusetCpus="2-3"), {"cpus": (2, 3)}),
        (
            inspect_of(
                {**LEASED, labels.PLACED: "cpus,memory"},
                CpusetCpus="0",
                Memory=GIB,
                CpusetMems="1",
            ),
            {"cpus": (0,), "memory": GIB, "mems": (1,)},
        ),
        # an image's label on a container no lease made: nothing
        (inspect_of({labels.PLACED: "cpus,memory"}, CpusetCpus="0-63", Memory=GIB), {}),
        # the shim's own empty label over an image's: nothing
        (inspect_of({**LEASED, labels.PLACED: ""}, CpusetCpus="0-63"), {}),
        # one unreadable value costs only itself
        (
            inspect_of(
                {**LEASED, labels.PLACED: "cpus,memory"},
                CpusetCpus="x",
                Memory=GIB,
                CpusetMems="0",
            ),
            {"memory": GIB, "mems": (0,)},
        ),
        (inspect_of({**LEASED, labels.PLACED: "memory"}, Memory=GIB), {}),  # on no node
    ],
)
def test_an_adopted_container_holds_what_its_placed_label_says(container, held) -> None:
    assert placed_of(container) == held


def test_a_create_setting_a_field_the_lease_sets_is_refused() -> None:
    why = conflicts(Resources(cpus=2), {"CpusetCpus": "0-3"})
    assert why is not None and "sets CpusetCpus" in why and "drop one or the other" in why
    assert conflicts(Resources(memory=GIB), {"Memory": 1 << 20}) is not None
    assert conflicts(Resources(cpus=2), {"Memory": 1 << 20}) is None  # not a field it sets
    assert conflicts(Resources(), {"CpusetCpus": "0"}) is None


@pytest.mark.parametrize(
    ("text", "size"),
    [("1024", 1024), ("512m", 512 << 20), ("4G", 4 * GIB), ("4GiB", 4 * GIB), ("1.5g", 3 << 29)],
)
def test_sizes_read_like_dockers_memory_flag(text: str, size: int) -> None:
    assert parse_size(text) == size


def test_cpu_lists_round_trip() -> None:
    assert parse_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert format_list([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    with pytest.raises(ValueError, match="not a CPU list"):
        parse_list("3-1")
