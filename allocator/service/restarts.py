"""Which starts gpu-alloc lets happen: those asked for, and those a restart policy makes.

A start (or restart) asked on any socket is judged by `start_refusal`.  dockerd also
starts containers by itself, as their restart policy says, at its own start and after
they exit, asking nobody; so a restart policy is allowed only on a container a start
of which would be allowed (`allocator.core.leases.restarts`): an update that sets one on any
other container is refused (`restart_refusal`), a Compose predecessor's policy is
turned off before it lends its GPUs (`hold_down`), and at shim start, and after each
policy reload, every policy a start of whose container would be refused is turned off
(`check_restarts`, `follow_policy`).
"""

from __future__ import annotations

import logging
import threading
from functools import partial
from pathlib import Path
from typing import Any

from allocator.core.access import access
from allocator.core.judging import starts
from allocator.core.judging.verdicts import ACCESS_READS, START_READS, Facts
from allocator.core.leases import clock, restarts
from allocator.core.leases.clock import Now
from allocator.core.leases.leases import Lease, State, StateError
from allocator.core.rules import policy
from allocator.core.timing import reservations as rsv
from allocator.core.timing import timelimits
from allocator.host import clock as hostclock
from allocator.host.engine import Engine, EngineError, go_time
from allocator.host.ledger import Ledger
from allocator.service.background import Background
from allocator.service.gather import POLICY_CHECK_EVERY, Gatherer
from allocator.service.reconciler import Reconciler
from allocator.service.recorder import Recorder
from allocator.service.reserving import Reservations

log = logging.getLogger("gpu-alloc")
_INSPECT = object()  # start_refusal's default: inspect the reference itself


class Restarts:
    """Starts, asked (`start_refusal`) and standing (the restart policies).

    ``reconciler`` says which containers hold no GPU (`check_restarts` skips them);
    ``reservations``: the windows a start may not run into (None: none are kept).
    """

    def __init__(
        self,
        engine: Engine | None,
        ledger: Ledger,
        gather: Gatherer,
        recorder: Recorder,
        reconciler: Reconciler,
        reservations: Reservations | None = None,
    ):
        self.reservations = reservations
        self.engine = engine
        self.ledger = ledger
        self.gather = gather
        self.recorder = recorder
        self.reconciler = reconciler

    def start_refusal(
        self, ref: str, info: dict | object | None = _INSPECT, state: State | None = None
    ) -> str | None:
        """Why a start (or restart) of container ``ref`` must be refused, if it must.

        dockerd grants at start: the container is inspected now (the Engine resolves
        ``ref`` as it will for the start) and its access judged with host facts read
        now, by `starts.refusal`.  The plugin's own inspect is a GET, which its fast
        path clears without a worker's lock.  When the ledger cannot be read, a
        container without GPUs still starts, so a broken state file stops GPU work only.
        ``info``: the inspect the caller made already (`resolve` keeps it, to say which
        container was judged).  ``state``: the ledger to judge against, when it is not
        the one on disk (a reset about to drop every lease).
        """
        ledger: State | str
        try:
            ledger = self.ledger.read() if state is None else state
        except StateError as e:
            ledger = str(e)
        if info is _INSPECT:
            info = self.engine.inspect(ref) if self.engine else None
        assert info is None or isinstance(info, dict)
        if info and not isinstance(ledger, str) and info["Id"] in ledger.expired:
            return self._gave_up(ref, info) or policy.expired_text(ref, self.gather.rules)
        if info and not isinstance(ledger, str):  # policy.time_limit: its time is up
            why = timelimits.start_refusal(ref, ledger.lease_of(str(info["Id"])), hostclock.read())
            why = why or self._reserved(ref, ledger.lease_of(str(info["Id"])))
            if why is not None:
                return why
        old_info = None
        if info is not None and not isinstance(ledger, str) and self.engine is not None:
            lease = ledger.lease_of(str(info.get("Id") or ""))
            old = ledger.predecessor_of(lease.id) if lease else None
            if old is not None and old.container:
                old_info = self.engine.inspect(old.container)  # by full id: None if gone
        cid = str((info or {}).get("Id") or "")
        owner = self.reconciler.recorded_owner(cid, None if isinstance(ledger, str) else ledger)

        def refusal(facts: Facts) -> str | None:
            return starts.refusal(
                ref, info, ledger, facts.engine, facts.known_gpus, facts.host, old_info,
                facts.volume_of, owner, facts.privileged_mode, facts.container_of,
            )  # fmt: skip

        return self.gather.decide(refusal, START_READS)

    def _reserved(self, ref: str, lease: Lease | None) -> str | None:
        """A start on a GPU another holder's reservation keeps, inside its window
        (`core.timing.reservations.start_refusal`); the reservations are read only for a
        container with a lease."""
        if lease is None or self.reservations is None:
            return None
        now = hostclock.schedule(Path(self.gather.config.state_dir))
        kept = self.reservations.current(now)
        if not kept:
            return None
        return rsv.start_refusal(ref, lease, kept, self.reservations.owner_of(lease, kept), now)

    def _gave_up(self, ref: str, info: dict[str, Any]) -> str | None:
        """Why a container whose lease ended cannot start, when it ended because it held a
        GPU another holder's window took (`Reconciler`, `core.timing.reservations.yielding`)."""
        if self.reservations is None:
            return None
        now = hostclock.schedule(Path(self.gather.config.state_dir))
        active = [r for r in self.reservations.current(now) if r.active(now)]
        if not active:
            return None
        gpus = self.gather.decide(partial(_pinned, info), ACCESS_READS)
        taken = next((r for r in active if gpus & set(r.gpus)), None)
        return None if taken is None else rsv.gave_up_text(ref, taken, now)

    def restart_refusal(self, ref: str, asked: str) -> str | None:
        """Why an update that sets restart policy ``asked`` on ``ref`` must be refused:
        dockerd would make, unasked, a start `start_refusal` refuses."""
        info = self.engine.inspect(ref) if self.engine else None
        if info is None:
            return None  # dockerd answers "no such container"
        why = self.start_refusal(ref, info) or self._expiring(info)
        return None if why is None else restarts.update_refusal(ref, asked, why)

    def _expiring(self, info: dict[str, Any]) -> str | None:
        """A stopped container whose lease is due to end (`policy.release_stopped_after`):
        a policy set now could land after reconcile turned it off for the expiry."""
        after = self.gather.rules.release_stopped_after
        st = info.get("State") or {}
        if after is None or st.get("Running"):
            return None
        stamp = go_time(st.get("FinishedAt")) or go_time(info.get("Created"))
        if stamp is None:
            return None
        try:  # its stop as reconcile saw it, on the boot's clock
            kept = self.ledger.read().stopped.get(str(info.get("Id")))
        except StateError:
            kept = None
        since = Now(*kept) if kept and kept[0] == stamp else Now(stamp)
        if clock.elapsed(since, hostclock.read()) < after:
            return None
        return "it stayed stopped longer than policy.release_stopped_after, so its lease ends now"

    def hold_down(self, container: str) -> dict[str, Any] | None:
        """Turn off ``container``'s restart policy before it lends its GPUs; the policy it
        had (``{}``: none), to `put_back` if it lends nothing; None if that failed."""
        try:
            info = self.engine.inspect(container) if self.engine else None
            if info is None:
                return None
            was = (info.get("HostConfig") or {}).get("RestartPolicy") or {}
            assert self.engine is not None
            self.engine.update(container, restarts.OFF)  # even if none: one may be set since
            return was
        except EngineError as e:
            log.warning("could not turn off the restart policy of %s: %s", container[:12], e)
            return None

    def held_down(self, predecessor: tuple[str, str], was: dict[str, Any], by: str) -> None:
        """Once the GPUs went to ``by``: the policy off once more (an update judged while
        the predecessor still held them may have landed after `hold_down`), and the audit
        line for the policy `hold_down` turned off."""
        try:
            if self.engine is not None:
                self.engine.update(predecessor[0], restarts.OFF)
        except EngineError as e:  # its start is refused anyway: say so, keep going
            log.warning("could not turn off the restart policy of %s again: %s", predecessor[1], e)
        if restarts.described(was):
            why = f"restart policy {restarts.described(was)} turned off: lent its GPUs to {by}"
            log.info("container %s: %s", predecessor[1], why)
            self.recorder.record(
                "restart-off", container=predecessor[0], name=predecessor[1], reason=why
            )

    def put_back(self, container: str, was: dict[str, Any]) -> None:
        """Give back the restart policy `hold_down` turned off, when no hand-over came."""
        if not restarts.described(was) or self.engine is None:
            return
        try:
            self.engine.update(container, {"RestartPolicy": was})
        except EngineError as e:
            log.warning("restart policy of %s left off: %s", container[:12], e)

    def follow_policy(self, background: Background) -> None:
        """After each policy reload, `check_restarts` again from a worker of
        ``background``: a grant taken away (``policy.powers``, ``policy.privileged``,
        ``policy.engine_socket_binds``) leaves no container dockerd would start by itself."""
        reloaded = threading.Event()
        self.gather.policy_listeners.append(lambda _policy: reloaded.set())

        def step() -> None:
            if not reloaded.is_set():
                return
            reloaded.clear()
            try:
                self.check_restarts()
            except Exception:
                reloaded.set()  # the Engine did not answer: the next step tries again
                raise

        background.every("restart-check", POLICY_CHECK_EVERY, step)

    def check_restarts(self, state: State | None = None) -> list[str]:
        """Turn off every restart policy dockerd must not act on; the containers turned off.

        A policy stays only where a start of its container would be allowed now
        (`start_refusal`, against ``state`` when given: an empty one for a reset).
        Containers reconcile found without GPUs are not inspected again.
        """
        if self.engine is None:
            return []
        turned = []
        for c in self.engine.containers():
            cid = c["Id"]
            info = None if cid in self.reconciler.without_gpus else self.engine.inspect(cid)
            had = restarts.standing(info) if info else ""
            why = self.start_refusal(cid, info, state) if had else None
            if why is None:
                continue
            name = str(info.get("Name") or "").lstrip("/") if info else ""
            try:
                self.engine.update(cid, restarts.OFF)
            except EngineError as e:
                log.warning("restart policy %s of %s left on: %s", had, name, e)
                continue
            log.warning("container %s: restart policy %s turned off: %s", name, had, why)
            self.recorder.record(
                "restart-off",
                container=cid,
                name=name,
                reason=f"restart policy {had} turned off: {why}",
            )
            turned.append(cid)
        return turned


def _pinned(info: dict[str, Any], facts: Facts) -> set[str]:
    """The GPUs a container's access pins it to; none when it is not pinned."""
    held = access.of_container(info, facts.engine, facts.known_gpus, facts.host)
    return set(held.gpus(facts.known_gpus)) if held.pinned else set()
