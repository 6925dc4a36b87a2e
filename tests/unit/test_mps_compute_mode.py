"""A shared GPU is in compute mode EXCLUSIVE_PROCESS while its MPS daemon runs, and gets
its own mode back when the daemon stops (allocator/host/mps.py); `gpu-alloc doctor`
fails one whose daemon runs in another mode.  NVML is the stand-in with pynvml's names
(tests/unit/test_nvml.py); the control program is ``true``."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from allocator.host import config
from allocator.host import mps as host_mps
from allocator.host.mps import Daemons, MpsError, modes_for
from allocator.host.nvml import EXCLUSIVE_PROCESS, NvmlModes
from allocator.ops import sharing_doctor
from tests.unit.test_nvml import FakeNVML, device

UUID = str(device(0)["uuid"])
PROHIBITED = pynvml.NVML_COMPUTEMODE_PROHIBITED


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The GPUs whose daemon was launched; launching runs ``true``."""
    seen: list[str] = []

    def launch(uuid: str, *_: object) -> list[str]:
        seen.append(uuid)
        return ["true"]

    monkeypatch.setattr(host_mps, "launch", launch)
    return seen


def daemons(tmp_path: Path, fake: FakeNVML) -> Daemons:
    return Daemons(str(tmp_path / "mps"), control="true", modes=NvmlModes(fake))


def mode(fake: FakeNVML) -> int:
    return int(fake.devices[0].get("compute_mode", pynvml.NVML_COMPUTEMODE_DEFAULT))


def test_a_gpu_is_exclusive_while_its_daemon_runs_and_gets_its_mode_back(
    tmp_path: Path, launched: list[str]
) -> None:
    fake = FakeNVML([device(0, compute_mode=PROHIBITED)])
    mps = daemons(tmp_path, fake)
    mps.start(UUID, [])
    assert launched == [UUID] and mps.running() == {UUID}
    assert mode(fake) == EXCLUSIVE_PROCESS
    mps.stop(UUID)
    assert mode(fake) == PROHIBITED and mps.running() == set()
    assert not (tmp_path / "mps" / UUID / host_mps.MODE_KEPT).exists()


def test_a_daemon_whose_mode_was_not_kept_leaves_its_gpu_in_default(
    tmp_path: Path, launched: list[str]
) -> None:
    fake = FakeNVML([device(0)])
    mps = daemons(tmp_path, fake)
    mps.start(UUID, [])
    (tmp_path / "mps" / UUID / host_mps.MODE_KEPT).unlink()  # a reboot emptied the run dir
    mps.stop(UUID)
    assert mode(fake) == pynvml.NVML_COMPUTEMODE_DEFAULT


def test_a_gpu_whose_mode_cannot_be_set_gets_no_daemon(tmp_path: Path, launched: list[str]) -> None:
    mps = daemons(tmp_path, FakeNVML([device(0, user=True)]))
    with pytest.raises(MpsError, match="EXCLUSIVE_PROCESS"):
        mps.start(UUID, [])
    assert launched == [] and mps.running() == set()


def test_a_daemon_that_fails_to_start_gives_the_gpu_its_mode_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host_mps, "launch", lambda *_: ["false"])
    fake = FakeNVML([device(0, compute_mode=PROHIBITED)])
    mps = daemons(tmp_path, fake)
    with pytest.raises(MpsError):
        mps.start(UUID, [])
    assert mode(fake) == PROHIBITED and mps.running() == set()


def test_only_the_drivers_gpus_have_a_mode_to_set(tmp_path: Path) -> None:
    assert isinstance(modes_for("nvml"), NvmlModes)
    assert modes_for(str(tmp_path / "gpus.yaml")) is None


@pytest.mark.parametrize(
    ("gpu_mode", "status"),
    [(EXCLUSIVE_PROCESS, "ok"), (pynvml.NVML_COMPUTEMODE_DEFAULT, "FAIL")],
)
def test_doctor_fails_a_shared_gpu_whose_daemon_runs_outside_exclusive_process(
    tmp_path: Path, gpu_mode: int, status: str
) -> None:
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text(f"[{{uuid: {UUID}, index: 0, memory_mib: 81920}}]\n")
    cfg = config.parse(
        f"gpus: {gpus}\nmps: {{dir: {tmp_path}/mps, control: 'true'}}\n"
        "policy: {sharing: [{gpus: [0], shares: 2}]}\n"
    )
    (tmp_path / "mps" / UUID).mkdir(parents=True)
    (tmp_path / "mps" / UUID / host_mps.MARK).write_text("")
    fake = FakeNVML([device(0, compute_mode=gpu_mode)])
    got, what, fix = sharing_doctor.check(cfg, NvmlModes(fake))
    assert got == status, what
    if status == "FAIL":
        assert f"MPS daemon of {UUID}" in what and "compute mode DEFAULT" in what
        assert fix.startswith(f"nvidia-smi -i {UUID} -c EXCLUSIVE_PROCESS")
    else:
        assert "1 MPS daemon(s) running" in what
