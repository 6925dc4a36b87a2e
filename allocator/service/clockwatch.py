"""The clock watch: notices the wall clock moving against the boot's clock (`clock.jump`),
logs it, and keeps it in ``state_dir/clock.json`` (allocator/host/clock.py), where
reservations (`clock.schedule`) and ``gpu-alloc doctor`` read it.  The timekeeper shows
it each reading it takes; a shim start takes the clock as it finds it."""

from __future__ import annotations

import logging
from pathlib import Path

from allocator.core.timing import clock
from allocator.core.timing.clock import Jump, Now
from allocator.host import clock as hostclock

log = logging.getLogger("gpu-alloc.clock")


class ClockWatch:
    def __init__(self, state_dir: str) -> None:
        self.state_dir = Path(state_dir)
        self._trusted: Now | None = None  # the first reading: a jump is against it
        self._moved: Jump | None = None

    def see(self, now: Now) -> None:
        """Compare ``now`` with the first reading; log and keep a new jump, or its undoing."""
        if self._trusted is None:
            self._trusted = now
            self._keep(None)
            return
        moved, was = clock.jump(self._trusted, now), self._moved
        if (moved is None and was is None) or (
            moved and was and abs(moved.by - was.by) <= clock.TOLERANCE
        ):
            return
        self._moved = moved
        self._keep(moved)
        if moved is None:
            log.info("the wall clock agrees with the boot's clock again")
        else:
            log.warning(
                "the wall clock moved by %s against the boot's clock; limits go by the "
                "boot's clock, and reservations by the clock from before the move until "
                "the shim restarts",
                clock.described(moved),
            )

    def _keep(self, moved: Jump | None) -> None:
        try:
            hostclock.keep(self.state_dir, moved)
        except OSError as e:  # logged all the same; reservations then go by the wall clock
            log.error("could not record the wall clock's move in %s: %s", self.state_dir, e)
