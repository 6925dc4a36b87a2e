"""Who holds a GPU, as refusals, ``status`` and placement name it.

`State.holders` (allocator/core/leases/leases.py) answers "who holds GPU X" with a `Holder`:
a lease in any live phase, or a container gpu-alloc adopted.  The phrase a refusal
shows and the dict ``status`` prints are made here, from that answer alone, so every
place that names a holder says the same thing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

CREATED = "Created"  # the Engine's status of a container never started


@dataclass(frozen=True)
class Holder:
    """Who holds a GPU: a lease (in any live phase) or an adopted claim."""

    container: str | None
    name: str
    why: str
    lease: str | None = None
    state: str | None = None
    owner: str = "unknown"
    owner_uid: int | None = None
    since: float | None = None
    pool: str | None = None
    # The Engine's status of a holder it last listed not running ("Exited (0) 2 hours
    # ago"): a stopped container keeps its GPUs, which surprises whoever finds them taken.
    # None: running, or not known.
    stopped: str | None = None

    @property
    def idle_stopped(self) -> bool:
        """Stopped after running: a container created and not yet started (the Engine's
        "Created", as between ``docker create`` and its start) is on its way, not idle."""
        return self.stopped is not None and self.stopped != CREATED

    def describe(self, now: float | None = None) -> str:
        """One phrase for refusals: what holds it, whose it is, for how long, and whether
        it is stopped (so nobody seems to be using the GPU)."""
        stopped = f"; stopped: {self.stopped}" if self.idle_stopped else ""
        if self.stopped == CREATED:
            stopped = "; created, not started yet"
        if self.lease is None:
            return (
                f"container {(self.container or '')[:12]} '{self.name}' "
                f"(not leased: {self.why}{stopped})"
            )
        age = f", held {held_for(now - self.since)}" if now is not None and self.since else ""
        return " ".join(
            filter(
                None,
                (
                    f"container {self.container[:12]}" if self.container else "a create in flight",
                    f"'{self.name}'" if self.name else "",
                    f"of {self.owner}{age}",
                    f"(lease {self.lease}, {self.state}{stopped})",
                ),
            )
        )

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if v is not None or k == "container"}
        out["owner"] = {"uid": out.pop("owner_uid", None), "user": self.owner}
        return out


def held_for(seconds: float) -> str:
    """How long a holder has had its GPUs: ``<1m`` under a minute, so a fresh lease does
    not read as a time limit of ``0s``."""
    return "<1m" if seconds < 60 else ago(seconds)


def ago(seconds: float) -> str:
    """A duration as people say it: 45s, 12m, 3h, 2d."""
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
