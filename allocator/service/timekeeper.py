"""The timekeeper: the shim's thread that stops GPU containers past their time limit
(allocator/core/timing/timelimits.py) and, with ``policy.reclaim_idle_after``, idle ones
(allocator/core/timing/reclaim.py), each sent its checkpoint signal first when its lease
has one (allocator/core/timing/checkpoint.py); without one its owner is told at 80 % and
90 % of the limit, and at 80 % of the idle time (allocator/service/notifier.py).

Each look reads the ledger; only while a lease has a time limit, or idle reclaim is
on, does it list gpu-alloc's containers (one Engine call); a paused one counts as
running (`timelimits.RUNNING_STATES`).  A running container whose lease has a limit
gets its clock started from the Engine's first start of it: the earliest of its
StartedAt and the first ``start`` event dockerd still holds since the grant, so neither
a late look (up to `timelimits.CHECK_MAX` after the start) nor a restart before it moves
the clock.  A container
to stop has its restart policy turned off first (dockerd would start it again by
itself at its next start), then gets the Engine's own stop: its stop signal, then
SIGKILL after its ``StopTimeout`` (10 s by default, at most 30 s: `timelimits.grace`).
Each stop is audited (``time-limit``, ``idle-reclaim``) and counted
(``gpu_alloc_stops_total``), each signal too (``signal``, ``gpu_alloc_signals_total``),
and recorded in the lease once sent (`Lease.signalled`), so none is sent twice; the
container keeps its lease, which then ends by
``policy.release_stopped_after`` or its removal, as any stopped container's.  Stops
run on threads of their own, so a long grace period holds up no other container's.
Each look's clock reading also goes to the clock watch (allocator/service/clockwatch.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from allocator.core.api import labels
from allocator.core.leases import clock, restarts
from allocator.core.leases.clock import Now
from allocator.core.leases.leases import Lease
from allocator.core.machine import usage as usage_core
from allocator.core.machine.inventory import InventoryError
from allocator.core.timing import checkpoint, reclaim, timelimits
from allocator.host import clock as hostclock
from allocator.host import metrics, usage
from allocator.host.config import Config
from allocator.host.engine import Engine, EngineError, go_time
from allocator.host.ledger import Ledger
from allocator.service.background import Background
from allocator.service.clockwatch import ClockWatch
from allocator.service.gather import Gatherer
from allocator.service.notifier import Notifier
from allocator.service.recorder import Recorder

log = logging.getLogger("gpu-alloc.timekeeper")
TIME_LIMIT, IDLE = "time-limit", "idle-reclaim"  # audit kinds, and the metric's reasons
SIGNAL = "signal"  # the audit kind of a checkpoint signal


class Timekeeper:
    """Stops the GPU containers past their time limit or idle too long (`check`); the
    shim looks (`look`) from its background work (allocator/service/background.py), and each
    stop runs as a task of its own there."""

    def __init__(
        self,
        config: Config,
        engine: Engine | None,
        ledger: Ledger,
        gather: Gatherer,
        recorder: Recorder,
        background: Background,
        notifier: Notifier,
    ) -> None:
        self.config = config
        self.notifier = notifier
        self.background = background
        self.engine = engine
        self.ledger = ledger
        self.gather = gather
        self.recorder = recorder
        self.activity = usage.Activity(config.state_dir)
        self._stopping: set[str] = set()  # containers a stop is on its way to
        self._lock = threading.Lock()
        self.clockwatch = ClockWatch(config.state_dir)
        # GPU -> its last use, container -> its last start, on the boot's clock as first
        # met (`clock.placed`): a clock set later moves neither.
        self._used: dict[str, Now] = {}
        self._starts: dict[str, Now] = {}

    def look(self) -> float:
        """One look now (`check`); the shim runs it from its background work."""
        now = hostclock.read()
        self.clockwatch.see(now)
        return self.check(now)

    def check(self, now: Now) -> float:
        """One look: start clocks, stop what is due; seconds until the next look."""
        rules, engine = self.gather.rules, self.engine
        leases = timelimits.live(self.ledger.read().leases.values())
        limited = any(le.time_limit is not None for le in leases)
        if engine is None or not leases or not (limited or rules.reclaim_idle_after):
            return timelimits.next_check(leases, now, rules.reclaim_idle_after)
        running = {
            c["Id"]
            for c in engine.containers(label=labels.LEASE)
            if c.get("State") in timelimits.RUNNING_STATES
        }
        if timelimits.unstarted(leases, running):
            self._start_clocks(timelimits.unstarted(leases, running), now)
            leases = timelimits.live(self.ledger.read().leases.values())
        for le in timelimits.overdue(leases, running, now):
            self._stop_later(le, TIME_LIMIT, timelimits.reason(le))
        for le in checkpoint.before_limit(leases, running, now):
            self._signal(le, TIME_LIMIT, "time limit", now)
        for le, share in checkpoint.time_warnings(leases, running, now):
            self.notifier.time_warning(le, share)
        after = rules.reclaim_idle_after
        if after is not None:
            idle = self._idle(leases, running, now, after)
            warn, stop = checkpoint.before_reclaim(idle, now, after)
            for le, idled in checkpoint.idle_warnings(idle, after):
                self.notifier.idle_warning(le, round(now.wall - idled), after)
            for le in warn:
                self._signal(le, IDLE, "idle reclaim", now)
            for le in stop:
                self._stop_later(le, IDLE, reclaim.reason(after))
        wait = timelimits.next_check(leases, now, after)
        soon = checkpoint.next_signal(leases, now)
        return wait if soon is None else max(timelimits.CHECK_MIN, min(wait, soon))

    def _start_clocks(self, leases: Sequence[Lease], now: Now) -> None:
        """Each lease's clock from its container's first start, as the Engine says it,
        placed on the boot's clock (`clock.seen`: not before the grant)."""
        assert self.engine is not None
        found = {}
        for le in leases:
            info = self.engine.inspect(str(le.container))
            stamps = [go_time(((info or {}).get("State") or {}).get("StartedAt"))]
            try:
                stamps.append(self.engine.first_start(str(le.container), le.created - 1))
            except EngineError as e:  # its StartedAt alone: at worst, a late look's
                log.warning("start events of %s unread: %s", le.name, e)
            known = [s for s in stamps if s is not None]
            if known:
                granted = clock.at(le.created, le.granted_boot)
                found[le.id] = (str(le.container), clock.seen(min(known), now, granted))
        if found:
            with self.ledger.transaction() as state:
                for lease_id, (cid, stamp) in found.items():
                    state.start_clock(lease_id, cid, stamp.wall, stamp.mark)

    def _idle(
        self, leases: list[Lease], running: set[str], now: Now, after: float
    ) -> list[tuple[Lease, float]]:
        """(lease, seconds idle) of the running containers idle long enough to signal or
        stop, their last start counted (one inspect each, of the few that look idle)."""
        try:
            use = self.gather.devices.usage()
        except InventoryError:
            return []  # no reading: nothing is known to be idle
        active = {u for u, x in use.items() if x.active}
        seen = self.activity.observe(active, now.wall, min(60.0, after / 4))
        self._used = clock.placed(self._used, seen, now)
        args = (usage_core.known(use), active, self._used, now, self.gather.rules)
        maybe = reclaim.idle(leases, dict.fromkeys(running), *args)
        assert self.engine is not None or not maybe
        walls: dict[str, float] = {}
        for le, _ in maybe:
            info = self.engine.inspect(str(le.container)) if self.engine else None
            stamp = go_time(((info or {}).get("State") or {}).get("StartedAt"))
            if stamp is not None:
                walls[str(le.container)] = stamp
        kept = {c: s for c, s in self._starts.items() if c in running}
        self._starts = kept | clock.placed(kept, walls, now)
        started = {str(le.container): self._starts.get(str(le.container)) for le, _ in maybe}
        return reclaim.idle([le for le, _ in maybe], started, *args)

    def _signal(self, lease: Lease, kind: str, before: str, now: Now) -> None:
        """Send the lease's checkpoint signal, then record it in the lease as sent at the
        look's ``now``: a look after a shim restart finds it sent.  One the Engine refused
        (the container stopped since the look: a 409) is tried again at the next look
        that finds it running."""
        cid = str(lease.container)
        assert self.engine is not None
        why = checkpoint.reason(lease, before)
        try:
            self.engine.kill(cid, lease.signal)
        except EngineError as e:
            log.warning("could not signal container %s (%s): %s", lease.name, kind, e)
            return
        log.info("signalled container %s (lease %s): %s", lease.name, lease.id, why)
        with self.ledger.transaction() as state:
            state.signalled(lease.id, cid, now.wall, now.mark)
        metrics.signalled(kind)
        self.recorder.record(SIGNAL, lease, reason=why)

    def _stop_later(self, lease: Lease, kind: str, why: str) -> None:
        cid = str(lease.container)
        with self._lock:
            if cid in self._stopping:
                return
            self._stopping.add(cid)
        self.background.once(f"stop-{cid[:12]}", self._stop_one, lease, kind, why)

    def _stop_one(self, lease: Lease, kind: str, why: str) -> None:
        """Restart policy off, then the Engine's stop; audited and counted once done."""
        cid = str(lease.container)
        engine = self.engine
        assert engine is not None
        try:
            info = engine.inspect(cid)
            if not ((info or {}).get("State") or {}).get("Running"):
                return  # stopped or removed since the look
            assert info is not None
            had = restarts.standing(info)
            if had:
                engine.update(cid, restarts.OFF)
                why += f"; its restart policy {had} was turned off, so dockerd never starts it"
            log.info("stopping container %s (lease %s): %s", lease.name, lease.id, why)
            engine.stop(cid, timelimits.grace((info.get("Config") or {}).get("StopTimeout")))
        except EngineError as e:
            log.warning("could not stop container %s (%s): %s", lease.name, kind, e)
            return
        finally:
            with self._lock:
                self._stopping.discard(cid)
        metrics.stopped(kind)
        self.recorder.record(kind, lease, reason=why)
