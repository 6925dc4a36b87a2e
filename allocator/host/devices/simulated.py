"""A YAML file as the GPU source (tests and demos): the format is allocator/host/inventory.py's.

The inventory is read again whenever the file changes.  A GPU entry's ``usage:`` is
its live use, e.g.::

    - uuid: GPU-...
      index: 0
      usage: {utilization: 0.85, memory_used_mib: 30000, temperature_c: 61,
              power_w: 240, processes: [{pid: 4242, used_memory_mib: 29000}]}

so the live view, the idle mark and the metrics are tested without a GPU.  Its
``xid: 79``, ``xids: [79, 48]``, ``double_bit_ecc: N`` and ``single_bit_ecc: N`` are
health events: what is in the file when the watcher starts is the baseline, what
appears later is an event (NVML too reports only new ones).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

from allocator.core.machine.health import DOUBLE_BIT, SINGLE_BIT, XID, GpuEvent
from allocator.core.machine.inventory import Inventory, InventoryError
from allocator.core.machine.usage import Process, Usage
from allocator.host.inventory import load_file

MIB = 1024 * 1024


class SimulatedSource:
    def __init__(self, path: str):
        self.path = path

    def describe(self) -> str:
        return f"simulated GPUs from {self.path}"

    def advice(self) -> str:
        return f"fix {self.path}"

    def stamp(self) -> object:
        """The file's inode, mtime and size (None when absent: `inventory` says why)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def inventory(self) -> Inventory:
        return load_file(self.path)

    def usage(self) -> dict[str, Usage]:
        try:
            data = yaml.safe_load(Path(self.path).read_text())
        except (OSError, yaml.YAMLError) as e:
            raise InventoryError(f"{self.path}: cannot read simulated GPU use: {e}") from None
        if isinstance(data, dict):
            data = data.get("gpus")
        found = {}
        for entry in data if isinstance(data, list) else ():
            if isinstance(entry, dict) and isinstance(entry.get("usage"), dict):
                found[str(entry["uuid"])] = _usage(entry["usage"], entry.get("memory_mib"))
        return found

    def events(self) -> SimEvents:
        return SimEvents(self.path)


def _mib(value: Any) -> int | None:
    return None if value is None else int(float(value) * MIB)


def _usage(u: dict[str, Any], memory_mib: Any) -> Usage:
    procs = tuple(
        Process(int(p["pid"]), _mib(p.get("used_memory_mib")), str(p.get("name") or ""))
        for p in u.get("processes") or ()
    )
    util = u.get("utilization")
    return Usage(
        utilization=None if util is None else float(util),
        memory_used_bytes=_mib(u.get("memory_used_mib")),
        memory_total_bytes=_mib(memory_mib) if memory_mib else None,
        temperature_c=u.get("temperature_c"),
        power_w=u.get("power_w"),
        processes=procs,
    )


class SimEvents:
    """Health events from the simulated-GPU file, read when it changes."""

    def __init__(self, path: str, clock: Callable[[], float] = time.time):
        self.path = path
        self.clock = clock
        self._stamp: object = None
        self._seen: dict[str, tuple[tuple[int, ...], int, int]] = self._read() or {}

    def _read(self) -> dict[str, tuple[tuple[int, ...], int, int]] | None:
        """The file's GPUs when it changed since the last read, else None."""
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            if stamp == self._stamp:
                return None
            found = self._parse()
        except (OSError, yaml.YAMLError):
            return None  # the inventory loader reports a broken file
        self._stamp = stamp
        return found

    def _parse(self) -> dict[str, tuple[tuple[int, ...], int, int]]:
        """Each GPU in the file: its Xids, double-bit and single-bit ECC counts."""
        data = yaml.safe_load(Path(self.path).read_text())
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
        """The GPUs still in the file.  Read without taking its change from `wait`: a
        change read here would otherwise never be an event."""
        try:
            present = self._parse()
        except (OSError, yaml.YAMLError):
            return set()
        return set(uuids) & set(present)
