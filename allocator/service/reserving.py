"""Reservations' part of the allocator: making and cancelling them, and what they keep.

One part of the composed service (allocator/service/wiring.py).  `current` is what every grant
reads of them (`Placer.seen`): the grant plan (allocator/core/grant_plan.py) treats the
GPUs they keep from a request as held, so a refusal names the reservation and a count
request goes to other free GPUs (`core.timing.reservations` has the rules).  A ``--gpus N``
reservation whose GPU turned unhealthy is re-picked as it is read, the same way in every
process, and the re-pick is written at the next `reserve` or `cancel`.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from allocator.core.leases.leases import Lease, StateError
from allocator.core.placement import POLICIES, Policy
from allocator.core.rules import policy
from allocator.core.rules.policy import UNKNOWN, Owner
from allocator.core.timing import reservations as rsv
from allocator.host import clock as hostclock
from allocator.host import ledger
from allocator.host.owners import groups_of
from allocator.host.reservations import ReservationFile

if TYPE_CHECKING:
    from allocator.core.machine.inventory import GPU
    from allocator.host.config import Config
    from allocator.host.ledger import Ledger
    from allocator.service.gather import Gatherer
    from allocator.service.recorder import Recorder


class Reservations:
    """Reservations made (`reserve`), cancelled (`cancel`) and read (`current`)."""

    def __init__(self, config: Config, ledger: Ledger, gather: Gatherer, recorder: Recorder):
        self.config = config
        self.ledger = ledger
        self.gather = gather
        self.recorder = recorder
        self.file = ReservationFile(ledger)

    @property
    def placement(self) -> Policy:
        """The placement policy in force (``policy.placement`` reloads)."""
        return POLICIES[self.gather.policy.placement]

    def current(self, now: float) -> list[rsv.Reservation]:
        """Those not over yet, each ``--gpus N`` one re-picked around unhealthy GPUs."""
        stored = self.file.read()
        if not stored:
            return []
        sick = self.gather.unhealthy()
        out = rsv.current(stored, now)
        for i, r in enumerate(out):
            if r.count and sick and any(u in sick for u in r.gpus):
                candidates, _ = self._candidates(r.pool)
                out[i] = rsv.repick(r, candidates, sick, out, (), self.placement)  # in order
        return out

    def owner_of(self, lease: Lease, kept: Iterable[rsv.Reservation]) -> Owner:
        """The lease's owner as a reservation's holder is matched: with their groups, as
        NSS says now, only when a group holds one of ``kept``."""
        groups = groups_of(lease.owner) if any(r.holder.startswith("@") for r in kept) else ()
        return Owner(lease.owner_uid, lease.owner or UNKNOWN, groups)

    def stamp(self) -> object:
        """Moves when a reservation is made or cancelled, and when one begins or ends: a
        create waiting in line that it kept may fit then (the shim's Waitline polls it)."""
        try:
            stored = self.file.read()
        except StateError:
            return None
        now = hostclock.schedule(Path(self.config.state_dir))  # held after a jump
        return tuple((r.id, r.gpus, now >= r.start, now >= r.end) for r in stored)

    def _candidates(self, pool: str | None) -> tuple[list[GPU], str]:
        """The units a ``--gpus N`` reservation picks among (its pool, else the default
        pool, else the host), and what to call them."""
        rules = self.gather.rules
        units = [
            g
            for g in self.gather.inventory().units(self.gather.policy.mig)
            if not policy.given_to_swarm(g, rules)
        ]
        name = pool or rules.default_pool
        spec = rules.pools.get(name) if name else None
        if spec is None:
            return units, "this host"
        return [g for g in units if g.index in spec.gpus], f"pool '{name}'"

    def reserve(
        self,
        holder: str,
        window: tuple[float, float],
        *,
        gpus: tuple[str, ...] = (),
        count: int = 0,
        pool: str | None = None,
        note: str = "",
        by: str = "",
    ) -> rsv.Reservation | str:
        """Make a reservation (``gpus``: named GPUs, as index or UUID; else ``count`` in
        ``pool``), or say why not.  Written under the ledger lock, then audited."""
        now = ledger.now()
        window = rsv.from_now(window, now)
        inventory = self.gather.inventory()
        named: list[GPU] = []
        for ident in gpus:
            try:
                named.append(inventory.resolve(ident))
            except LookupError as e:
                return str(e)
            if policy.given_to_swarm(named[-1], self.gather.rules):
                return (
                    f"{named[-1].label()} is given to Docker Swarm (swarm.gpus): swarm "
                    "schedules it, so it is never leased here; reserve another GPU"
                )
        if pool is not None and pool not in self.gather.rules.pools:
            known = ", ".join(sorted(self.gather.rules.pools)) or "none"
            return f"there is no GPU pool '{pool}' (pools: {known})"
        candidates, where = self._candidates(pool)
        held = self.ledger.read().holders(inventory.uuids)
        with self.file.transaction() as box:
            others = self.current(now)
            box[:] = others
            got = rsv.plan(
                named,
                count,
                candidates,
                where,
                window,
                now,
                others,
                self.gather.unhealthy(),
                held,
                self.placement,
            )
            if isinstance(got, str):
                return got
            made = rsv.Reservation(
                secrets.token_hex(4),
                holder,
                got,
                window[0],
                window[1],
                0 if named else count,
                None if named else pool,
                note,
                by,
                now,
            )
            box.append(made)
        self.recorder.record("reserve", gpus=made.gpus, owner=holder, reason=_said(made, now))
        return made

    def cancel(self, ident: str, by: str = "") -> rsv.Reservation | str:
        """Cancel the reservation ``ident`` names (its id or a unique prefix of it)."""
        now = ledger.now()
        with self.file.transaction() as box:
            box[:] = self.current(now)
            found = [r for r in box if r.id.startswith(ident)] if ident else []
            if len(found) != 1:
                known = ", ".join(r.id for r in box) or "none"
                why = "matches several" if found else "is not a current reservation"
                return (
                    f"'{ident}' {why} (reservations: {known}); 'gpu-alloc reservations' lists them"
                )
            box.remove(found[0])
        reason = _said(found[0], now) + (f"; cancelled by {by}" if by else "")
        self.recorder.record(
            "reserve-cancel", gpus=found[0].gpus, owner=found[0].holder, reason=reason
        )
        return found[0]


def _said(r: rsv.Reservation, now: float) -> str:
    return f"{rsv.held_text(r, now)}" + (f", made by {r.by}" if r.by else "")
