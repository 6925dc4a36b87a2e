"""GPU health: the rules (core), the shared file, the watcher over NVML and the simulated file,
placement, config and status."""

from __future__ import annotations

import inspect
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest
import yaml

from allocator.core.judging.ask import Ask
from allocator.core.leases.holders import Holder
from allocator.core.leases.leases import StateError
from allocator.core.machine.health import (
    DEFAULT_IGNORED_XIDS,
    DOUBLE_BIT,
    SINGLE_BIT,
    XID,
    GpuEvent,
    Health,
    HealthPolicy,
    clear,
    observe,
    recover,
)
from allocator.core.machine.inventory import GPU, Inventory
from allocator.core.placement import POLICIES, Shortage, place
from allocator.host import config as configmod
from allocator.host.devices.nvml import NvmlEvents
from allocator.host.devices.simulated import SimEvents
from allocator.host.health import HealthFile
from allocator.host.ledger import Ledger
from allocator.host.watcher import Watcher

U0, U1 = "GPU-aaaa0000", "GPU-bbbb1111"
POLICY = HealthPolicy(recheck_after=60)
T0 = 1_700_000_000.0


def xid(n: int, uuid: str = U0, at: float = T0) -> GpuEvent:
    return GpuEvent(uuid, XID, at, n)


# --- the rules ---------------------------------------------------------------------------------

EVENTS = {
    "a critical Xid marks the GPU": (xid(79), False, 0),
    "a double-bit ECC error marks the GPU": (GpuEvent(U0, DOUBLE_BIT, T0), False, 0),
    "a single-bit ECC error is only counted": (GpuEvent(U0, SINGLE_BIT, T0), True, 1),
    **{f"ignored Xid {n} changes nothing": (xid(n), True, 0) for n in sorted(DEFAULT_IGNORED_XIDS)},
}


@pytest.mark.parametrize(("event", "healthy", "single_bit"), EVENTS.values(), ids=EVENTS.keys())
def test_what_each_event_does(event: GpuEvent, healthy: bool, single_bit: int) -> None:
    h = observe(Health(), [event], POLICY).of(U0)
    assert (h.healthy, h.single_bit) == (healthy, single_bit)


def test_the_ignored_list_defaults_to_the_kubernetes_device_plugins() -> None:
    assert frozenset({13, 31, 43, 45, 68, 109}) == DEFAULT_IGNORED_XIDS


def test_a_configured_ignored_list_replaces_the_default() -> None:
    policy = HealthPolicy(ignored_xids=frozenset({79}))
    assert observe(Health(), [xid(79)], policy).of(U0).healthy
    assert not observe(Health(), [xid(13)], policy).of(U0).healthy


def test_disabled_health_ignores_every_event() -> None:
    events = [xid(79), GpuEvent(U0, DOUBLE_BIT, T0)]
    assert observe(Health(), events, HealthPolicy(disabled=True)).unhealthy() == {}


def test_the_reason_names_the_first_event_and_its_time_and_later_ones_extend_the_wait() -> None:
    h = observe(Health(), [xid(79), xid(48, at=T0 + 5)], POLICY).of(U0)
    assert h.reason() == "Xid 79 at 2023-11-14 22:13:20 UTC"
    assert h.last_event == T0 + 5


def test_clear_brings_a_gpu_back_and_keeps_its_single_bit_count() -> None:
    sick = observe(Health(), [GpuEvent(U0, SINGLE_BIT, T0), xid(79)], POLICY)
    h = clear(sick, U0).of(U0)
    assert (h.healthy, h.event, h.single_bit) == (True, None, 1)


PROBE = {
    "due, free and answering: back": (T0 + 60, {U0}, {U0}, True),
    "not yet due": (T0 + 59, {U0}, {U0}, False),
    "held by a container": (T0 + 60, set(), {U0}, False),
    "NVML does not answer for it": (T0 + 60, {U0}, set(), False),
}


@pytest.mark.parametrize(("now", "free", "answers", "back"), PROBE.values(), ids=PROBE.keys())
def test_the_automatic_probe(now: float, free: set[str], answers: set[str], back: bool) -> None:
    sick = observe(Health(), [xid(79)], POLICY)
    assert recover(sick, now, POLICY, free, answers).of(U0).healthy is back


def test_recheck_after_zero_turns_the_probe_off() -> None:
    off = HealthPolicy(recheck_after=0)
    sick = observe(Health(), [xid(79)], off)
    assert not recover(sick, T0 + 10**6, off, {U0}, {U0}).of(U0).healthy


def test_health_round_trips_through_json() -> None:
    h = observe(Health(), [xid(79), GpuEvent(U1, SINGLE_BIT, T0)], POLICY)
    assert Health.from_json(h.to_json()) == h


# --- placement ---------------------------------------------------------------------------------

INV = Inventory((GPU(U0, 0, numa_node=0), GPU(U1, 1, numa_node=0)))
SICK = {U0: "Xid 79 at 2023-11-14 22:13:20 UTC"}


def test_an_unhealthy_gpu_is_never_placed() -> None:
    picked = place(Ask((), 1, False, ("gpu",)), INV, {}, POLICIES["numa"], unhealthy=SICK)
    assert [g.uuid for g in picked] == [U1]  # type: ignore[union-attr]


def test_an_explicit_request_for_an_unhealthy_gpu_is_refused_naming_the_xid_and_time() -> None:
    refused = place(Ask((U0,), 0, False, ("gpu",)), INV, {}, POLICIES["numa"], unhealthy=SICK)
    assert isinstance(refused, Shortage)
    assert "GPU 0 (GPU-aaaa0000) had Xid 79 at 2023-11-14 22:13:20 UTC" in refused.msg
    assert "gpu-alloc health clear" in refused.msg


def test_a_shortage_names_the_unhealthy_gpu() -> None:
    held = {U1: Holder("c" * 64, "job", "leased by gpu-alloc", "l1", "bound")}
    refused = place(Ask((), 1, False, ("gpu",)), INV, held, POLICIES["numa"], unhealthy=SICK)
    assert isinstance(refused, Shortage)
    assert "GPU 0: unhealthy (Xid 79 at" in refused.msg


# --- the shared file ---------------------------------------------------------------------------


def test_the_file_is_shared_by_every_reader_and_written_atomically(tmp_path: Path) -> None:
    writer, reader = HealthFile(Ledger(tmp_path)), HealthFile(Ledger(tmp_path))
    assert reader.read() == Health()  # no file: every GPU healthy
    with writer.transaction() as box:
        box[0] = observe(box[0], [xid(79)], POLICY)
    assert list(reader.read().unhealthy()) == [U0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["health.json", "lock"]


def test_a_corrupt_file_stops_placement_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "health.json").write_text("{not json")
    with pytest.raises(StateError, match=r"health\.json: corrupt GPU health"):
        HealthFile(Ledger(tmp_path)).read()


def test_changes_are_logged_and_told_to_the_audit_trail(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", "gpu-alloc.health")
    f, heard = HealthFile(Ledger(tmp_path)), []
    f.listeners.append(lambda *turn: heard.append(turn))
    with f.transaction() as box:
        box[0] = observe(box[0], [xid(79)], POLICY)
    with f.transaction() as box:
        box[0] = observe(box[0], [xid(79)], POLICY)  # still unhealthy: no turn
    with f.transaction() as box:
        box[0] = clear(box[0], U0)
    lines = [r.getMessage() for r in caplog.records if r.name == "gpu-alloc.health"]
    levels = [r.levelname for r in caplog.records if r.name == "gpu-alloc.health"]
    assert levels == ["WARNING", "INFO"]  # the bad news is the warning
    assert lines == [
        f"GPU {U0} is unhealthy: Xid 79 at 2023-11-14 22:13:20 UTC; it is no longer granted",
        f"GPU {U0} is healthy again (was: Xid 79 at 2023-11-14 22:13:20 UTC)",
    ]
    assert heard == [
        (U0, False, "unhealthy: Xid 79 at 2023-11-14 22:13:20 UTC; it is no longer granted"),
        (U0, True, "healthy again (was: Xid 79 at 2023-11-14 22:13:20 UTC)"),
    ]


# --- the simulated source ----------------------------------------------------------------------


def sim_file(path: Path, **extra: Any) -> Path:
    path.write_text(yaml.safe_dump([{"uuid": U0, "index": 0, **extra}, {"uuid": U1, "index": 1}]))
    return path


def test_the_simulated_file_is_a_baseline_then_new_xids_are_events(tmp_path: Path) -> None:
    f = sim_file(tmp_path / "gpus.yaml", xid=13)
    src = SimEvents(str(f), clock=lambda: T0)
    assert src.wait(0) == []
    sim_file(f, xids=[13, 79], double_bit_ecc=1, single_bit_ecc=2)
    assert src.wait(0) == [
        xid(79),
        GpuEvent(U0, DOUBLE_BIT, T0),
        GpuEvent(U0, SINGLE_BIT, T0),
        GpuEvent(U0, SINGLE_BIT, T0),
    ]
    assert src.wait(0) == []  # an unchanged file repeats nothing
    assert src.answers([U0, "GPU-gone"]) == {U0}


def test_a_change_the_probe_reads_is_still_an_event(tmp_path: Path) -> None:
    """The probe asks which GPUs answer between two waits: a new Xid then is not lost."""
    f = sim_file(tmp_path / "gpus.yaml")
    src = SimEvents(str(f), clock=lambda: T0)
    sim_file(f, xid=79)
    assert src.answers([U0, U1]) == {U0, U1}
    assert src.wait(0) == [xid(79)]


def test_the_watcher_takes_a_gpu_out_in_one_step_and_the_probe_brings_it_back(
    tmp_path: Path,
) -> None:
    f = sim_file(tmp_path / "gpus.yaml")
    now = [T0]
    health = HealthFile(Ledger(tmp_path / "state"))
    held: set[str] = {U0}
    w = Watcher(SimEvents(str(f), lambda: now[0]), health, POLICY, lambda: held, 0, lambda: now[0])
    sim_file(f, xid=79)
    w.step()
    assert health.read().unhealthy() == {U0: "Xid 79 at 2023-11-14 22:13:20 UTC"}
    now[0] += 60
    w.step()
    assert not health.read().of(U0).healthy  # still held: its holder is not disturbed
    held.clear()
    w.step()
    assert health.read().of(U0).healthy


def test_a_held_gpu_that_turns_unhealthy_is_reported_not_stopped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    f = sim_file(tmp_path / "gpus.yaml")
    health = HealthFile(Ledger(tmp_path / "state"))
    w = Watcher(SimEvents(str(f)), health, POLICY, lambda: {U0}, 0)
    sim_file(f, xid=79)
    w.step()
    assert f"GPU {U0} is unhealthy while held: its container is not stopped" in caplog.text
    assert f"GPU {U1} is unhealthy" not in caplog.text


def test_an_ignored_xid_in_the_file_leaves_the_gpu_healthy(tmp_path: Path) -> None:
    f = sim_file(tmp_path / "gpus.yaml")
    health = HealthFile(Ledger(tmp_path / "state"))
    w = Watcher(SimEvents(str(f)), health, POLICY, set, 0)
    sim_file(f, xid=43)
    w.step()
    assert health.read().unhealthy() == {}


def test_the_inventory_loader_accepts_the_event_keys(tmp_path: Path) -> None:
    from allocator.host.inventory import load_file

    inv = load_file(str(sim_file(tmp_path / "g.yaml", xid=79, single_bit_ecc=1)))
    assert [g.uuid for g in inv.gpus] == [U0, U1]


# --- NVML events, against a stand-in with pynvml's names ---------------------------------------


class FakeEvents:
    """pynvml's event functions; ``queue`` holds what nvmlEventSetWait_v2 returns."""

    NVMLError = pynvml.NVMLError
    NVML_ERROR_TIMEOUT = pynvml.NVML_ERROR_TIMEOUT
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError
    nvmlEventTypeDoubleBitEccError = pynvml.nvmlEventTypeDoubleBitEccError
    nvmlEventTypeSingleBitEccError = pynvml.nvmlEventTypeSingleBitEccError

    def __init__(self, uuids: list[str]) -> None:
        self.uuids = uuids
        self.queue: list[SimpleNamespace] = []
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def _c(self, name: str, *args: Any) -> None:
        self.calls.append((name, args))

    def nvmlInit(self) -> None:
        self._c("nvmlInit")

    def nvmlEventSetCreate(self) -> str:
        self._c("nvmlEventSetCreate")
        return "set"

    def nvmlDeviceGetCount(self) -> int:
        self._c("nvmlDeviceGetCount")
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        self._c("nvmlDeviceGetHandleByIndex", index)
        return self.uuids[index]

    def nvmlDeviceGetSupportedEventTypes(self, handle: str) -> int:
        self._c("nvmlDeviceGetSupportedEventTypes", handle)
        return 0xFF

    def nvmlDeviceRegisterEvents(self, handle: str, types: int, event_set: str) -> None:
        self._c("nvmlDeviceRegisterEvents", handle, types, event_set)

    def nvmlEventSetWait_v2(self, event_set: str, timeoutms: int) -> SimpleNamespace:
        self._c("nvmlEventSetWait_v2", event_set, timeoutms)
        if not self.queue:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return self.queue.pop(0)

    def nvmlDeviceGetUUID(self, handle: str) -> bytes:
        self._c("nvmlDeviceGetUUID", handle)
        return handle.encode()

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        self._c("nvmlDeviceGetHandleByUUID", uuid)
        if uuid not in self.uuids:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return uuid


def event(handle: str, kind: int, data: int = 0) -> SimpleNamespace:
    return SimpleNamespace(
        device=handle, eventType=kind, eventData=data, gpuInstanceId=0, computeInstanceId=0
    )


def test_the_event_stand_in_mirrors_pynvml() -> None:
    names = [n for n in vars(FakeEvents) if n.startswith("nvml") and callable(vars(FakeEvents)[n])]
    for name in names:
        assert callable(getattr(pynvml, name, None)), f"pynvml has no {name}"
    fields = {f for f, _ in pynvml.c_nvmlEventData_t._fields_}
    assert fields == set(vars(event(U0, 0)))
    fake = FakeEvents([U0])
    fake.queue.append(event(U0, pynvml.nvmlEventTypeXidCriticalError, 79))
    src = NvmlEvents(fake, clock=lambda: T0)
    src.wait(1)
    src.wait(1)
    src.answers([U0, U1])
    for name, args in fake.calls:
        inspect.signature(getattr(pynvml, name)).bind(*args)


def test_every_gpu_is_registered_for_critical_xid_and_both_ecc_events() -> None:
    fake = FakeEvents([U0, U1])
    NvmlEvents(fake)
    registered = [a for n, a in fake.calls if n == "nvmlDeviceRegisterEvents"]
    assert registered == [(U0, 0b1011, "set"), (U1, 0b1011, "set")]


def test_nvml_events_become_gpu_events_and_a_timeout_is_no_event() -> None:
    fake = FakeEvents([U0])
    fake.queue += [
        event(U0, pynvml.nvmlEventTypeXidCriticalError, 79),
        event(U0, pynvml.nvmlEventTypeDoubleBitEccError),
    ]
    src = NvmlEvents(fake, clock=lambda: T0)
    assert src.wait(0.5) == [xid(79)]
    assert src.wait(0.5) == [GpuEvent(U0, DOUBLE_BIT, T0)]
    assert src.wait(0.5) == []
    assert ("nvmlEventSetWait_v2", ("set", 500)) in fake.calls
    assert src.answers([U0, U1]) == {U0}


# --- config ------------------------------------------------------------------------------------


def test_health_config_keys() -> None:
    cfg = configmod.parse("health: {ignored_xids: [13, 79], recheck_after: 30, disabled: true}")
    assert cfg.health.policy() == HealthPolicy(True, frozenset({13, 79}), 30)
    assert configmod.Config().health.policy() == HealthPolicy()


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("health: {ignored_xids: [x]}", "health.ignored_xids"),
        ("health: {ignored_xids: 13}", "health.ignored_xids"),
        ("health: {recheck_after: -1}", "health.recheck_after"),
        ("health: {period: 0}", "health.period"),
        ("health: {disabled: 1}", "health.disabled"),
        ("health: {recheck: 1}", "health.recheck"),
    ],
)
def test_bad_health_config_names_the_key(text: str, key: str) -> None:
    with pytest.raises(configmod.ConfigError, match=f"key '{key}'"):
        configmod.parse(text)


# --- doctor ------------------------------------------------------------------------------------


def test_doctor_names_an_unhealthy_gpu_and_the_command_that_clears_it(tmp_path: Path) -> None:
    from allocator.ops.doctor import WARN, check_health

    f = sim_file(tmp_path / "gpus.yaml")
    cfg = configmod.parse(f"state_dir: {tmp_path / 'state'}\ngpus: {f}")
    assert check_health(cfg).status == "ok"
    with HealthFile(Ledger(tmp_path / "state")).transaction() as box:
        box[0] = observe(box[0], [xid(79)], POLICY)
    line = check_health(cfg)
    assert line.status == WARN and "GPU 0 (Xid 79 at" in line.what
    assert line.fix.endswith("then: gpu-alloc health clear 0")
