"""Time a clock change cannot move: durations on the boot's clock, the wall clock for show.

Anyone who sets the wall clock (an operator, NTP stepping it, a container with
``SYS_TIME``) would move every limit measured as a difference of wall times: set back,
a time limit never ends; set forward, other users' leases end early.  So each event
gpu-alloc measures from (a grant, a container's first start, its stop) is stamped with
both clocks (`Now`): the wall time, and the boot id with ``CLOCK_BOOTTIME`` (which no
one can set, and which counts a suspend).  A duration is the boottime between two
stamps of the same boot (`elapsed`); across a reboot, or from a stamp written before
stamps existed, it falls back to the wall clock, never below 0.

The wall clock stays what is shown and what reservations are written in.  A jump of
it (`jump`: the wall clock moved against boottime by more than `TOLERANCE`) is
reported, and until the shim restarts reservations keep the clock from before it
(`schedule`): no window begins or ends earlier than the boot's clock says.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from allocator.core.leases.holders import ago

# Seconds the wall clock may move against boottime before it counts as a jump: NTP's
# slewing moves both alike, so only a step (a setting, a leap second) moves them apart.
TOLERANCE = 2.0

_Key = TypeVar("_Key")
Mark = tuple[str, float]  # (boot id, CLOCK_BOOTTIME seconds): a stamp's boot half


@dataclass(frozen=True)
class Now:
    """One reading of the host's clocks (the host reads them; the core only gets them).
    ``boot_id`` ``""`` or ``boot`` None: the boot's clock is unknown, and only the wall
    clock counts."""

    wall: float
    boot_id: str = ""
    boot: float | None = None

    @property
    def mark(self) -> Mark | None:
        """The boot half of this reading, as the ledger keeps it; None when unknown."""
        return None if self.boot is None or not self.boot_id else (self.boot_id, self.boot)

    @property
    def offset(self) -> float | None:
        """Wall minus boottime: constant while nobody sets the wall clock."""
        return None if self.boot is None else self.wall - self.boot


def at(wall: float, mark: Mark | None) -> Now:
    """The stamp of an event recorded as its wall time and (maybe) its `Now.mark`."""
    return Now(wall) if mark is None else Now(wall, mark[0], mark[1])


def elapsed(since: Now, now: Now) -> float:
    """Seconds from ``since`` to ``now``: boottime within one boot, else (a reboot, or a
    stamp without its boot half) the wall clock's difference, at least 0."""
    then, mark = since.mark, now.mark
    if then is not None and mark is not None and then[0] == mark[0]:
        return max(0.0, mark[1] - then[1])
    return max(0.0, now.wall - since.wall)


def seen(wall: float, now: Now, floor: Now | None = None) -> Now:
    """The stamp of an event that the Engine dates by its own wall clock (``StartedAt``,
    ``FinishedAt``) and gpu-alloc first sees at ``now``: placed that wall difference back
    on the boot's clock, but never after ``now`` nor before ``floor`` (an event it
    cannot precede, such as the grant).  Seen within seconds of the event, a clock set
    in between moves it by at most the time from ``floor`` to ``now``."""
    mark, low = now.mark, None if floor is None else floor.mark
    if mark is None:
        return Now(wall)
    boot = mark[1] - max(0.0, now.wall - wall)
    if low is not None and low[0] == mark[0]:
        boot = min(mark[1], max(boot, low[1]))
    return Now(wall, mark[0], boot)


def placed(kept: Mapping[_Key, Now], walls: Mapping[_Key, float], now: Now) -> dict[_Key, Now]:
    """Events dated by a wall time (key -> it) on the boot's clock: each placed (`seen`)
    when first met, and kept (``kept``) while its wall time stays the same, so a clock
    set after that moves none; keys not in ``walls`` are dropped."""
    out = {}
    for key, wall in walls.items():
        old = kept.get(key)
        out[key] = old if old is not None and old.wall == wall else seen(wall, now)
    return out


@dataclass(frozen=True)
class Jump:
    """The wall clock moved against the boot's clock since the shim started.

    ``by``: seconds it moved (positive: forward); ``at``: the wall time just after;
    ``offset``: wall minus boottime before it, the clock reservations keep."""

    by: float
    at: float
    boot_id: str
    offset: float

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))

    @classmethod
    def from_json(cls, data: Any) -> Jump | None:
        """A jump as `to_json` wrote it; None for anything else."""
        try:
            by, at, offset = float(data["by"]), float(data["at"]), float(data["offset"])
            return cls(by, at, str(data["boot_id"]), offset)
        except (KeyError, TypeError, ValueError):
            return None


def jump(trusted: Now, now: Now, tolerance: float = TOLERANCE) -> Jump | None:
    """How far the wall clock moved from ``trusted`` (the shim's first reading) to
    ``now``, when more than ``tolerance``; None within it, across a reboot, or without
    the boot's clock."""
    if trusted.offset is None or now.offset is None or trusted.boot_id != now.boot_id:
        return None
    by = now.offset - trusted.offset
    return Jump(by, now.wall, now.boot_id, trusted.offset) if abs(by) > tolerance else None


def schedule(now: Now, moved: Jump | None) -> float:
    """The wall time reservations go by: the wall clock, but after a jump (this boot) the
    earlier of it and the clock from before the jump, so a window neither begins nor
    ends early (a clock set back delays windows, as it delays everything shown)."""
    if moved is None or now.boot is None or moved.boot_id != now.boot_id:
        return now.wall
    return min(now.wall, now.boot + moved.offset)


def described(moved: Jump) -> str:
    """``+3h``: how far a jump moved the wall clock, signed."""
    return ("+" if moved.by > 0 else "-") + ago(abs(moved.by))
