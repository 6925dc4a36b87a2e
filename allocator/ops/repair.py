"""``gpu-alloc repair``: rebuild the ledger from what the Engine can prove."""

from __future__ import annotations

import shutil
import time

from allocator.core.leases.leases import State, StateError
from allocator.service.wiring import Allocator


def repair(alloc: Allocator, reset: bool = False) -> str:
    """Rebuild what the Engine can prove; a corrupt file is moved aside, never deleted."""
    notes = []
    turned: set[str] = set()
    try:
        alloc.ledger.read()
    except StateError:
        if not reset:
            raise  # its message names 'gpu-alloc repair --reset'
        reset = True
    if reset and alloc.ledger.path.exists():
        # Every lease ends: what dockerd would restart goes off first, so a crash before
        # the containers are adopted leaves nothing dockerd starts on GPUs nobody holds.
        turned = set(alloc.restarts.check_restarts(State()))
        aside = alloc.ledger.path.with_suffix(f".corrupt-{int(time.time())}")
        with alloc.ledger.locked():
            shutil.move(alloc.ledger.path, aside)
        notes.append(f"moved {alloc.ledger.path} to {aside}")
    report = alloc.reconciler.reconcile(adopt=True)
    turned |= set(alloc.restarts.check_restarts())
    notes.append(
        f"freed {len(report.freed)} lease(s), bound {len(report.bound)}, "
        f"adopted {len(report.adopted)} container(s), dropped {len(report.dropped)}, "
        f"turned off the restart policy of {len(turned)} container(s)"
    )
    return "\n".join(notes)
