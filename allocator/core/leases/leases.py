"""The lease life and the ledger's contents, as plain data.

Rules
-----
1. A lease moves only by a row of `TRANSITIONS`: ``fire(lease, event)`` is the one
   way to change its phase, and an event that has no row for the lease's phase
   is refused (`LeaseError`), never guessed at.
2. A GPU is held by at most one live lease: `State.holders` is the only answer
   to "who holds GPU X", used by placement, the 409 text and ``status`` alike.
3. Tokens are kept only as SHA-256 hashes: reading the state (or a container's
   labels) never gives anyone a usable token.

Theory of operation
-------------------
::

    pending --BIND--> bound --HAND_OVER--> handed-over
                        ^                      |
                        +------TAKE_BACK-------+

``pending``: the shim placed it and the create is on its way; the plugin admits a
create for it only with its token (`State.admits`), which the shim alone holds and
sends once, in a request header.  ``bound``: the Engine answered with a container
id.  ``handed-over``: a stopped Compose predecessor lent its GPUs to the container
replacing it; they come back (TAKE_BACK) if the replacement's lease ends.
A lease ends (`State.release`) when its container is gone, when the create
definitely failed, or when its deadline passed and no container carries it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from allocator.core.leases.claims import Claim as Claim  # re-exported: State holds them
from allocator.core.leases.claims import claim_from_json, claim_json
from allocator.core.leases.clock import Mark
from allocator.core.leases.holders import Holder

# re-exported: the lease's phases are read with it everywhere
from allocator.core.leases.phases import TRANSITIONS as TRANSITIONS
from allocator.core.leases.phases import Event as Event
from allocator.core.leases.phases import LeaseError as LeaseError
from allocator.core.leases.phases import Phase as Phase

# 2: a file may have grants recorded beside it (its ``generation``), which 1 never read;
# 1's files read as 2's with none.
SCHEMA_VERSION = 2
READS = frozenset({1, SCHEMA_VERSION})
REPAIR_HINT = (
    "an operator (root) inspects it, then runs 'sudo gpu-alloc repair --reset' to move it "
    "aside and rebuild the ledger from the Engine's containers"
)


class StateError(Exception):
    """The ledger cannot be trusted or reached; allocation must stop."""


@dataclass(frozen=True)
class Lease:
    id: str
    gpus: tuple[str, ...]
    token_sha256: str
    state: str = Phase.PENDING.value
    container: str | None = None
    name: str = ""
    created: float = 0.0
    deadline: float = 0.0
    handed_to: str | None = None  # the lease of the container replacing this one
    # Who asked (the shim's SO_PEERCRED); files written before owners existed load as unknown.
    owner_uid: int | None = None
    owner: str = ""
    pool: str | None = None
    # CPU cores (with SMT siblings) and memory leased with the GPUs; absent in old files.
    cpus: tuple[int, ...] = ()
    mems: tuple[int, ...] = ()  # the NUMA node the memory was admitted on
    memory: int = 0  # bytes
    # Seconds its container may run (allocator/core/timing/timelimits.py), None: no limit; and
    # when it first ran (the Engine's StartedAt), the clock's start. Absent in old files.
    time_limit: float | None = None
    started: float | None = None
    # A share of its one GPU (allocator/core/rules/sharing.py): ``share_slots`` of its
    # ``share_of`` shares, run as ``share_user``; 0 of 0: the GPUs whole.  Written only
    # when set, so a ledger without shares reads as before, both ways.
    share_slots: int = 0
    share_of: int = 0
    share_user: str = ""
    # The boot's clock at the grant and at the first start (allocator/core/leases/clock.py),
    # which the durations from them are measured on (None: the wall clock).  Kept beside
    # the leases in the file ("boot"): a reader that knows no such fields reads it as ever.
    granted_boot: Mark | None = None
    started_boot: Mark | None = None
    # The checkpoint signal sent ``signal_lead`` seconds before a stop, last at ``signalled``
    # (allocator/core/timing/checkpoint.py).  Written only when set, as the shares are.
    signal: str = ""
    signal_lead: float = 0.0
    signalled: float | None = None
    signalled_boot: Mark | None = None

    @property
    def gpus_held(self) -> float:
        """GPUs it counts as against limits: a share is its fraction of one."""
        return self.share_slots / self.share_of if self.share_of else len(self.gpus)

    @property
    def phase(self) -> Phase:
        return Phase(self.state)

    def token_matches(self, token: str) -> bool:
        return hmac.compare_digest(self.token_sha256, _hash(token))


def fire(lease: Lease, event: Event, **changes: Any) -> Lease:
    """The lease after ``event``, with ``changes`` applied; `LeaseError` if not allowed."""
    to = TRANSITIONS.get((lease.phase, event))
    if to is None:
        raise LeaseError(f"lease {lease.id} is {lease.state}: {event.value} does not apply")
    return replace(lease, state=to.value, **changes)


@dataclass
class State:
    leases: dict[str, Lease] = field(default_factory=dict)
    claims: dict[str, Claim] = field(default_factory=dict)
    adopted_at: float | None = None
    # container -> when its lease ended under policy.release_stopped_after; its start
    # is refused with that reason until it is removed.
    expired: dict[str, float] = field(default_factory=dict)
    # Which write of the file this is: a grant recorded beside the file (the ledger's
    # grant journal) belongs to the file of its generation, and dies with it.
    generation: str = ""
    # container -> (its FinishedAt, and the boot's clock then, `clock.seen`): when it
    # stopped, as release_stopped_after measures it; kept until it runs again.
    stopped: dict[str, tuple[float, str, float]] = field(default_factory=dict)

    def copy(self) -> State:
        """A state to change without changing this one (leases and claims are frozen)."""
        return State(
            dict(self.leases),
            dict(self.claims),
            self.adopted_at,
            dict(self.expired),
            self.generation,
            dict(self.stopped),
        )

    def added_since(self, base: State) -> list[Lease] | None:
        """The leases this state has that ``base`` lacks, when that is all that differs."""
        if (self.claims, self.expired, self.adopted_at, self.generation, self.stopped) != (
            base.claims,
            base.expired,
            base.adopted_at,
            base.generation,
            base.stopped,
        ):
            return None
        new = []
        for lease_id, lease in self.leases.items():
            old = base.leases.get(lease_id)
            if old is None:
                new.append(lease)
            elif old is not lease and old != lease:
                return None
        return new if len(self.leases) == len(base.leases) + len(new) else None

    def holders(
        self, all_gpus: frozenset[str] | set[str], stopped: Mapping[str, str] | None = None
    ) -> dict[str, Holder]:
        """UUID -> its holder.  A handed-over lease's GPUs count under the lease it lent
        them to; an unpinned claim holds every GPU of ``all_gpus`` nothing else names.
        ``stopped``: container -> its status, for those the Engine last listed not running
        (`Holder.stopped`)."""
        stopped = stopped or {}
        held: dict[str, Holder] = {}
        for lease in self.leases.values():
            if lease.phase is Phase.HANDED_OVER:
                continue
            who = Holder(
                lease.container,
                lease.name,
                "leased by gpu-alloc",
                lease.id,
                lease.state,
                lease.owner or "unknown",
                lease.owner_uid,
                lease.created or None,
                lease.pool,
                stopped.get(lease.container or ""),
            )
            for uuid in lease.gpus:
                held.setdefault(uuid, who)
        for claim in sorted(self.claims.values(), key=lambda c: c.gpus is None):
            who = Holder(
                claim.container,
                claim.name,
                claim.why,
                owner=claim.owner,
                owner_uid=claim.owner_uid,
                since=claim.since,
                pool=claim.pool,
                stopped=stopped.get(claim.container),
            )
            for uuid in all_gpus if claim.gpus is None else claim.gpus:
                held.setdefault(uuid, who)
        return held

    def held_by(self, owner: str, besides: str | None = None) -> float:
        """GPUs ``owner``'s live leases hold (running or stopped; a share as its fraction),
        ``besides`` one lease, and their containers a reset adopted."""
        return sum(
            le.gpus_held
            for le in self.leases.values()
            if le.owner == owner and le.id != besides and le.phase is not Phase.HANDED_OVER
        ) + sum(len(c.gpus or ()) for c in self.claims.values() if c.owner == owner != "unknown")

    def _placed(self, but: str | None) -> Iterator[Lease | Claim]:
        """What holds cores and memory: live leases (a handed-over one's went with its
        GPUs) and claims."""
        for le in self.leases.values():
            if le.phase is not Phase.HANDED_OVER and le.id != but:
                yield le
        yield from self.claims.values()

    def leased_cpus(self, but: str | None = None) -> set[int]:
        """The cores live leases and claims hold."""
        return {c for held in self._placed(but) for c in held.cpus}

    def leased_memory(self, but: str | None = None) -> dict[int, int]:
        """NUMA node -> bytes live leases and claims admitted on it."""
        used: dict[int, int] = {}
        for held in self._placed(but):
            if held.memory and held.mems:
                used[held.mems[0]] = used.get(held.mems[0], 0) + held.memory
        return used

    def named_gpus(self) -> set[str]:
        """Every GPU a lease or a pinned claim names, present on the host or not."""
        named = {u for le in self.leases.values() for u in le.gpus}
        return named | {u for c in self.claims.values() for u in c.gpus or ()}

    def new_lease(
        self, gpus: tuple[str, ...], now: float, ttl: float, mark: Mark | None = None
    ) -> tuple[Lease, str]:
        """A pending lease granted at ``now`` (``mark``: the boot's clock then)."""
        token = secrets.token_urlsafe(24)
        lease = Lease(
            id=secrets.token_hex(8),
            gpus=gpus,
            token_sha256=_hash(token),
            created=now,
            deadline=now + ttl,
            granted_boot=mark,
        )
        self.leases[lease.id] = lease
        return lease, token

    def admits(self, lease_id: str, token: str, gpus: frozenset[str]) -> str | None:
        """Why a create that asks for ``gpus`` with this lease token is refused, or None
        (`admission`, on this state's lease ``lease_id``)."""
        return admission(self.leases.get(lease_id), lease_id, token, gpus)

    def bind(self, lease_id: str, container: str, name: str = "") -> bool:
        lease = self.leases.get(lease_id)
        if lease is None or lease.container not in (None, container):
            return False
        if (lease.phase, Event.BIND) not in TRANSITIONS:
            return lease.container == container
        self.leases[lease_id] = fire(
            lease, Event.BIND, container=container, name=name or lease.name
        )
        return True

    def release(self, lease_id: str) -> Lease | None:
        """End a lease; a container that handed its GPUs to this one gets them back."""
        for other in list(self.leases.values()):
            if other.handed_to == lease_id:
                self.leases[other.id] = fire(other, Event.TAKE_BACK, handed_to=None)
        return self.leases.pop(lease_id, None)

    def hand_over(self, lease_id: str, to: str, current_name: str) -> None:
        """A container being replaced (Compose recreate) lends its GPUs to lease ``to``."""
        self.leases[lease_id] = fire(
            self.leases[lease_id], Event.HAND_OVER, handed_to=to, name=current_name
        )

    def expire(self, lease_id: str, now: float) -> Lease | None:
        """End a stopped container's lease for good: its GPUs go back, its start is refused."""
        lease = self.release(lease_id)
        if lease is not None and lease.container:
            self.expired[lease.container] = now
        return lease

    def start_clock(
        self, lease_id: str, container: str, started: float, mark: Mark | None = None
    ) -> bool:
        """Record when the lease's container first ran (its time limit counts from then;
        ``mark``: the boot's clock then); False when the lease is gone, names another
        container, or its clock runs already."""
        lease = self.leases.get(lease_id)
        if lease is None or lease.container != container or lease.started is not None:
            return False
        self.leases[lease_id] = replace(lease, started=started, started_boot=mark)
        return True

    def signalled(self, lease_id: str, container: str, at: float, mark: Mark | None) -> bool:
        """Record the lease's checkpoint signal sent at ``at`` (``mark``: the boot's clock
        then); False when the lease is gone or names another container."""
        lease = self.leases.get(lease_id)
        if lease is None or lease.container != container:
            return False
        self.leases[lease_id] = replace(lease, signalled=at, signalled_boot=mark)
        return True

    def lease_of(self, container: str) -> Lease | None:
        return next((le for le in self.leases.values() if le.container == container), None)

    def predecessor_of(self, lease_id: str) -> Lease | None:
        """The lease that handed its GPUs to ``lease_id``, while it is still recorded."""
        return next((le for le in self.leases.values() if le.handed_to == lease_id), None)

    def handing_over(self) -> bool:
        return any(le.phase is Phase.HANDED_OVER for le in self.leases.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "version": SCHEMA_VERSION,
            # vars(), not asdict(): the fields are plain values and tuples of them, which
            # json writes as they are; asdict's deep copy would be most of a write's encoding.
            "leases": {k: lease_json(v) for k, v in sorted(self.leases.items())},
            "boot": {k: b for k, v in sorted(self.leases.items()) if (b := boot_json(v))},
            "stopped": {k: list(v) for k, v in sorted(self.stopped.items())},
            "claims": {k: claim_json(v) for k, v in sorted(self.claims.items())},
            "adopted_at": self.adopted_at,
            "expired": dict(sorted(self.expired.items())),
            "generation": self.generation,
        }

    @classmethod
    def from_json(cls, data: Any, path: str) -> State:
        if not isinstance(data, dict) or "version" not in data:
            raise StateError(f"{path}: not a gpu-alloc state file; {REPAIR_HINT}")
        if data["version"] not in READS:
            newer = isinstance(data["version"], int) and data["version"] > SCHEMA_VERSION
            raise StateError(
                f"{path}: schema version {data['version']!r} "
                + (
                    "was written by a newer gpu-alloc; upgrade this one"
                    if newer
                    else f"is unknown; {REPAIR_HINT}"
                )
            )
        try:
            boot = data.get("boot") or {}
            leases = {k: lease_from_json(v, boot.get(k)) for k, v in data["leases"].items()}
            claims = {k: claim_from_json(v) for k, v in data["claims"].items()}
            adopted_at = data.get("adopted_at")
            expired = {str(k): float(v) for k, v in (data.get("expired") or {}).items()}
            generation = str(data.get("generation") or "")
            stopped = {str(k): _stop(v) for k, v in (data.get("stopped") or {}).items()}
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise StateError(f"{path}: malformed entry ({e!r}); {REPAIR_HINT}") from None
        return cls(leases, claims, adopted_at, expired, generation, stopped)


def admission(lease: Lease | None, lease_id: str, token: str, gpus: frozenset[str]) -> str | None:
    """Why a create that asks for ``gpus`` with this lease token is refused, or None.
    ``lease``: lease ``lease_id`` as the ledger has it now (None: no such lease).

    Nothing is written: the token is the shim's alone (it never leaves the shim, the
    Engine and the plugin), and the shim sends each once, so a pending lease admits
    one create.  A bound lease admits none.
    """
    if lease is None or not lease.token_matches(token):
        return "its lease token is unknown or forged"
    if lease.phase is not Phase.PENDING:
        return f"its lease {lease_id} admitted its create already (it is {lease.state})"
    if frozenset(lease.gpus) != gpus:
        return f"its GPUs {sorted(gpus)} differ from lease {lease_id}'s {sorted(lease.gpus)}"
    return None


def lease_from_json(v: dict[str, Any], boot: Any = None) -> Lease:
    """A lease as `State.to_json` writes one, with its `boot_json` (None: none); a
    malformed one raises (KeyError, TypeError, ValueError)."""
    if v.get("state") == "authorized":
        # Written by 0.1, whose plugin consumed a token in the ledger: such a lease's create
        # was admitted already, and its token is readable on the container (0.1 labelled
        # it so).  Pending with no token: it admits nothing, and reconcile binds it.
        v = {**v, "state": Phase.PENDING.value, "token_sha256": ""}
    lease = Lease(
        **{
            **v,
            "gpus": tuple(v["gpus"]),
            "cpus": tuple(v.get("cpus", ())),
            "mems": tuple(v.get("mems", ())),
            "granted_boot": _mark((boot or {}).get("granted")),
            "started_boot": _mark((boot or {}).get("started")),
            "signalled_boot": _mark((boot or {}).get("signalled")),
        }
    )
    lease.phase  # noqa: B018  # an unknown phase is a malformed entry (ValueError)
    return lease


def lease_json(le: Lease) -> dict[str, Any]:
    """A lease as the file keeps it: what every gpu-alloc reads (`Lease(**v)` refuses an
    unknown key), its shares and its signal only when it has one, its boot clock apart
    (`boot_json`)."""
    left_out = _BOOT | (_NONE if le.share_of else _SHARE) | (_NONE if le.signal else _SIGNAL)
    return {k: v for k, v in vars(le).items() if k not in left_out}


def boot_json(le: Lease) -> dict[str, list[Any]]:
    """The lease's stamps on the boot's clock, as ``{"granted": [boot id, seconds], ...}``
    (empty when it has none)."""
    stamps = {
        "granted": le.granted_boot,
        "started": le.started_boot,
        "signalled": le.signalled_boot,
    }
    return {k: list(v) for k, v in stamps.items() if v is not None}


def _mark(v: Any) -> Mark | None:
    if v is None:
        return None
    boot_id, seconds = v  # anything but a pair is a malformed entry (ValueError, TypeError)
    return str(boot_id), float(seconds)


def _stop(v: Any) -> tuple[float, str, float]:
    wall, boot_id, seconds = v
    return float(wall), str(boot_id), float(seconds)


_SHARE = frozenset({"share_slots", "share_of", "share_user"})
_SIGNAL = frozenset({"signal", "signal_lead", "signalled"})
_BOOT = frozenset({"granted_boot", "started_boot", "signalled_boot"})
_NONE: frozenset[str] = frozenset()


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
