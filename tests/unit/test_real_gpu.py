"""The NVML code against a real NVIDIA driver, read-only: skipped where there is none.

Everything else tests allocator/host/nvml.py and the health watcher against stand-ins
with pynvml's names; these run the same code on the machine's own GPUs and check what
it read against the driver's other tool, ``nvidia-smi``.  Nothing here changes a GPU
setting (no MIG mode, clocks, persistence or resets): NVML is only asked.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from allocator.core.machine.inventory import GPU
from allocator.core.placement import best_effort
from allocator.host import nvml, usage
from allocator.host.devices.nvml import NvmlEvents, NvmlSource


def _driver() -> str | None:
    """Why there is no driver to test, or None."""
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except Exception as e:
        return f"no NVIDIA driver: {e}"
    return None


NO_DRIVER = _driver()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(NO_DRIVER is not None, reason=str(NO_DRIVER))]


def smi(*fields: str) -> list[list[str]]:
    """``nvidia-smi --query-gpu`` rows; skips when the tool is missing."""
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi missing")
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return [[v.strip() for v in line.split(",")] for line in out.stdout.splitlines() if line]


@pytest.fixture(scope="module")
def inventory():
    return nvml.read()


def test_the_inventory_is_what_nvidia_smi_lists(inventory) -> None:
    rows = smi("index", "uuid", "name", "memory.total", "pci.bus_id")
    assert [(g.index, g.uuid, g.name) for g in inventory.gpus] == [
        (int(i), uuid, name) for i, uuid, name, _, _ in rows
    ]
    for g, (_, _, _, mib, bus) in zip(inventory.gpus, rows, strict=True):
        assert g.memory_mib == int(mib)
        assert g.pci_bus_id.lower().endswith(bus.lower()[-12:])
        assert g.minor is not None and os.path.exists(f"/dev/nvidia{g.minor}")


def test_the_driver_says_its_cuda_version(inventory) -> None:
    assert inventory.cuda_driver_version is not None
    major, minor = inventory.cuda_driver_version
    assert major >= 11 and 0 <= minor < 100


def test_links_are_read_as_placement_ranks_them(inventory) -> None:
    gpus: tuple[GPU, ...] = inventory.gpus
    for g in gpus:
        assert {peer for peer, _ in g.pcie} <= {p.index for p in gpus} - {g.index}
        assert all(level in nvml.TOPOLOGY_LEVELS.values() for _, level in g.pcie)
        assert all(count > 0 for _, count in g.nvlinks)
    for size in range(1, len(gpus) + 1):
        picked = best_effort.allocate(gpus, [], size)
        assert picked is not None and len({g.uuid for g in picked}) == size


def test_mig_state_is_read_without_changing_it(inventory) -> None:
    rows = smi("index", "mig.mode.current")
    for g, (_, mode) in zip(inventory.gpus, rows, strict=True):
        assert g.mig_mode == (mode == "Enabled")
    for m in inventory.migs:
        parent = next(g for g in inventory.gpus if g.uuid == m.parent)
        assert parent.mig_mode and m.index == parent.index and m.profile


def test_usage_has_every_gpu_and_readings_in_range(inventory) -> None:
    used = NvmlSource().usage()
    assert set(used) >= {g.uuid for g in inventory.gpus}
    for g in inventory.gpus:
        u = used[g.uuid]
        assert u.memory_total_bytes and u.memory_total_bytes // 2**20 >= g.memory_mib
        assert u.utilization is None or 0.0 <= u.utilization <= 1.0
        assert u.memory_used_bytes is None or 0 <= u.memory_used_bytes <= u.memory_total_bytes
        for p in u.processes:  # each maps to a container or to none, never an error
            assert usage.container_of(p.pid) is None or len(usage.container_of(p.pid) or "") == 64


def test_nvml_events_register_and_a_quiet_wait_returns_none(inventory) -> None:
    events = NvmlEvents()
    assert events.wait(0.2) == []
    assert events.answers(g.uuid for g in inventory.gpus) == {g.uuid for g in inventory.gpus}
    assert events.answers(["GPU-00000000-0000-0000-0000-000000000000"]) == set()


def test_each_gpus_compute_mode_is_what_nvidia_smi_says(inventory) -> None:
    """Read only: an MPS test sets the mode, and sets it back (test_real_gpu_sharing.py)."""
    said = {uuid: mode.upper() for uuid, mode in smi("uuid", "compute_mode")}
    modes = nvml.NvmlModes()
    assert {g.uuid: nvml.COMPUTE_MODES[modes.get(g.uuid)] for g in inventory.gpus} == said
