"""``gpu-alloc report``: GPU-hours held, used and idle, grants, waits and refusals per
user, group, pool or GPU, from the audit trail and the utilisation samples.

The intervals are `core.timing.uses`'s, those ``gpu-alloc history`` lists; the sums are
`core.timing.report`'s.  A row's key: ``user`` the owner; ``group`` each of the owner's
groups as NSS says now (a use counts in each); ``pool`` the pool the lease was
placed in (``-``: none); ``gpu`` the GPU's index as recorded (its UUID when none).
``owner`` keeps only that owner's rows: what the shim answers a user in the docker
group, who sees their own use and nobody else's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from allocator.core.timing import report
from allocator.core.timing.report import NONE, Held
from allocator.core.timing.uses import uses
from allocator.host.audit import AuditLog
from allocator.host.owners import groups_of
from allocator.host.samples import Samples


def build(
    state_dir: str,
    now: float,
    since: float,
    until: float | None,
    by: str,
    owner: str | None = None,
) -> dict[str, Any]:
    """The report as the CLI's ``--json`` prints it and the shim serves it."""
    if by not in report.BY:
        raise ValueError(f"--by {by!r}: expected one of {', '.join(report.BY)}")
    if not since >= 0:  # NaN, or a time before 1970 that the day files cannot name
        raise ValueError(f"--since {since!r}: expected a time after 1970 in epoch seconds")
    until = now if until is None else min(until, now)
    if until <= since:
        raise ValueError("--until must be later than --since")
    found = uses(AuditLog(state_dir).read())
    if owner is not None:
        found = [u for u in found if (u.get("owner") or "") == owner]
    samples = Samples(state_dir).read(since, until)
    window = report.Window(since, until)
    rows = report.rows(found, samples, window, by, _key(by))
    return {"since": since, "until": until, "by": by, "rows": rows}


def _key(by: str) -> Callable[[str, Held | None], Iterable[str]]:
    groups: dict[str, tuple[str, ...]] = {}

    def key(owner: str, h: Held | None) -> Iterable[str]:
        if by == "user":
            return (owner or NONE,)
        if by == "group":
            if owner not in groups:
                groups[owner] = groups_of(owner) if owner else ()
            return groups[owner] or (NONE,)
        if h is None:
            return (NONE,)
        if by == "pool":
            return (h.pool or NONE,)
        return (h.uuid if h.index is None else str(h.index),)

    return key
