"""allocator.inventory: the simulated-GPU file, and naming a GPU by index, UUID or prefix."""

from pathlib import Path

import pytest

from allocator.core.machine.inventory import GPU, Inventory, InventoryError, Slot
from allocator.host.devices import source_for
from allocator.host.inventory import load_file

UUID_A = "GPU-836c0c09-1111-2222-3333-444455556666"
UUID_B = "GPU-836c0c0a-aaaa-bbbb-cccc-ddddeeeeffff"
UUID_C = "GPU-f00dcafe-0000-0000-0000-000000000000"


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "gpus.yaml"
    path.write_text(text)
    return str(path)


def refusal(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(InventoryError) as info:
        load_file(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: "), msg
    return msg


# --- load_file -------------------------------------------------------------------------------


def test_a_minimal_list_loads_with_defaults_for_optional_fields(tmp_path: Path) -> None:
    inv = load_file(write(tmp_path, f"- {{uuid: {UUID_A}, index: 0}}\n"))
    assert inv.gpus == (GPU(uuid=UUID_A, index=0),)
    gpu = inv.gpus[0]
    assert (gpu.name, gpu.memory_mib, gpu.pci_bus_id) == ("Simulated GPU", 0, "")
    assert (gpu.minor, gpu.numa_node, gpu.busy) == (None, None, False)
    assert inv.cuda_driver_version is None


def test_every_optional_field_is_read(tmp_path: Path) -> None:
    text = f"""
- uuid: {UUID_A}
  index: 0
  name: NVIDIA H100 80GB HBM3
  memory_mib: 81559
  pci_bus_id: "00000000:3B:00.0"
  minor: 3
  numa_node: 1
  busy: true
"""
    assert load_file(write(tmp_path, text)).gpus == (
        GPU(UUID_A, 0, "NVIDIA H100 80GB HBM3", 81559, "00000000:3B:00.0", 3, 1, busy=True),
    )


def test_gpus_are_ordered_by_index_whatever_the_file_order(tmp_path: Path) -> None:
    text = f"- {{uuid: {UUID_C}, index: 2}}\n- {{uuid: {UUID_A}, index: 0}}\n"
    text += f"- {{uuid: {UUID_B}, index: 1}}\n"
    inv = load_file(write(tmp_path, text))
    assert [g.uuid for g in inv.gpus] == [UUID_A, UUID_B, UUID_C]
    assert inv.uuids == frozenset({UUID_A, UUID_B, UUID_C})


def test_an_empty_list_is_an_inventory_without_gpus(tmp_path: Path) -> None:
    assert load_file(write(tmp_path, "[]\n")).gpus == ()


REFUSED = {
    "duplicate uuid": (
        f"- {{uuid: {UUID_A}, index: 0}}\n- {{uuid: {UUID_A}, index: 1}}\n",
        "share a UUID",
    ),
    "duplicate index": (
        f"- {{uuid: {UUID_A}, index: 0}}\n- {{uuid: {UUID_B}, index: 0}}\n",
        "share an index",
    ),
    "missing uuid": ("- {index: 0}\n", "entry 0: needs 'uuid' and 'index'"),
    "missing index in the second entry": (
        f"- {{uuid: {UUID_A}, index: 0}}\n- {{uuid: {UUID_B}}}\n",
        "entry 1: needs 'uuid' and 'index'",
    ),
    "an entry that is not a mapping": (f"- {UUID_A}\n", "entry 0: needs"),
    "unknown keys": (
        f"- {{uuid: {UUID_A}, index: 0, numa: 1, memory: 2}}\n",
        "entry 0: unknown keys ['memory', 'numa']",
    ),
    "uuid not a string": ("- {uuid: 1234, index: 0}\n", "uuid must be a string"),
    "index not an integer": (f"- {{uuid: {UUID_A}, index: '0'}}\n", "index an integer"),
    "a mapping instead of a list": (f"gpu0: {{uuid: {UUID_A}, index: 0}}\n", "expected a list"),
    "a scalar": ("nvml\n", "expected a list"),
    "an empty file": ("", "expected a list"),
    "invalid YAML": ("- {uuid: [\n", "not valid YAML"),
    "nvlinks not a mapping": (
        f"- {{uuid: {UUID_A}, index: 0, nvlinks: [1]}}\n",
        "nvlinks must map a peer GPU's index to a positive link count",
    ),
    "a zero NVLink count": (f"- {{uuid: {UUID_A}, index: 0, nvlinks: {{1: 0}}}}\n", "1: 0 is not"),
    "an unknown PCIe level": (
        f"- {{uuid: {UUID_A}, index: 0, pcie: {{1: nearby}}}}\n",
        "pcie: 1: 'nearby' is not one of same-board, single-switch",
    ),
}


@pytest.mark.parametrize(("text", "why"), REFUSED.values(), ids=REFUSED.keys())
def test_a_bad_file_is_refused_naming_the_file(tmp_path: Path, text: str, why: str) -> None:
    assert why in refusal(tmp_path, text)


def test_a_missing_file_is_refused_naming_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "absent.yaml"
    with pytest.raises(InventoryError, match=f"^{missing}: cannot read simulated GPUs"):
        load_file(str(missing))


def test_load_reads_a_path_as_a_simulated_gpu_file(tmp_path: Path) -> None:
    path = write(tmp_path, f"- {{uuid: {UUID_A}, index: 0}}\n")
    assert source_for(path).inventory() == load_file(path)


# --- Inventory ---------------------------------------------------------------------------------

INV = Inventory(
    (
        GPU(UUID_A, 0, minor=4),
        GPU(UUID_B, 1, minor=5),
        GPU(UUID_C, 2, minor=6),
    )
)


@pytest.mark.parametrize(
    ("gpus", "why"),
    [
        ((GPU(UUID_A, 0), GPU(UUID_A, 1)), "share a UUID"),
        ((GPU(UUID_A, 0), GPU(UUID_B, 0)), "share an index"),
    ],
)
def test_an_inventory_refuses_duplicates(gpus: tuple[GPU, ...], why: str) -> None:
    with pytest.raises(InventoryError, match=why):
        Inventory(gpus)


def test_by_minor_finds_the_gpu_or_none() -> None:
    assert INV.by_minor(6) == INV.gpus[2]
    assert INV.by_minor(0) is None


RESOLVED = {
    "index": ("1", UUID_B),
    "index zero": ("0", UUID_A),
    "index with surrounding spaces": (" 2 ", UUID_C),
    "full uuid": (UUID_C, UUID_C),
    "unique uuid prefix, nvidia-docker v1 style": ("GPU-f00dcafe", UUID_C),
    "a prefix of any length, if unique": ("GPU-f", UUID_C),
    "a 6-character prefix": ("GPU-f0", UUID_C),
    "prefix that tells the two 836c0c0 GPUs apart": ("GPU-836c0c09", UUID_A),
    "longer prefix": ("GPU-836c0c0a-aaaa", UUID_B),
}


@pytest.mark.parametrize(("ident", "uuid"), RESOLVED.values(), ids=RESOLVED.keys())
def test_resolve_finds_one_gpu(ident: str, uuid: str) -> None:
    assert INV.resolve(ident).uuid == uuid


UNRESOLVED = {
    "prefix shared by two GPUs": ("GPU-836c0c0", "matches several GPUs"),
    "unknown index": ("3", "is not a GPU on this host"),
    "unknown uuid": ("GPU-00000000-0000-0000-0000-000000000000", "is not a GPU on this host"),
    "the GPU- part alone": ("GPU-", "is not a GPU on this host"),
    "a uuid prefix without the GPU- part": (
        "f00dcafe",
        "is not a GPU on this host; a UUID prefix keeps its GPU- part: GPU-f00dcafe",
    ),
    "a minor number is not an index": ("4", "is not a GPU on this host"),
    "negative index": ("-1", "is not a GPU on this host"),
    "empty": ("", "is not a GPU on this host"),
}


@pytest.mark.parametrize(("ident", "why"), UNRESOLVED.values(), ids=UNRESOLVED.keys())
def test_resolve_refuses_ambiguous_or_unknown_names_listing_the_gpus(ident: str, why: str) -> None:
    with pytest.raises(LookupError) as info:
        INV.resolve(ident)
    msg = str(info.value)
    assert f"GPU '{ident.strip()}' {why}" in msg
    assert f"0={UUID_A}, 1={UUID_B}, 2={UUID_C}" in msg


def test_resolve_on_a_host_without_gpus_says_so() -> None:
    with pytest.raises(LookupError, match=r"\(GPUs: none\)"):
        Inventory(()).resolve("0")


def test_to_dict_has_every_field() -> None:
    assert GPU(UUID_A, 0, numa_node=1).to_dict() == {
        "uuid": UUID_A,
        "index": 0,
        "name": "Simulated GPU",
        "memory_mib": 0,
        "pci_bus_id": "",
        "minor": None,
        "numa_node": 1,
        "busy": False,
        "nvlinks": {},
        "pcie": {},
        "pcie_switch": None,
        "mig_mode": False,
        "parent": "",
        "profile": "",
        "mig_index": None,
    }


def test_links_to_other_gpus_are_read_by_peer_index(tmp_path: Path) -> None:
    text = (
        f"- {{uuid: {UUID_A}, index: 0, nvlinks: {{1: 4}}, pcie: {{1: host-bridge}}}}\n"
        f"- {{uuid: {UUID_B}, index: 1, nvlinks: {{0: 4}}, pcie_switch: sw1}}\n"
        f"- {{uuid: {UUID_C}, index: 2, pcie_switch: sw1}}\n"
    )
    a, b, c = load_file(write(tmp_path, text)).gpus
    assert (a.nvlinks, a.pcie, b.nvlinks) == (((1, 4),), ((1, "host-bridge"),), ((0, 4),))
    assert (a.nvlinks_to(1), a.nvlinks_to(2)) == (4, 0)
    assert (a.pcie_to(b), b.pcie_to(a)) == ("host-bridge", "host-bridge")  # one side suffices
    assert b.pcie_to(c) == "single-switch"
    assert a.pcie_to(c) is None  # nothing known: no NUMA node either


def test_a_simulated_file_may_also_simulate_the_drivers_cuda_version(tmp_path):
    path = tmp_path / "gpus.yaml"
    path.write_text('cuda_driver_version: "12.4"\ngpus:\n  - {uuid: GPU-a, index: 0}\n')
    inv = load_file(str(path))
    assert inv.cuda_driver_version == (12, 4)
    assert [g.uuid for g in inv.gpus] == ["GPU-a"]


def test_a_malformed_simulated_cuda_version_names_the_file(tmp_path):
    path = tmp_path / "gpus.yaml"
    path.write_text('cuda_driver_version: "twelve"\ngpus: []\n')
    with pytest.raises(InventoryError, match=r"gpus\.yaml: cuda_driver_version"):
        load_file(str(path))


# --- share slots -------------------------------------------------------------------------------


def test_a_shared_gpu_is_listed_as_its_share_slots_as_kubernetes_lists_replicas() -> None:
    a, b = GPU(UUID_A, 0), GPU(UUID_B, 1)
    inv = Inventory((a, b)).shared({UUID_B: 3})
    assert [s.uuid for s in inv.slots] == [f"{UUID_B}::0", f"{UUID_B}::1", f"{UUID_B}::2"]
    assert inv.slots_of(UUID_B)[1] == Slot(b, 1, 3) and inv.slots_of(UUID_A) == ()
    assert inv.uuids == {UUID_A, UUID_B}  # a slot is never held by an unpinned grant


def test_a_gpu_in_mig_mode_is_never_listed_as_share_slots() -> None:
    split = GPU(UUID_A, 0, mig_mode=True)
    assert Inventory((split,)).shared({UUID_A: 4}).slots == ()
    with pytest.raises(InventoryError, match="not leased whole"):
        Inventory((split,), slots=(Slot(split, 0, 4),))


def test_the_policy_lists_the_gpus_it_shares_as_that_many_slots() -> None:
    from allocator.core.rules.sharing import Sharing, listed

    inv = listed(Inventory((GPU(UUID_A, 0), GPU(UUID_B, 1))), [Sharing(gpus=(1,), shares=4)])
    assert {s.gpu.uuid for s in inv.slots} == {UUID_B} and len(inv.slots) == 4


def test_a_gpu_and_its_share_slots_exclude_each_other_as_a_gpu_and_its_slices_do() -> None:
    inv = Inventory((GPU(UUID_A, 0), GPU(UUID_B, 1))).shared({UUID_B: 2})
    slots = {f"{UUID_B}::0", f"{UUID_B}::1"}
    assert inv.family(UUID_B) == {UUID_B, *slots}
    assert inv.family(f"{UUID_B}::1") == {f"{UUID_B}::1", UUID_B}  # not its sibling slot
    assert inv.family(UUID_A) == {UUID_A}
