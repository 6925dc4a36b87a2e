"""The checkpoint signal: a signal sent to a GPU container some time before gpu-alloc stops
it, so it can save its work (Slurm's ``--signal``).

Which signal a create gets: the ``io.gpu-alloc.signal`` label (allocator/core/api/signals.py),
else ``policy.signal``'s most specific rule, as for ``policy.time_limit``: the user's own,
else their groups' (the one sent earliest), else the pool's, else ``default``; none when
none applies.  It is fixed at the grant and kept in the lease (`Lease.signal`,
`Lease.signal_lead`), as the time limit is.

When it is sent (`Lease.signalled` records the last time, so a look after a shim restart
sends none twice):

- before the time limit: from ``lead`` before the limit's end, once;
- before idle reclaim: from ``lead`` before the container would be reclaimed, once per
  stretch of idleness (a GPU seen in use again starts a new one).  An idle container is
  stopped only once it has had its whole ``lead`` after the signal: reclaim is the
  policy's choice, so a late signal (the shim was down) delays it.  A time limit is not
  moved: the stop comes at the limit, however late the signal.

A lease with no signal gets none; its owner is warned by a notice instead
(allocator/core/timing/notices.py) when its container has run 80 % and 90 % of its time limit
(`time_warnings`), and when it has been idle 80 % of ``reclaim_idle_after``
(`idle_warnings`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from allocator.core.api.signals import Signal
from allocator.core.leases import clock
from allocator.core.leases.clock import Now
from allocator.core.leases.holders import ago
from allocator.core.leases.leases import Lease
from allocator.core.rules.by_owner import ByOwner
from allocator.core.rules.policy import Owner, Rules
from allocator.core.timing import reclaim
from allocator.core.timing.timelimits import left, live, ran

WARN_AT = (0.8, 0.9)  # shares of a time limit run, told without a signal


@dataclass(frozen=True)
class Chosen:
    signal: Signal
    rule: str  # the label, or the dotted key in the config that sets it


def policy_signal(rules: Rules, owner: Owner, pool: str | None) -> Chosen | None:
    """``policy.signal``'s rule for ``owner``'s request placed in ``pool``; None: none."""
    signals = ByOwner(
        "policy.signal", rules.signal_users, rules.signal_groups, rules.signal_pools,
        rules.signal_default,
    )  # fmt: skip
    found = signals.pick(owner, pool, lambda signal: signal.lead)
    return None if found is None else Chosen(*found)


def signal_for(rules: Rules, owner: Owner, pool: str | None, asked: Signal | None) -> Signal | None:
    """The signal a grant records: the label's, else the policy's; None: no signal."""
    if asked is not None:
        return asked
    chosen = policy_signal(rules, owner, pool)
    return None if chosen is None else chosen.signal


def _sent(lease: Lease) -> Now | None:
    """When the lease's signal was last sent, on the boot's clock where known."""
    return None if lease.signalled is None else clock.at(lease.signalled, lease.signalled_boot)


def _warn_due(lease: Lease, now: Now) -> float | None:
    """Seconds until the signal before the lease's time limit is due (0: now); None: no
    signal, no clock, past the end (the stop is due instead), or sent already."""
    rest = left(lease, now)
    if not lease.signal or lease.started is None or not rest:
        return None
    sent, started = _sent(lease), clock.at(lease.started, lease.started_boot)
    limit = lease.time_limit or 0.0
    if sent is not None and clock.elapsed(started, sent) >= limit - lease.signal_lead:
        return None  # sent once the container had run its limit less the lead
    return max(0.0, rest - lease.signal_lead)


def before_limit(leases: Iterable[Lease], running: Collection[str], now: Now) -> list[Lease]:
    """The running leases whose signal is due now, before their time limit's end."""
    return [le for le in live(leases) if le.container in running and _warn_due(le, now) == 0]


def time_warnings(
    leases: Iterable[Lease], running: Collection[str], now: Now
) -> list[tuple[Lease, float]]:
    """(lease, the share of its limit run: the last of `WARN_AT` passed) for each running
    lease with a time limit and no signal, before the limit's end."""
    found = []
    for le in live(leases):
        run, rest = ran(le, now), left(le, now)
        if le.signal or run is None or not rest or le.container not in running:
            continue
        passed = [share for share in WARN_AT if run >= share * (le.time_limit or 0.0)]
        if passed:
            found.append((le, passed[-1]))
    return found


def before_reclaim(
    idle: Iterable[tuple[Lease, float]], now: Now, after: float
) -> tuple[list[Lease], list[Lease]]:
    """(to signal, to stop) among ``idle``: (lease, seconds its GPUs have gone unused), the
    running leases reclaim may stop (allocator/core/timing/reclaim.py), at ``now`` with
    ``policy.reclaim_idle_after`` of ``after`` seconds."""
    signal, stop = [], []
    for le, idled in idle:
        if not le.signal:
            if idled >= after:
                stop.append(le)
            continue
        sent = _sent(le)
        since = None if sent is None else clock.elapsed(sent, now)
        warned = since is not None and since <= idled  # sent in this stretch of idleness
        if not warned and idled >= after - le.signal_lead:
            signal.append(le)
        elif warned and idled >= after and (since or 0.0) >= le.signal_lead:
            stop.append(le)
    return signal, stop


def idle_warnings(idle: Iterable[tuple[Lease, float]], after: float) -> list[tuple[Lease, float]]:
    """(lease, seconds idle) among ``idle`` (as for `before_reclaim`) for each lease
    without a signal idle for `reclaim.WARN_AT` of ``after``, and not yet for all of it."""
    return [
        (le, idled)
        for le, idled in idle
        if not le.signal and reclaim.WARN_AT * after <= idled < after
    ]


def next_signal(leases: Iterable[Lease], now: Now) -> float | None:
    """Seconds until the next signal before a time limit is due; None: none to come."""
    waits = [w for le in live(leases) if (w := _warn_due(le, now)) is not None]
    return min(waits, default=None)


def reason(lease: Lease, why: str) -> str:
    """What the signal said, for the audit trail and the log; ``why``: before what stop."""
    return (
        f"sent {lease.signal} {ago(lease.signal_lead)} before its {why} "
        f"(label io.gpu-alloc.signal or policy.signal), so it can save its work"
    )
