"""The health watcher: a thread in the shim (the one long-running process) that turns
the GPU source's health events into the health file, and probes unhealthy GPUs for
recovery.  The events come from the host's `DeviceSource` (allocator/host/devices/:
NVML's event set, or the simulated file's ``xid:`` and ECC counts).

The pure rules are allocator.core.machine.health; this module only gathers and applies.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from allocator.core.leases.leases import StateError
from allocator.core.machine.health import HealthPolicy, observe, probe_due, recover
from allocator.host.devices import EventSource
from allocator.host.health import HealthFile

log = logging.getLogger("gpu-alloc.health")


class Watcher:
    """One step: wait for events, record them, probe what is due.  `run` loops."""

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

    def run(self, stop: threading.Event) -> None:
        """Step until ``stop`` is set; a failed step is logged, and the next comes a
        period later (the watcher must outlive any one bad read)."""
        while not stop.is_set():
            try:
                self.step()
            except StateError as e:
                log.warning("health watcher: %s", e)
                stop.wait(self.period)
            except Exception:
                log.exception("health watcher step failed")
                stop.wait(self.period)


def watch(alloc: Any) -> bool:
    """Add the watcher to an `allocator.service.wiring.Allocator`'s background work, on its GPU
    source's events; False when they cannot be subscribed to (placement still works)."""
    cfg = alloc.config
    try:
        source = alloc.gather.devices.events()
    except Exception as e:  # placement still works; only events go unseen
        log.error("health watcher not started: GPU events unavailable: %s", e)
        return False

    def held() -> set[str]:
        return set(alloc.ledger.read().holders(alloc.gather.inventory().uuids))

    log.info("health watcher started (period %gs)", cfg.health.period)
    policy = cfg.health.policy()
    alloc.background.add(
        "health", Watcher(source, alloc.health, policy, held, cfg.health.period).run
    )
    return True
