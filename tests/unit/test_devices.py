"""allocator.host.devices: the GPU source, chosen once from ``gpus:``, and each source
against a stand-in (NVML with pynvml's names, a simulated file written here)."""

from __future__ import annotations

import ast
from pathlib import Path

import pynvml
import pytest
import yaml

from allocator.core.machine.health import XID, GpuEvent
from allocator.core.machine.inventory import InventoryError
from allocator.host import nvml
from allocator.host.config import Config
from allocator.host.devices import NVML, DeviceSource, source_for
from allocator.host.devices import nvml as nvml_source
from allocator.host.devices.nvml import NvmlEvents, NvmlSource
from allocator.host.devices.simulated import SimEvents, SimulatedSource
from allocator.ops import doctor
from allocator.service.wiring import Allocator
from tests.unit.test_health import FakeEvents, event
from tests.unit.test_nvml import MIB, FakeNVML, device, mig_slice

ROOT = Path(__file__).resolve().parents[2]
U0 = "GPU-00000000-0000-0000-0000-000000000000"
# Where a source's kind may be named: the factory, and the config's default.
NAMES_KINDS = {"allocator/host/devices/__init__.py", "allocator/host/config.py"}


def test_the_config_word_nvml_is_the_driver_and_anything_else_a_simulated_file() -> None:
    assert isinstance(source_for(NVML), NvmlSource)
    source = source_for("/etc/gpu-alloc/gpus.yaml")
    assert isinstance(source, SimulatedSource) and source.path == "/etc/gpu-alloc/gpus.yaml"


def test_the_factory_is_the_only_place_that_names_the_kinds() -> None:
    """No ``== "nvml"`` anywhere else: callers take the source object."""
    named = []
    for package in ("allocator", "plugin", "shim"):
        for path in sorted((ROOT / package).rglob("*.py")):
            where = str(path.relative_to(ROOT))
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and node.value == NVML:
                    named.append(f"{where}:{node.lineno}")
    assert {n.partition(":")[0] for n in named} == NAMES_KINDS, named


def test_the_service_reads_its_gpus_through_the_source_chosen_at_its_start(tmp_path) -> None:
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text(f"- {{uuid: {U0}, index: 0}}\n")
    alloc = Allocator(Config(state_dir=str(tmp_path), gpus=str(gpus)))
    source: DeviceSource = alloc.gather.devices
    assert isinstance(source, SimulatedSource)
    assert alloc.gather.inventory() == source.inventory()


# --- NVML --------------------------------------------------------------------------------------


def test_nvml_reads_the_inventory_with_its_mig_slices_and_the_use() -> None:
    fake = FakeNVML([device(0, used=10 * MIB, util=50), device(1, mig=[mig_slice(1, 0)])])
    source = NvmlSource(fake)
    inv = source.inventory()
    assert inv == nvml.read(FakeNVML(fake.devices))
    assert [g.uuid for g in inv.gpus] == [U0, "GPU-00000001-0000-0000-0000-000000000000"]
    assert [(m.parent, m.profile) for m in inv.migs] == [(inv.gpus[1].uuid, "1g.10gb")]
    assert source.usage()[U0].utilization == 0.5


def test_nvml_is_asked_again_every_max_age_seconds() -> None:
    now = [10 * nvml_source.MAX_AGE]
    source = NvmlSource(FakeNVML([]), clock=lambda: now[0])
    first = source.stamp()
    now[0] += nvml_source.MAX_AGE / 2
    assert source.stamp() == first  # kept meanwhile
    now[0] += nvml_source.MAX_AGE / 2
    assert source.stamp() != first


def test_nvml_events_come_from_its_event_set() -> None:
    fake = FakeEvents([U0])
    fake.queue.append(event(U0, pynvml.nvmlEventTypeXidCriticalError, 79))
    events = NvmlSource(fake).events()
    assert isinstance(events, NvmlEvents)
    assert [(e.uuid, e.kind, e.xid) for e in events.wait(0.1)] == [(U0, XID, 79)]


def test_nvml_without_a_driver_says_what_to_do() -> None:
    fake = FakeNVML([])
    fake.init_error = pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    source = NvmlSource(fake)
    with pytest.raises(InventoryError, match="NVML: cannot initialise"):
        source.inventory()
    assert source.describe() == "NVML"
    assert "nvidia-smi" in source.advice()


# --- the simulated file ------------------------------------------------------------------------


def write(path: Path, entries: list[dict]) -> Path:
    path.write_text(yaml.safe_dump(entries))
    return path


def test_the_simulated_file_gives_gpus_slices_use_and_events(tmp_path: Path) -> None:
    mig = {"uuid": "MIG-aaaa", "profile": "1g.10gb", "memory_mib": 9984}
    path = write(
        tmp_path / "gpus.yaml",
        [
            {"uuid": U0, "index": 0, "memory_mib": 81920, "usage": {"utilization": 0.25}},
            {"uuid": "GPU-1", "index": 1, "migs": [mig]},
        ],
    )
    source = SimulatedSource(str(path))
    inv = source.inventory()
    assert [g.uuid for g in inv.gpus] == [U0, "GPU-1"]
    assert [(m.uuid, m.parent) for m in inv.migs] == [("MIG-aaaa", "GPU-1")]
    use = source.usage()
    assert set(use) == {U0} and use[U0].utilization == 0.25
    assert use[U0].memory_total_bytes == 81920 * MIB
    events = source.events()
    assert isinstance(events, SimEvents) and events.wait(0) == []
    write(path, [{"uuid": U0, "index": 0, "xid": 79}, {"uuid": "GPU-1", "index": 1}])
    [got] = events.wait(0)
    assert (got.uuid, got.kind, got.xid) == (U0, XID, 79) and isinstance(got, GpuEvent)


def test_the_simulated_files_stamp_moves_when_it_is_written(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    source = SimulatedSource(str(path))
    assert source.stamp() is None  # absent: the inventory says why
    write(path, [{"uuid": U0, "index": 0}])
    first = source.stamp()
    write(path, [{"uuid": U0, "index": 0}, {"uuid": "GPU-1", "index": 1}])
    assert first is not None and source.stamp() != first


def test_an_unreadable_simulated_file_names_itself(tmp_path: Path) -> None:
    source = SimulatedSource(str(tmp_path / "absent.yaml"))
    with pytest.raises(InventoryError, match=r"absent\.yaml: cannot read simulated GPUs"):
        source.inventory()
    with pytest.raises(InventoryError, match=r"absent\.yaml: cannot read simulated GPU use"):
        source.usage()
    assert source.describe() == f"simulated GPUs from {tmp_path / 'absent.yaml'}"
    assert source.advice() == f"fix {tmp_path / 'absent.yaml'}"


def test_doctor_describes_the_source_and_its_fix(tmp_path: Path) -> None:
    path = write(tmp_path / "gpus.yaml", [{"uuid": U0, "index": 0}])
    line = doctor.check_inventory(Config(state_dir=str(tmp_path), gpus=str(path)))
    assert line.what == f"GPU inventory: 1 GPU(s) via simulated GPUs from {path}"
    gone = doctor.check_inventory(Config(state_dir=str(tmp_path), gpus=str(tmp_path / "x.yaml")))
    assert gone.status == doctor.FAIL and gone.fix == f"fix {tmp_path / 'x.yaml'}"
