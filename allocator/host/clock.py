"""The host's clocks, read for the core's measures (allocator/core/timing/clock.py), and the
last jump of the wall clock the shim saw, kept in ``state_dir/clock.json`` for the other
processes that go by reservations (the plugin, ``gpu-alloc`` commands) and for ``doctor``."""

from __future__ import annotations

import contextlib
import json
import time
from functools import cache
from pathlib import Path

from allocator.core.timing import clock
from allocator.core.timing.clock import Jump, Now
from allocator.host import store

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")  # new at each boot
JUMP_FILE = "clock.json"


def read() -> Now:
    """The wall clock, and this boot's id and ``CLOCK_BOOTTIME`` (which nobody can set)."""
    return Now(time.time(), boot_id(), time.clock_gettime(time.CLOCK_BOOTTIME))


@cache
def boot_id() -> str:
    """This boot's id; ``""`` where the kernel does not say (then only the wall clock counts)."""
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


def jumped(state_dir: Path) -> Jump | None:
    """The jump the shim last saw and has not seen undone (`keep`); None: none, or unreadable."""
    try:
        return Jump.from_json(json.loads((state_dir / JUMP_FILE).read_bytes()))
    except (OSError, ValueError):
        return None


def keep(state_dir: Path, moved: Jump | None) -> None:
    """Record ``moved`` for `jumped` (None: the clock agrees with the boot's again)."""
    path = state_dir / JUMP_FILE
    if moved is None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    store.replace(path, json.dumps(moved.to_json()).encode(), mode=0o644)


def schedule(state_dir: Path) -> float:
    """The wall time reservations go by now (`clock.schedule`)."""
    return clock.schedule(read(), jumped(state_dir))
