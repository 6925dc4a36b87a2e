"""allocator.nvml: the inventory from NVML, against a stand-in with pynvml's names.

The stand-in is checked against the installed ``pynvml`` (names, struct fields and the
arguments nvml.py passes), so it cannot drift from the real API unnoticed.
"""

import inspect
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from allocator.core.machine.inventory import GPU, InventoryError
from allocator.host import nvml

MIB = 1024 * 1024


class FakeNVML:
    """pynvml's functions over a list of device dicts; records every call.

    A device with ``mig: [slice dicts]`` is in MIG mode with those slices (a ``None``
    entry is an empty slice index); one without answers MIG calls NOT_SUPPORTED.
    """

    NVMLError = pynvml.NVMLError
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE

    def __init__(self, devices: list[dict[str, Any]], cuda: int | Exception = 12040) -> None:
        self.devices = devices
        self.cuda = cuda
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.init_error: Exception | None = None
        self.fail_on: str | None = None
        self.levels: dict[frozenset[int], int] = {}  # {minor, minor} -> topology level

    def _call(self, name: str, *args: Any) -> None:
        self.calls.append((name, args))
        if name == self.fail_on:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    def called(self, name: str) -> int:
        return sum(1 for n, _ in self.calls if n == name)

    def nvmlInit(self) -> None:
        self._call("nvmlInit")
        if self.init_error:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict[str, Any]:
        self._call("nvmlDeviceGetHandleByIndex", index)
        return self.devices[index]

    def nvmlDeviceGetUUID(self, handle: dict[str, Any]) -> str | bytes:
        self._call("nvmlDeviceGetUUID", handle)
        return handle["uuid"]

    def nvmlDeviceGetName(self, handle: dict[str, Any]) -> str | bytes:
        self._call("nvmlDeviceGetName", handle)
        return handle["name"]

    def nvmlDeviceGetMemoryInfo(self, handle: dict[str, Any]) -> SimpleNamespace:
        self._call("nvmlDeviceGetMemoryInfo", handle)
        used = handle.get("used", handle["memory"])
        return SimpleNamespace(total=handle["memory"], free=handle["memory"] - used, used=used)

    def nvmlDeviceGetUtilizationRates(self, handle: dict[str, Any]) -> SimpleNamespace:
        self._call("nvmlDeviceGetUtilizationRates", handle)
        return SimpleNamespace(gpu=handle.get("util", 0), memory=0)

    def nvmlDeviceGetTemperature(self, handle: dict[str, Any], sensor: int) -> int:
        self._call("nvmlDeviceGetTemperature", handle, sensor)
        return handle.get("temp", 40)

    def nvmlDeviceGetPowerUsage(self, handle: dict[str, Any]) -> int:
        self._call("nvmlDeviceGetPowerUsage", handle)
        if "milliwatts" not in handle:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return handle["milliwatts"]

    def nvmlDeviceGetPciInfo(self, handle: dict[str, Any]) -> SimpleNamespace:
        self._call("nvmlDeviceGetPciInfo", handle)
        return SimpleNamespace(busId=handle["bus_id"])

    def nvmlDeviceGetMinorNumber(self, handle: dict[str, Any]) -> int:
        self._call("nvmlDeviceGetMinorNumber", handle)
        return handle["minor"]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: dict[str, Any]) -> list[Any]:
        self._call("nvmlDeviceGetComputeRunningProcesses", handle)
        return handle.get("procs", [])

    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU

    def nvmlDeviceGetTopologyCommonAncestor(self, a: dict[str, Any], b: dict[str, Any]) -> int:
        self._call("nvmlDeviceGetTopologyCommonAncestor", a, b)
        return self.levels.get(frozenset((a["minor"], b["minor"])), pynvml.NVML_TOPOLOGY_SYSTEM)

    def nvmlDeviceGetNvLinkState(self, handle: dict[str, Any], link: int) -> int:
        """``links``: the far end's bus id for each link; a GPU without any has no NVLink."""
        self._call("nvmlDeviceGetNvLinkState", handle, link)
        if link >= len(handle.get("links", ())):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(
        self, handle: dict[str, Any], link: int
    ) -> SimpleNamespace:
        self._call("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
        return SimpleNamespace(busId=handle["links"][link])

    def nvmlDeviceGetMigMode(self, handle: dict[str, Any]) -> list[int]:
        self._call("nvmlDeviceGetMigMode", handle)
        if "mig" not in handle:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [handle.get("mig_current", 1), 1]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: dict[str, Any]) -> int:
        self._call("nvmlDeviceGetMaxMigDeviceCount", handle)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: dict[str, Any], index: int) -> Any:
        self._call("nvmlDeviceGetMigDeviceHandleByIndex", handle, index)
        slices = handle["mig"]
        if index >= len(slices) or slices[index] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return slices[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> dict[str, Any]:
        self._call("nvmlDeviceGetHandleByUUID", uuid)
        want = uuid.decode() if isinstance(uuid, bytes) else uuid
        for d in self.devices:
            if nvml._text(d["uuid"]) == want:
                return d
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetComputeMode(self, handle: dict[str, Any]) -> int:
        self._call("nvmlDeviceGetComputeMode", handle)
        return handle.get("compute_mode", pynvml.NVML_COMPUTEMODE_DEFAULT)

    def nvmlDeviceSetComputeMode(self, handle: dict[str, Any], mode: int) -> None:
        """As the driver: root only (a device with ``user: True`` is asked by a user)."""
        self._call("nvmlDeviceSetComputeMode", handle, mode)
        if mode not in nvml.COMPUTE_MODES:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if handle.get("user"):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
        handle["compute_mode"] = mode

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._call("nvmlSystemGetCudaDriverVersion")
        if isinstance(self.cuda, Exception):
            raise self.cuda
        return self.cuda


def device(i: int, *, as_bytes: bool = False, **over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "uuid": f"GPU-{i:08x}-0000-0000-0000-000000000000",
        "name": "NVIDIA H100 80GB HBM3",
        "memory": 81559 * MIB,
        "bus_id": f"00000000:{0x3B + i:02X}:00.0",
        "minor": i,
    }
    d.update(over)
    if as_bytes:  # nvidia-ml-py before 11.515 returned bytes
        d.update({k: d[k].encode() for k in ("uuid", "name", "bus_id")})
    return d


def mig_slice(gpu: int, k: int, profile: str = "1g.10gb", mib: int = 9984) -> dict[str, Any]:
    return {
        "uuid": f"MIG-{gpu:04x}{k:04x}-0000-0000-0000-000000000000",
        "name": f"NVIDIA H100 80GB HBM3 MIG {profile}",
        "memory": mib * MIB,
    }


def sysfs_numa(root: Path, bus_id: str, node: str) -> None:
    dev = root / "bus/pci/devices" / bus_id
    dev.mkdir(parents=True)
    (dev / "numa_node").write_text(node)


# --- the stand-in mirrors pynvml ---------------------------------------------------------------

FAKE_FUNCTIONS = sorted(n for n in vars(FakeNVML) if n.startswith("nvml"))


@pytest.mark.parametrize("name", FAKE_FUNCTIONS)
def test_the_stand_ins_functions_exist_in_pynvml(name: str) -> None:
    assert callable(getattr(pynvml, name, None)), f"pynvml has no {name}"


def test_the_stand_ins_struct_fields_exist_in_pynvml() -> None:
    assert "total" in dict(pynvml.c_nvmlMemory_t._fields_)
    assert "busId" in dict(pynvml.nvmlPciInfo_t._fields_)
    assert {"gpu", "memory"} <= set(dict(pynvml.c_nvmlUtilization_t._fields_))
    assert {"pid", "usedGpuMemory"} <= set(dict(pynvml.c_nvmlProcessInfo_t._fields_))
    assert nvml.NVLINK_MAX_LINKS == pynvml.NVML_NVLINK_MAX_LINKS
    assert nvml.FEATURE_ENABLED == pynvml.NVML_FEATURE_ENABLED
    assert nvml.COMPUTE_MODES == {
        pynvml.NVML_COMPUTEMODE_DEFAULT: "DEFAULT",
        pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD: "EXCLUSIVE_THREAD",
        pynvml.NVML_COMPUTEMODE_PROHIBITED: "PROHIBITED",
        pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS: "EXCLUSIVE_PROCESS",
    }
    assert nvml.EXCLUSIVE_PROCESS == pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    assert nvml.DEFAULT == pynvml.NVML_COMPUTEMODE_DEFAULT
    assert nvml.TOPOLOGY_LEVELS == {
        pynvml.NVML_TOPOLOGY_INTERNAL: "same-board",
        pynvml.NVML_TOPOLOGY_SINGLE: "single-switch",
        pynvml.NVML_TOPOLOGY_MULTIPLE: "multi-switch",
        pynvml.NVML_TOPOLOGY_HOSTBRIDGE: "host-bridge",
        pynvml.NVML_TOPOLOGY_NODE: "same-cpu",
        pynvml.NVML_TOPOLOGY_SYSTEM: "cross-cpu",
    }


def test_nvml_py_calls_pynvml_with_arguments_its_signatures_accept(tmp_path: Path) -> None:
    fake = FakeNVML(
        [
            device(0, links=[device(1)["bus_id"]]),
            device(1, milliwatts=250_000, mig=[mig_slice(1, 0)]),
        ]
    )
    nvml.read(fake, sysfs=str(tmp_path))
    nvml.usage(fake)
    nvml.NvmlModes(fake).set(str(device(0)["uuid"]), nvml.EXCLUSIVE_PROCESS)
    assert {n for n, _ in fake.calls} == set(FAKE_FUNCTIONS)
    for name, args in fake.calls:
        inspect.signature(getattr(pynvml, name)).bind(*args)


# --- reading the GPUs --------------------------------------------------------------------------


@pytest.mark.parametrize("as_bytes", [False, True], ids=["str bindings", "bytes bindings"])
def test_each_device_becomes_a_gpu(tmp_path: Path, as_bytes: bool) -> None:
    fake = FakeNVML([device(0, as_bytes=as_bytes), device(1, as_bytes=as_bytes, minor=7)])
    inv = nvml.read(fake, sysfs=str(tmp_path))
    assert inv.gpus == (
        GPU(
            uuid="GPU-00000000-0000-0000-0000-000000000000",
            index=0,
            name="NVIDIA H100 80GB HBM3",
            memory_mib=81559,
            pci_bus_id="00000000:3B:00.0",
            minor=0,
            pcie=((1, "cross-cpu"),),
        ),
        GPU(
            uuid="GPU-00000001-0000-0000-0000-000000000000",
            index=1,
            name="NVIDIA H100 80GB HBM3",
            memory_mib=81559,
            pci_bus_id="00000000:3C:00.0",
            minor=7,
            pcie=((0, "cross-cpu"),),
        ),
    )
    assert all(isinstance(g.uuid, str) and isinstance(g.pci_bus_id, str) for g in inv.gpus)


def test_bytes_and_str_may_mix_within_one_device(tmp_path: Path) -> None:
    dev = device(0)
    dev["name"] = dev["name"].encode()
    gpu = nvml.read(FakeNVML([dev]), sysfs=str(tmp_path)).gpus[0]
    assert (gpu.name, gpu.uuid) == ("NVIDIA H100 80GB HBM3", dev["uuid"])


def test_memory_is_reported_in_whole_mib(tmp_path: Path) -> None:
    fake = FakeNVML([device(0, memory=16 * MIB + MIB - 1)])
    assert nvml.read(fake, sysfs=str(tmp_path)).gpus[0].memory_mib == 16


def test_a_host_without_gpus_is_an_empty_inventory(tmp_path: Path) -> None:
    fake = FakeNVML([])
    assert nvml.read(fake, sysfs=str(tmp_path)).gpus == ()
    assert fake.called("nvmlShutdown") == 1


@pytest.mark.parametrize(
    ("cuda", "expected"),
    [(12040, (12, 4)), (11080, (11, 8)), (13000, (13, 0)), (12020, (12, 2))],
)
def test_the_cuda_driver_version_is_major_minor(
    tmp_path: Path, cuda: int, expected: tuple[int, int]
) -> None:
    inv = nvml.read(FakeNVML([device(0)], cuda=cuda), sysfs=str(tmp_path))
    assert inv.cuda_driver_version == expected


def test_an_unavailable_cuda_version_is_none_not_an_error(tmp_path: Path) -> None:
    fake = FakeNVML([device(0)], cuda=pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED))
    inv = nvml.read(fake, sysfs=str(tmp_path))
    assert inv.cuda_driver_version is None
    assert len(inv.gpus) == 1


def test_a_gpu_running_compute_processes_is_busy(tmp_path: Path) -> None:
    proc = SimpleNamespace(pid=4242, usedGpuMemory=1024 * MIB)
    fake = FakeNVML([device(0), device(1, procs=[proc]), device(2)])
    assert [g.busy for g in nvml.read(fake, sysfs=str(tmp_path)).gpus] == [False, True, False]


# --- NUMA node from sysfs ----------------------------------------------------------------------

NUMA = {
    "8-digit NVML domain shortened to sysfs's 4": ("00000000:3B:00.0", "0000:3b:00.0", "1\n", 1),
    "node 0": ("00000000:3B:00.0", "0000:3b:00.0", "0\n", 0),
    "non-zero domain keeps its low 4 digits": ("00000001:AF:00.0", "0001:af:00.0", "3\n", 3),
    "already 4-digit domain": ("0000:3B:00.0", "0000:3b:00.0", "2\n", 2),
    "-1 means no NUMA affinity": ("00000000:3B:00.0", "0000:3b:00.0", "-1\n", None),
    "unreadable value": ("00000000:3B:00.0", "0000:3b:00.0", "garbage", None),
    "no sysfs entry for the device": ("00000000:3B:00.0", "0000:5e:00.0", "1\n", None),
}


@pytest.mark.parametrize(("bus_id", "sysfs_name", "content", "node"), NUMA.values(), ids=NUMA)
def test_the_numa_node_comes_from_sysfs(
    tmp_path: Path, bus_id: str, sysfs_name: str, content: str, node: int | None
) -> None:
    sysfs_numa(tmp_path, sysfs_name, content)
    inv = nvml.read(FakeNVML([device(0, bus_id=bus_id)]), sysfs=str(tmp_path))
    assert inv.gpus[0].numa_node == node


def test_each_gpu_gets_its_own_numa_node(tmp_path: Path) -> None:
    sysfs_numa(tmp_path, "0000:3b:00.0", "0\n")
    sysfs_numa(tmp_path, "0000:3c:00.0", "1\n")
    fake = FakeNVML([device(0, as_bytes=True), device(1, as_bytes=True)])
    assert [g.numa_node for g in nvml.read(fake, sysfs=str(tmp_path)).gpus] == [0, 1]


# --- links between GPUs -----------------------------------------------------------------------


def bus(i: int) -> str:
    return device(i)["bus_id"]


def test_each_pairs_pcie_level_comes_from_the_common_ancestor(tmp_path: Path) -> None:
    fake = FakeNVML([device(0), device(1), device(2)])
    fake.levels = {frozenset((0, 1)): pynvml.NVML_TOPOLOGY_SINGLE}
    a, b, c = nvml.read(fake, sysfs=str(tmp_path)).gpus
    assert a.pcie == ((1, "single-switch"), (2, "cross-cpu"))
    assert b.pcie == ((0, "single-switch"), (2, "cross-cpu"))
    assert c.pcie_to(a) == "cross-cpu"


def test_nvlink_bridges_count_the_links_to_each_peer_gpu(tmp_path: Path) -> None:
    # A PCIe server with two 4-link bridges: 0=2 and 1=3.  The far end's bus id
    # comes with NVML's 8-digit domain or sysfs's 4; both name the same GPU.
    short = {i: "0000:" + bus(i)[9:].lower() for i in range(4)}
    fake = FakeNVML(
        [
            device(0, links=[bus(2)] * 4),
            device(1, links=[short[3]] * 4),
            device(2, links=[bus(0)] * 4),
            device(3, links=[bus(1)] * 4),
        ]
    )
    gpus = nvml.read(fake, sysfs=str(tmp_path)).gpus
    assert [g.nvlinks for g in gpus] == [((2, 4),), ((3, 4),), ((0, 4),), ((1, 4),)]


def test_links_to_nvswitches_join_every_two_gpus_on_them(tmp_path: Path) -> None:
    switch = ["00000000:C0:00.0", "00000000:C1:00.0"]  # no GPU has these bus ids
    fake = FakeNVML(
        [device(0, links=switch * 6), device(1, links=switch * 6), device(2, links=switch * 3)]
    )
    a, b, c = nvml.read(fake, sysfs=str(tmp_path)).gpus
    assert a.nvlinks == ((1, 12), (2, 6))
    assert b.nvlinks == ((0, 12), (2, 6))
    assert c.nvlinks == ((0, 6), (1, 6))


def test_unreadable_links_leave_the_gpus_usable_without_them(tmp_path: Path) -> None:
    fake = FakeNVML([device(0, links=[bus(1)]), device(1, links=[bus(0)])])
    fake.fail_on = "nvmlDeviceGetTopologyCommonAncestor"
    gpus = nvml.read(fake, sysfs=str(tmp_path)).gpus
    assert [(g.index, g.pcie, g.nvlinks) for g in gpus] == [(0, (), ()), (1, (), ())]


# --- failures ----------------------------------------------------------------------------------


def test_a_failing_init_is_an_inventory_error_with_a_hint(tmp_path: Path) -> None:
    fake = FakeNVML([device(0)])
    fake.init_error = pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    with pytest.raises(InventoryError) as info:
        nvml.read(fake, sysfs=str(tmp_path))
    msg = str(info.value)
    assert "cannot initialise the NVIDIA driver" in msg
    assert "Shared Library Not Found" in msg  # NVML's own reason is kept
    assert "'gpus:'" in msg and "simulated-GPU file" in msg
    assert fake.called("nvmlDeviceGetCount") == 0
    assert fake.called("nvmlShutdown") == 0  # never initialised, nothing to shut down


@pytest.mark.parametrize(
    "failing",
    [
        "nvmlDeviceGetCount",
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetComputeRunningProcesses",
    ],
)
def test_a_failing_read_is_an_inventory_error_and_nvml_is_still_shut_down(
    tmp_path: Path, failing: str
) -> None:
    fake = FakeNVML([device(0), device(1)])
    fake.fail_on = failing
    with pytest.raises(InventoryError, match=r"^NVML: reading the GPUs failed"):
        nvml.read(fake, sysfs=str(tmp_path))
    assert fake.called("nvmlShutdown") == 1
    assert fake.calls[-1][0] == "nvmlShutdown"


def test_nvml_is_shut_down_after_a_successful_read(tmp_path: Path) -> None:
    fake = FakeNVML([device(0)])
    nvml.read(fake, sysfs=str(tmp_path))
    assert fake.calls[0][0] == "nvmlInit"
    assert fake.called("nvmlShutdown") == 1
    assert fake.calls[-1][0] == "nvmlShutdown"


# --- live use ----------------------------------------------------------------------------------


def test_usage_reads_utilisation_memory_temperature_power_and_processes() -> None:
    proc = SimpleNamespace(pid=4242, usedGpuMemory=3 * MIB, gpuInstanceId=0, computeInstanceId=0)
    fake = FakeNVML(
        [device(0, used=10 * MIB, util=85, temp=61, milliwatts=301_500, procs=[proc]), device(1)]
    )
    use = nvml.usage(fake)
    u0 = use["GPU-00000000-0000-0000-0000-000000000000"]
    assert (u0.utilization, u0.memory_used_bytes, u0.temperature_c, u0.power_w) == (
        0.85,
        10 * MIB,
        61,
        301.5,
    )
    assert u0.memory_total_bytes == 81559 * MIB
    assert [(p.pid, p.used_memory_bytes) for p in u0.processes] == [(4242, 3 * MIB)]
    u1 = use["GPU-00000001-0000-0000-0000-000000000000"]
    assert u1.power_w is None and not u1.active  # unsupported reading left out, not an error
    assert fake.called("nvmlShutdown") == 1


def test_an_unavailable_per_process_memory_is_none() -> None:
    unavailable = SimpleNamespace(
        pid=7, usedGpuMemory=pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
    )
    use = nvml.usage(FakeNVML([device(0, procs=[unavailable])]))
    [p] = use["GPU-00000000-0000-0000-0000-000000000000"].processes
    assert p.used_memory_bytes is None


# --- MIG ---------------------------------------------------------------------------------------


def test_a_gpu_in_mig_mode_lists_its_slices_with_profile_and_memory(tmp_path: Path) -> None:
    slices = [mig_slice(0, 0), None, mig_slice(0, 2, "3g.40gb", 40192)]
    fake = FakeNVML([device(0, mig=slices), device(1)])
    inv = nvml.read(fake, sysfs=str(tmp_path))
    assert [(g.uuid[:8], g.mig_mode) for g in inv.gpus] == [("GPU-0000", True), ("GPU-0000", False)]
    parent = inv.gpus[0].uuid
    assert [(m.parent, m.profile, m.memory_mib, m.mig_index, m.index) for m in inv.migs] == [
        (parent, "1g.10gb", 9984, 0, 0),
        (parent, "3g.40gb", 40192, 2, 0),
    ]
    assert inv.resolve("0:2").uuid == slices[2]["uuid"]  # the toolkit's GPU:SLICE form


def test_mig_mode_pending_but_not_current_lists_no_slices(tmp_path: Path) -> None:
    fake = FakeNVML([device(0, mig=[mig_slice(0, 0)], mig_current=0)])
    inv = nvml.read(fake, sysfs=str(tmp_path))
    assert (inv.gpus[0].mig_mode, inv.migs) == (False, ())
    assert fake.called("nvmlDeviceGetMigDeviceHandleByIndex") == 0


def test_a_compute_mode_is_set_by_uuid_and_the_one_it_had_is_told() -> None:
    fake = FakeNVML([device(0), device(1, compute_mode=pynvml.NVML_COMPUTEMODE_PROHIBITED)])
    modes = nvml.NvmlModes(fake)
    uuid = str(device(1)["uuid"])
    assert modes.set(uuid, nvml.EXCLUSIVE_PROCESS) == pynvml.NVML_COMPUTEMODE_PROHIBITED
    assert modes.get(uuid) == nvml.EXCLUSIVE_PROCESS
    assert modes.get(str(device(0)["uuid"])) == nvml.DEFAULT  # the other GPU kept its mode
    assert modes.set(uuid, nvml.EXCLUSIVE_PROCESS) == nvml.EXCLUSIVE_PROCESS
    assert fake.called("nvmlDeviceSetComputeMode") == 1  # a mode already set is not set again
    assert fake.called("nvmlInit") == fake.called("nvmlShutdown") == 4


def test_a_compute_mode_nvml_refuses_is_its_error() -> None:
    modes = nvml.NvmlModes(FakeNVML([device(0, user=True)]))
    with pytest.raises(pynvml.NVMLError_NoPermission):
        modes.set(str(device(0)["uuid"]), nvml.EXCLUSIVE_PROCESS)
    with pytest.raises(pynvml.NVMLError_NotFound):
        modes.get("GPU-gone")


def test_nvml_changes_no_mig_setting() -> None:
    source = Path(nvml.__file__).read_text()
    assert "nvmlDeviceSetMigMode" not in source and "Create" not in source
