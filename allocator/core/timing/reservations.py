"""Reservations as data: which GPUs are kept for whom, when, and from whom before then.

Rules
-----
1. A reservation keeps GPUs for a holder (a user, or ``@group`` for its members) over a
   window ``[start, end)``.  ``--gpu I…`` names them; ``--gpus N`` has them picked as
   placement would at the start (free ones first), and re-picked if one turns unhealthy.
2. During the window only the holder is placed on them: anyone else's request treats
   them as held (named in the refusal), so a count request goes to other free GPUs.
3. Before the window, someone else is placed on them only when the request's time limit
   ends by the window's start: a reservation is kept without stopping anyone.  A request
   without a limit (``None``) is never placed on a GPU reserved later.
4. The holder is never kept from its own GPUs; during the window a holder's count request
   that its free reserved GPUs can answer is placed on them (`prefer`).
5. Two reservations never share a GPU in overlapping windows; a window is never in the
   past, never empty, and names only GPUs the host (or the pool) has; one that has begun
   already starts now (`from_now`).

Every function takes ``now`` and the facts it needs: no clock, no file.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from allocator.core.api import numbers
from allocator.core.leases.holders import Holder

if TYPE_CHECKING:
    from allocator.core.leases.leases import Lease
    from allocator.core.machine.inventory import GPU
    from allocator.core.rules.policy import Owner

Pick = Callable[[Sequence["GPU"], Sequence["GPU"], int], "list[GPU] | None"]


@dataclass(frozen=True)
class Reservation:
    id: str
    holder: str  # a user name, or "@group"
    gpus: tuple[str, ...]  # UUIDs
    start: float
    end: float
    count: int = 0  # > 0: picked for --gpus N, so re-picked when one turns unhealthy
    pool: str | None = None
    note: str = ""
    by: str = ""  # who made it
    created: float = 0.0

    def holds(self, owner: Owner) -> bool:
        """Is ``owner`` this reservation's holder (the user, or a member of the group)?"""
        if self.holder.startswith("@"):
            return self.holder[1:] in owner.groups
        return owner.user == self.holder

    def active(self, now: float) -> bool:
        return self.start <= now < self.end

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "gpus": list(self.gpus)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Reservation:
        return cls(
            id=str(data["id"]),
            holder=str(data["holder"]),
            gpus=tuple(str(u) for u in data["gpus"]),
            start=float(data["start"]),
            end=float(data["end"]),
            count=int(data.get("count") or 0),
            pool=data.get("pool"),
            note=str(data.get("note") or ""),
            by=str(data.get("by") or ""),
            created=float(data.get("created") or 0.0),
        )


@dataclass(frozen=True)
class Reserved(Holder):
    """A GPU a reservation keeps from this request: a refusal names it."""

    upcoming: bool = False  # the window has not begun: a shorter time limit would fit

    def describe(self, now: float | None = None) -> str:
        return self.why


def when(at: float, now: float) -> str:
    """A time as a refusal says it: ``14:00 UTC`` today, with the date otherwise."""
    t, today = datetime.fromtimestamp(at, UTC), datetime.fromtimestamp(now, UTC)
    text = t.strftime("%H:%M:%S" if t.second else "%H:%M")
    return f"{text} UTC" if t.date() == today.date() else f"{t:%Y-%m-%d} {text} UTC"


def held_text(r: Reservation, now: float) -> str:
    """What holds a reserved GPU, for refusals and ``explain``."""
    who = f"group {r.holder[1:]}" if r.holder.startswith("@") else r.holder
    note = f", {r.note}" if r.note else ""
    if r.active(now):
        return f"reserved for {who} until {when(r.end, now)} (reservation {r.id}{note})"
    return (
        f"reserved for {who} from {when(r.start, now)} to {when(r.end, now)} "
        f"(reservation {r.id}{note})"
    )


def blocked(
    reservations: Iterable[Reservation], owner: Owner, limit: float | None, now: float
) -> dict[str, Reserved]:
    """UUID -> the reservation that keeps it from this request now (rules 2 to 4).

    ``limit``: the request's time limit in seconds, ``None`` when it has none.
    """
    out: dict[str, Reserved] = {}
    for r in sorted(reservations, key=lambda r: r.start):
        if now >= r.end or r.holds(owner):
            continue
        upcoming = now < r.start
        if upcoming and limit is not None and now + limit <= r.start:
            continue
        who = Reserved(None, "", held_text(r, now), owner=r.holder, upcoming=upcoming)
        for uuid in r.gpus:
            out.setdefault(uuid, who)
    return out


def prefer(
    reservations: Iterable[Reservation],
    owner: Owner,
    count: int,
    free: Iterable[str],
    now: float,
) -> frozenset[str]:
    """Rule 4: the GPUs a holder's count request should keep off, so that it lands on its
    own reserved GPUs: every other one, when its free reserved GPUs number ``count`` or
    more during their window; nothing otherwise."""
    mine = {u for r in reservations if r.active(now) and r.holds(owner) for u in r.gpus}
    free = set(free)
    if count <= 0 or len(mine & free) < count:
        return frozenset()
    return frozenset(free - mine)


def later(
    reservations: Iterable[Reservation],
    uuids: Iterable[str],
    owner: Owner,
    now: float,
    index: Mapping[str, int],
) -> str:
    """For ``explain``: "GPU 1 until 14:00 UTC, then reserved for alice (…)", for each of
    ``uuids`` a later reservation of someone else's keeps; "" when none does."""
    parts = []
    for uuid in uuids:
        ahead = [r for r in reservations if uuid in r.gpus and now < r.start and not r.holds(owner)]
        if ahead:
            first = min(ahead, key=lambda r: r.start)
            parts.append(
                f"GPU {index.get(uuid, uuid)} until {when(first.start, now)}, then "
                + held_text(first, now)
            )
    return "; ".join(parts)


def parse_time(text: str, now: float) -> float:
    """``now``, ``+30m`` (from now: s, m, h, d) or an RFC 3339 time with its offset."""
    from allocator.core.rules.policy import parse_duration

    raw = text.strip()
    if raw == "now":
        return now
    if raw.startswith("+"):
        try:
            return numbers.instant(now + parse_duration(raw[1:]), text)
        except numbers.BadNumber as e:
            if not e.syntax:
                raise
    else:
        try:
            t = datetime.fromisoformat(raw.replace("z", "Z"))
        except ValueError:
            t = None
        if t is not None and t.tzinfo is not None:
            return numbers.instant(t.timestamp(), text)
    raise ValueError(
        f"'{text}' is not a time: give an RFC 3339 time with its offset "
        "(2026-12-04T14:00:00Z, 2026-12-04T15:00:00+01:00), 'now', or a time from now "
        "such as +30m, +2h or +1d"
    )


def from_now(window: tuple[float, float], now: float) -> tuple[float, float]:
    """A window that has begun but not ended is reserved from now (rule 5): what the
    operator asked for, less the part already gone."""
    start, end = window
    return (now, end) if start < now < end else window


def window_error(start: float, end: float, now: float) -> str | None:
    """Why ``[start, end)`` cannot be reserved now, or None (rule 5)."""
    if end <= start:
        return f"--to ({when(end, now)}) must be after --from ({when(start, now)})"
    if end <= now:
        return f"the window ends at {when(end, now)}, in the past; give a future window"
    return None


def overlapping(
    gpus: Iterable[str], start: float, end: float, others: Iterable[Reservation]
) -> list[Reservation]:
    """The reservations that share a GPU of ``gpus`` in a window overlapping this one."""
    wanted = set(gpus)
    return [r for r in others if r.start < end and start < r.end and wanted & set(r.gpus)]


def clash_text(
    clashes: Sequence[Reservation], index: Mapping[str, int], gpus: Iterable[str], now: float
) -> str:
    wanted = set(gpus)
    named = "; ".join(
        f"GPU{'s' * (len(shared) > 1)} {','.join(shared)}: {held_text(r, now)}"
        for r in clashes
        for shared in [[str(index.get(u, u)) for u in r.gpus if u in wanted]]
    )
    return (
        f"overlaps another reservation ({named}); pick other GPUs or another window, "
        "or cancel it with 'gpu-alloc reserve cancel ID'"
    )


def pick(
    candidates: Sequence[GPU],
    count: int,
    held: Iterable[str],
    policy: Pick,
    required: Sequence[GPU] = (),
) -> list[GPU] | None:
    """``count`` GPUs (``required`` among them) as placement would pick them: among those
    no one holds now first, then among all ``candidates``."""
    busy = set(held)
    free = [g for g in candidates if g.uuid not in busy or g in required]
    for among in (free, list(candidates)):
        if len(among) >= count and all(g in among for g in required):
            got = policy(among, list(required), count)
            if got is not None:
                return got
    return None


def repick(
    r: Reservation,
    candidates: Sequence[GPU],
    unhealthy: Mapping[str, str],
    others: Iterable[Reservation],
    held: Iterable[str],
    policy: Pick,
) -> Reservation:
    """Rule 1: a ``--gpus N`` reservation whose GPU turned unhealthy gets another healthy
    GPU of its pool that no overlapping reservation names; kept as it is when none is."""
    if not r.count or not any(u in unhealthy for u in r.gpus):
        return r
    every = [g.uuid for g in candidates]
    taken = {u for o in overlapping(every, r.start, r.end, others) if o.id != r.id for u in o.gpus}
    usable = [g for g in candidates if g.uuid not in unhealthy and g.uuid not in taken]
    keep = [g for g in usable if g.uuid in r.gpus]
    got = pick(usable, r.count, held, policy, keep)
    if got is None:
        return r
    return Reservation(**{**asdict(r), "gpus": tuple(g.uuid for g in got)})


def plan(
    named: Sequence[GPU],
    count: int,
    candidates: Sequence[GPU],
    where: str,
    window: tuple[float, float],
    now: float,
    others: Sequence[Reservation],
    unhealthy: Mapping[str, str],
    held: Iterable[str],
    policy: Pick,
) -> tuple[str, ...] | str:
    """The GPUs a new reservation keeps (``named``, or ``count`` picked among
    ``candidates``, the pool or the host, called ``where``), or why it cannot be made."""
    start, end = window
    why = window_error(start, end, now)
    if why is not None:
        return why
    index = {g.uuid: g.index for g in (*named, *candidates)}
    if named:
        sick = [g for g in named if g.uuid in unhealthy]
        if sick:
            return (
                f"GPU {sick[0].index} is unhealthy ({unhealthy[sick[0].uuid]}); reserve "
                "another GPU, or clear it first with 'gpu-alloc health clear'"
            )
        uuids = tuple(g.uuid for g in named)
        clashes = overlapping(uuids, start, end, others)
        return clash_text(clashes, index, uuids, now) if clashes else uuids
    if count < 1:
        return f"--gpus {count}: reserve 1 GPU or more"
    if count > len(candidates):
        return f"asked for {count} GPUs but {where} has only {len(candidates)}; reserve fewer"
    every = [g.uuid for g in candidates]
    clashes = overlapping(every, start, end, others)
    taken = {u for r in clashes for u in r.gpus}
    usable = [g for g in candidates if g.uuid not in unhealthy and g.uuid not in taken]
    got = pick(usable, count, held, policy)
    if got is not None:
        return tuple(g.uuid for g in got)
    ill = len([g for g in candidates if g.uuid in unhealthy])
    why = f"{len(taken & set(every))} reserved then" + (f", {ill} unhealthy" if ill else "")
    text = (
        f"asked for {count} GPUs but only {len(usable)} of the {len(candidates)} of {where} "
        f"can be reserved from {when(start, now)} to {when(end, now)} ({why})"
    )
    return text + ("; " + clash_text(clashes, index, every, now) if clashes else "")


def current(reservations: Iterable[Reservation], now: float) -> list[Reservation]:
    """Those not yet over, by start: an ended reservation is dropped at the next write."""
    return sorted((r for r in reservations if r.end > now), key=lambda r: (r.start, r.id))


# ------------------------------------------------------- what a grant may do, later
#
# Rule 3 is kept by what a grant may *do*, not only by the time limit it was given: a
# container's clock starts at its first run, so one created before a window may be
# started inside it, or stay stopped on the GPU until it begins.  Every start is
# judged again (`start_refusal`), and a container not running when the window begins
# gives its reserved GPUs up (`yielding`): its lease ends as a stopped one's past
# ``release_stopped_after`` does, and its start is refused (`gave_up_text`).


def left(lease: Lease, now: float) -> float | None:
    """Seconds the lease's container may still run from ``now`` (None: no limit): its
    clock runs from its first start, or would start now."""
    if lease.time_limit is None:
        return None
    began = lease.started if lease.started is not None else now
    return max(began + lease.time_limit - now, 0.0)


def start_refusal(
    ref: str, lease: Lease | None, reservations: Iterable[Reservation], owner: Owner, now: float
) -> str | None:
    """Why a start of ``ref`` (holding ``lease``, whose owner is ``owner``) would run on a
    GPU another holder's reservation keeps: inside its window, or before it for longer
    than the time left before it begins."""
    if lease is None:
        return None
    kept = blocked(reservations, owner, left(lease, now), now)
    hit = [kept[u] for u in lease.gpus if u in kept]
    if not hit:
        return None
    return (
        f"gpu-alloc refused to start {ref}: its GPU is {hit[0].why}, and this start would "
        "run inside that window (its time limit counts from its first start); start it "
        "after the window ends, or remove it and create it again (docker rm, then docker "
        "run --gpus ...) to be placed on a GPU free now"
    )


def yielding(
    leases: Iterable[tuple[Lease, Owner]],
    idle: Collection[str],
    reservations: Iterable[Reservation],
    now: float,
) -> dict[str, Reservation]:
    """Lease id -> the reservation whose window has begun on one of its GPUs, for another
    holder, while its container (in ``idle``: created or stopped) does not run."""
    active = [r for r in reservations if r.active(now)]
    out: dict[str, Reservation] = {}
    for lease, owner in leases:
        if lease.container not in idle:
            continue
        for r in active:
            if not r.holds(owner) and set(r.gpus) & set(lease.gpus):
                out[lease.id] = r
                break
    return out


def gave_up(r: Reservation, now: float) -> str:
    """Why a lease ended for a reservation, for the audit line."""
    return (
        f"not running when the window of a GPU it held began ({held_text(r, now)}): "
        "gave the GPU up, and its start is refused"
    )


def gave_up_text(ref: str, r: Reservation, now: float) -> str:
    """A container that gave its GPU up to a reservation, at a start."""
    return (
        f"gpu-alloc refused to start {ref}: it was not running when the window of the GPU "
        f"it held began ({held_text(r, now)}), so it gave that GPU up and its lease ended; "
        "remove it and create it again (docker rm, then docker run --gpus ...) to get GPUs"
    )
