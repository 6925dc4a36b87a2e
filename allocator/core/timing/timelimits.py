"""Time limits: how long a GPU container may run, and which have run past theirs.

``policy.time_limit`` sets a limit per user, per group, per pool and a ``default``;
the most specific that applies wins: the user's own, else their groups' (the longest
of them), else the pool the request is placed in, else the default.  The exempt
(``policy.exempt``) have none from the policy.  A create may ask for less with the
``io.gpu-alloc.time`` label; asking for more than the policy allows is a 400 naming
the rule.  The limit is fixed at the grant and kept in the lease (`Lease.time_limit`),
so a later policy edit changes no running container's.  The clock starts when the
container first ran (`Lease.started`, the Engine's StartedAt as the timekeeper first
saw it): a stop and a start, or a restart, do not reset it.  Time run is measured on
the boot's clock from that start (`allocator/core/leases/clock.py`), so setting the wall
clock neither lengthens nor shortens a limit.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from allocator.core.leases import clock
from allocator.core.leases.clock import Now
from allocator.core.leases.holders import ago
from allocator.core.leases.leases import Lease, Phase
from allocator.core.rules.by_owner import ByOwner
from allocator.core.rules.policy import TIME, Invalid, Owner, Rules, parse_duration

CHECK_MIN, CHECK_MAX = 0.5, 10.0  # seconds between the timekeeper's looks
ENGINE_GRACE = 10  # seconds dockerd waits after the stop signal when a container sets none
GRACE_MAX = 30  # the longest a container's own StopTimeout may delay its SIGKILL
# The Engine's container states (``GET /containers/json``'s State) in which a container's
# processes hold its GPUs: a paused container is frozen, not stopped, so its clock runs,
# and it is stopped at its limit or when idle as a running one is (dockerd's stop of a
# paused container signals it, then kills and thaws it after the grace period).
RUNNING_STATES = frozenset({"running", "paused"})
_Scope = TypeVar("_Scope")


@dataclass(frozen=True)
class Limit:
    seconds: float
    rule: str  # the dotted key in the config that sets it


def policy_limit(rules: Rules, owner: Owner, pool: str | None) -> Limit | None:
    """The policy's limit for ``owner``'s request placed in ``pool``; None: unlimited."""
    if owner.user in rules.exempt:
        return None
    limits = ByOwner(
        "policy.time_limit", rules.time_users, rules.time_groups, rules.time_pools,
        rules.time_default,
    )  # fmt: skip
    found = limits.pick(owner, pool, lambda seconds: seconds)
    return None if found is None else Limit(*found)


def effective(rules: Rules, owner: Owner, pool: str | None, asked: float | None) -> float | None:
    """The limit a request gets: what it asked for (the `TIME` label) when that is
    shorter than the policy's; None: unlimited.  A request above the policy's limit is
    refused by `refusal`; here it gets the policy's."""
    limit = policy_limit(rules, owner, pool)
    if limit is None:
        return asked
    return limit.seconds if asked is None else min(asked, limit.seconds)


def refusal(rules: Rules, owner: Owner, pool: str | None, asked: float | None) -> Invalid | None:
    """A request that asks for more time than its policy limit: a 400 naming the rule."""
    limit = policy_limit(rules, owner, pool)
    if asked is None or limit is None or asked <= limit.seconds:
        return None
    return Invalid(
        f"gpu-alloc refused the container create: label {TIME} asks for {ago(asked)}, "
        f"more than the {ago(limit.seconds)} {owner.user} may run a GPU container "
        f"({limit.rule}); ask for {ago(limit.seconds)} or less, or leave the label out"
    )


def described(rules: Rules, owner: Owner, pool: str | None, asked: float | None) -> str:
    """The limit a request would get, as ``explain`` says it ("" when unlimited)."""
    limit = policy_limit(rules, owner, pool)
    if asked is not None and (limit is None or asked < limit.seconds):
        return f"its container may run {ago(asked)} (label {TIME})"
    if limit is None:
        return ""
    return f"its container may run {ago(limit.seconds)} ({limit.rule})"


def within(scope: _Scope, rules: Rules, owner: Owner, asked: float | None) -> _Scope | Invalid:
    """``policy.eligible``'s answer, or the `refusal` of a request asking for more time
    than the pool it is placed in allows (``scope``: (GPUs, pool), or a refusal already)."""
    if not isinstance(scope, tuple):
        return scope
    return refusal(rules, owner, scope[1], asked) or scope


def asked_of(given: Mapping[str, Any] | None) -> float | None:
    """Seconds the `TIME` label asks for; None when it is absent or unreadable (a create
    with an unreadable one is refused by `policy.wanted` before any placement)."""
    raw = (given or {}).get(TIME)
    try:
        seconds = None if raw in (None, "") else parse_duration(str(raw))
    except ValueError:
        return None
    return seconds if seconds is None or seconds > 0 else None


def limit_for(
    rules: Rules, owner: Owner, pool: str | None, given: Mapping[str, Any] | None
) -> float | None:
    """Seconds a create with labels ``given`` by ``owner`` in ``pool`` may run once granted
    (None: unlimited): the one answer for "when will this container's time end"."""
    return effective(rules, owner, pool, asked_of(given))


def ran(lease: Lease, now: Now) -> float | None:
    """Seconds the lease's container has had since its first start (`clock.elapsed`);
    None: it has not run yet."""
    if lease.started is None:
        return None
    return clock.elapsed(clock.at(lease.started, lease.started_boot), now)


def left(lease: Lease, now: Now) -> float | None:
    """Seconds the lease's container may still run (the whole limit before it first
    ran, 0 once past it); None: no limit."""
    if lease.time_limit is None:
        return None
    run = ran(lease, now)
    return lease.time_limit if run is None else max(0.0, lease.time_limit - run)


def _over(lease: Lease, now: Now) -> bool:
    """Has the lease's container run its whole limit?"""
    return lease.started is not None and left(lease, now) == 0


def live(leases: Iterable[Lease]) -> list[Lease]:
    """The leases the timekeeper watches: bound to a container (a handed-over one's
    container is stopped, and its GPUs are its replacement's)."""
    return [le for le in leases if le.container and le.phase is Phase.BOUND]


def unstarted(leases: Iterable[Lease], running: Collection[str]) -> list[Lease]:
    """Leases with a limit whose container runs and whose clock has not started yet."""
    return [
        le
        for le in live(leases)
        if le.time_limit is not None and le.started is None and le.container in running
    ]


def overdue(leases: Iterable[Lease], running: Collection[str], now: Now) -> list[Lease]:
    """Leases whose container runs past its time limit at ``now``: to be stopped."""
    return [le for le in live(leases) if le.container in running and _over(le, now)]


def start_refusal(ref: str, lease: Lease | None, now: Now) -> str | None:
    """Why a start of ``ref`` (whose lease is ``lease``) is refused: its time is up.  The
    clock runs from its first start, stopped or not, so a start would only be stopped
    again."""
    if lease is None or not _over(lease, now):
        return None
    return (
        f"gpu-alloc refused to start {ref}: it ran its time limit of "
        f"{ago(lease.time_limit or 0)} (policy.time_limit, counted from its first start; "
        "a stop does not pause it); remove it and create it again (docker rm, then "
        "docker run --gpus ...) for a new limit"
    )


def grace(stop_timeout: object) -> int:
    """Seconds between the stop signal and SIGKILL when the timekeeper stops a container:
    its own ``StopTimeout`` (None: the Engine's 10 s), at most `GRACE_MAX`.  The Engine
    honours a container's value as it is, and waits forever on a negative one, so a
    container that ignores its stop signal would otherwise outlive any limit."""
    if not isinstance(stop_timeout, int) or isinstance(stop_timeout, bool):
        return ENGINE_GRACE
    return GRACE_MAX if stop_timeout < 0 else min(stop_timeout, GRACE_MAX)


def reason(lease: Lease) -> str:
    """Why the timekeeper stopped the lease's container, for the audit trail and log."""
    return (
        f"ran past its time limit of {ago(lease.time_limit or 0)}; stopped with the Engine's "
        f"stop (its grace period, at most {GRACE_MAX}s); its GPUs stay leased while it "
        "exists, as for any stopped container (policy.release_stopped_after)"
    )


def next_check(leases: Iterable[Lease], now: Now, reclaim_after: float | None) -> float:
    """Seconds until the timekeeper should look again: at the next limit's end, at most
    `CHECK_MAX` apart (a quarter of a limit whose clock has not started, or of
    ``reclaim_after``, when shorter), never more often than every `CHECK_MIN`."""
    waits = [CHECK_MAX]
    if reclaim_after is not None:
        waits.append(reclaim_after / 4)
    for le in live(leases):
        if le.time_limit is None:
            continue
        rest = left(le, now)
        if le.started is None:
            waits.append(le.time_limit / 4)
        elif rest:  # an ended one is stopped, and its start refused
            waits.append(rest)
    return max(CHECK_MIN, min(waits))
