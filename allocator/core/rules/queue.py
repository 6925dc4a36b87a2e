"""The order in which waiting GPU creates are served, as a pure function.

Rules
-----
1. Order: higher ``priority`` first, then fair share, then arrival.  Fair share is
   the owner holding fewer GPUs now first; with ``usage`` (owner -> decayed
   GPU-seconds, ``policy.fair_share``) the owner with less recent use first, and
   then the one holding fewer now.  The order is computed afresh at every wake-up,
   so a request's place can change as leases come and go.
2. A request served out of order must not delay any request ahead of it.  With no
   run-time estimates the only GPUs that cannot delay a waiter are those it could
   never use, so a waiter that is short of GPUs *blocks* every free GPU it could
   use: the requests behind it may take only the others (a different pool, a
   model or memory it does not want, GPUs it does not name).  Nothing therefore
   waits forever behind a stream of smaller requests.
3. A waiter held back by its owner's limit blocks nothing: its GPUs would not go
   to it anyway.

4. Rule 2 holds for every lease, not only the queue's own serving: a create arriving
   now, waiting or not, takes its place in the order (it arrived last) and may not take
   what the waiters ahead of it keep (`kept`).

Theory of operation
-------------------
`serve` walks the waiters in order and asks ``attempt(waiter, blocked)`` to place
each one among the free GPUs minus ``blocked``.  ``attempt`` is the caller's
placement under the ledger lock (it creates the lease when it can); it answers
`Placed`, `Short` (with the free GPUs that waiter could use) or `OverLimit`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from allocator.core.leases.holders import Holder


@dataclass(frozen=True)
class Waiter:
    id: str
    owner: str  # user name; "" when unknown
    priority: int
    arrived: int  # a sequence number: earlier is smaller
    gpus: int  # how many GPUs it asks for, for status
    ask: Any = None  # what the caller needs to place it; opaque here
    since: float | None = None  # wall clock when it joined, for the audit trail


@dataclass(frozen=True)
class Placed:
    gpus: tuple[str, ...]
    result: Any = None  # what the caller hands back to the waiting client (the lease)
    part: float | None = None  # GPUs it counts as, when not len(gpus): a share's fraction


@dataclass(frozen=True)
class Short:
    usable: frozenset[str]  # free GPUs this waiter could have used


@dataclass(frozen=True)
class OverLimit:
    why: str


Attempt = Callable[[Waiter, frozenset[str]], Placed | Short | OverLimit]


Usage = Mapping[str, float] | None  # owner -> decayed GPU-seconds; None: fair share off


def order(
    waiters: Iterable[Waiter], held: Mapping[str, float], usage: Usage = None
) -> list[Waiter]:
    """The waiters in the order they are served; ``held``: owner -> GPUs held now."""
    used = usage or {}
    return sorted(
        waiters,
        key=lambda w: (-w.priority, used.get(w.owner, 0.0), held.get(w.owner, 0), w.arrived),
    )


def serve(
    waiters: Iterable[Waiter], held: Mapping[str, float], attempt: Attempt, usage: Usage = None
) -> list[tuple[Waiter, Placed]]:
    """Grant every waiter that can be granted now without delaying one ahead of it.

    After each grant the order is taken again: the owner now holds more, and fair
    share may move another owner's request ahead.
    """
    remaining = list(waiters)
    holding: dict[str, float] = dict(held)
    granted: list[tuple[Waiter, Placed]] = []
    while remaining:
        blocked: frozenset[str] = frozenset()
        for waiter in order(remaining, holding, usage):
            outcome = attempt(waiter, blocked)
            if isinstance(outcome, Placed):
                granted.append((waiter, outcome))
                part = len(outcome.gpus) if outcome.part is None else outcome.part
                holding[waiter.owner] = holding.get(waiter.owner, 0) + part
                remaining.remove(waiter)
                break
            if isinstance(outcome, Short):
                blocked |= outcome.usable
        else:
            break
    return granted


def ahead_of(
    newcomer: Waiter, waiters: Iterable[Waiter], held: Mapping[str, float], usage: Usage = None
) -> list[Waiter]:
    """The waiters served before ``newcomer`` would be, were it in line now."""
    ranked = order([*waiters, newcomer], held, usage)
    return ranked[: ranked.index(newcomer)]


def kept(ahead: Iterable[Waiter], attempt: Attempt) -> dict[str, Waiter]:
    """GPU -> the waiter that keeps it from a create behind ``ahead`` (rule 4).

    Walking ``ahead`` in order, each waiter keeps the GPUs it would be given now (the
    queue serves it at its next wake-up), or, short of GPUs, every free one it could use;
    one over its limit keeps nothing.  ``attempt`` must grant nothing: it only tries.
    """
    keeps: dict[str, Waiter] = {}
    for waiter in ahead:
        outcome = attempt(waiter, frozenset(keeps))
        if isinstance(outcome, Placed):
            gpus: Iterable[str] = outcome.gpus
        elif isinstance(outcome, Short):
            gpus = outcome.usable
        else:
            continue
        for uuid in gpus:
            keeps.setdefault(uuid, waiter)
    return keeps


@dataclass(frozen=True)
class Kept(Holder):
    """A GPU the line keeps for a waiter: a refusal names who waits, for how many."""

    def describe(self, now: float | None = None) -> str:
        return self.why


def keeper(waiter: Waiter, name: str) -> Kept:
    """What holds a GPU kept for ``waiter`` (its create is called ``name``)."""
    who = waiter.owner or "someone"
    what = f"'{name}' " if name else ""
    gpus = f"{waiter.gpus} GPU{'s' * (waiter.gpus != 1)}" if waiter.gpus > 0 else "all GPUs"
    return Kept(None, name, f"kept for {who}'s create {what}waiting in line for {gpus}", owner=who)
