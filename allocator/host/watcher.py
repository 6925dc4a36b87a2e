"""The health watcher: a thread in the shim (the one long-running process) that turns
NVML events into the health file, and probes unhealthy GPUs for recovery.

Sources
-------
- `NvmlEvents` registers every GPU for critical Xid, double-bit and single-bit ECC
  events (``nvmlDeviceRegisterEvents``) and waits for them with
  ``nvmlEventSetWait_v2``, one period at a time.
- `SimEvents` reads the simulated-GPU file when it changes: a GPU entry's
  ``xid: 79`` or ``xids: [79, 48]`` and ``double_bit_ecc: N`` /
  ``single_bit_ecc: N`` counts.  What is in the file when the watcher starts is
  the baseline; what appears later is an event, as NVML reports only new ones.

The pure rules are allocator.core.health; this module only gathers and applies.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

import yaml

from allocator.core.health import (
    DOUBLE_BIT,
    SINGLE_BIT,
    XID,
    GpuEvent,
    HealthPolicy,
    observe,
    probe_due,
    recover,
)
from allocator.core.leases import StateError
from allocator.host.health import HealthFile

log = logging.getLogger("gpu-alloc.health")


class EventSource(Protocol):
    def wait(self, seconds: float) -> list[GpuEvent]: ...

    def answers(self, uuids: Iterable[str]) -> set[str]: ...


class SimEvents:
    """Events from the simulated-GPU file (see the module docstring)."""

    def __init__(self, path: str, clock: Callable[[], float] = time.time):
        self.path = path
        self.clock = clock
        self._stamp: object = None
        self._seen: dict[str, tuple[tuple[int, ...], int, int]] = self._read() or {}

    def _read(self) -> dict[str, tuple[tuple[int, ...], int, int]] | None:
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            if stamp == self._stamp:
                return None
            data = yaml.safe_load(Path(self.path).read_text())
        except (OSError, yaml.YAMLError):
            return None  # the inventory loader reports a broken file
        self._stamp = stamp
        entries = data.get("gpus") if isinstance(data, dict) else data
        found = {}
        for e in entries if isinstance(entries, list) else ():
            if isinstance(e, dict) and isinstance(e.get("uuid"), str):
                xids = tuple(e.get("xids") or ()) + ((e["xid"],) if "xid" in e else ())
                found[e["uuid"]] = (
                    xids,
                    int(e.get("double_bit_ecc") or 0),
                    int(e.get("single_bit_ecc") or 0),
                )
        return found

    def wait(self, seconds: float) -> list[GpuEvent]:
        time.sleep(seconds)
        now = self._read()
        if now is None:
            return []
        events, at = [], self.clock()
        for uuid, (xids, dbe, sbe) in now.items():
            old_xids, old_dbe, old_sbe = self._seen.get(uuid, ((), 0, 0))
            events += [GpuEvent(uuid, XID, at, int(x)) for x in xids if x not in old_xids]
            events += [GpuEvent(uuid, DOUBLE_BIT, at)] * max(0, dbe - old_dbe)
            events += [GpuEvent(uuid, SINGLE_BIT, at)] * max(0, sbe - old_sbe)
        self._seen = now
        return events

    def answers(self, uuids: Iterable[str]) -> set[str]:
        self._read()
        return set(uuids) & set(self._seen)


class NvmlEvents:
    """NVML's event set over every GPU; ``nvml`` is pynvml or a stand-in with its names."""

    def __init__(self, nvml: Any = None, clock: Callable[[], float] = time.time):
        if nvml is None:
            import pynvml

            nvml = pynvml
        self.nvml = nvml
        self.clock = clock
        nvml.nvmlInit()
        self.set = nvml.nvmlEventSetCreate()
        wanted = (
            nvml.nvmlEventTypeXidCriticalError
            | nvml.nvmlEventTypeDoubleBitEccError
            | nvml.nvmlEventTypeSingleBitEccError
        )
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            try:
                mask = wanted & int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
                if mask:
                    nvml.nvmlDeviceRegisterEvents(handle, mask, self.set)
            except nvml.NVMLError as e:
                log.warning("GPU %d: cannot watch its NVML events: %s", i, e)

    def wait(self, seconds: float) -> list[GpuEvent]:
        nv = self.nvml
        try:
            data = nv.nvmlEventSetWait_v2(self.set, int(seconds * 1000))
        except nv.NVMLError as e:
            if getattr(e, "value", None) != nv.NVML_ERROR_TIMEOUT:
                log.warning("NVML event wait failed: %s", e)
                time.sleep(seconds)
            return []
        uuid = nv.nvmlDeviceGetUUID(data.device)
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        kind = {
            nv.nvmlEventTypeXidCriticalError: XID,
            nv.nvmlEventTypeDoubleBitEccError: DOUBLE_BIT,
            nv.nvmlEventTypeSingleBitEccError: SINGLE_BIT,
        }.get(data.eventType)
        if kind is None:
            return []
        return [GpuEvent(uuid, kind, self.clock(), int(data.eventData) if kind == XID else None)]

    def answers(self, uuids: Iterable[str]) -> set[str]:
        ok = set()
        for uuid in uuids:
            try:
                self.nvml.nvmlDeviceGetHandleByUUID(uuid)
                ok.add(uuid)
            except self.nvml.NVMLError:
                pass
        return ok


class Watcher:
    """One step: wait for events, record them, probe what is due.  `run` loops forever."""

    def __init__(
        self,
        source: EventSource,
        health: HealthFile,
        policy: HealthPolicy,
        held: Callable[[], set[str]],
        period: float = 1.0,
        clock: Callable[[], float] = time.time,
    ):
        self.source, self.health, self.policy = source, health, policy
        self.held, self.period, self.clock = held, period, clock

    def step(self) -> None:
        events = self.source.wait(self.period)
        current = self.health.read()
        due = [u for u, h in current.gpus.items() if probe_due(h, self.clock(), self.policy)]
        if not events and not due:
            return
        answers = self.source.answers(due) if due else set()
        held = self.held()
        with self.health.transaction() as box:
            before = box[0]
            box[0] = observe(box[0], events, self.policy)
            box[0] = recover(box[0], self.clock(), self.policy, set(due) - held, answers)
        for uuid in sorted((set(box[0].unhealthy()) - set(before.unhealthy())) & held):
            log.warning("GPU %s is unhealthy while held: its container is not stopped", uuid)

    def run(self) -> None:
        while True:
            try:
                self.step()
            except StateError as e:
                log.warning("health watcher: %s", e)
                time.sleep(self.period)
            except Exception:  # the watcher must outlive any one bad read
                log.exception("health watcher step failed")
                time.sleep(self.period)

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.run, name="gpu-alloc-health", daemon=True)
        t.start()
        return t


def watch(alloc: Any) -> threading.Thread | None:
    """Start the watcher for an `allocator.service.Allocator`, on NVML or the simulated file."""
    cfg = alloc.config
    try:
        source: EventSource = NvmlEvents() if cfg.gpus == "nvml" else SimEvents(cfg.gpus)
    except Exception as e:  # placement still works; only events go unseen
        log.error("health watcher not started: NVML events unavailable: %s", e)
        return None

    def held() -> set[str]:
        return set(alloc.ledger.read().holders(alloc.gather.inventory().uuids))

    log.info("health watcher started (period %gs)", cfg.health.period)
    policy = cfg.health.policy()
    return Watcher(source, alloc.health, policy, held, cfg.health.period).start()
