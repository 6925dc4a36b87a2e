"""The operator's policy: per-owner GPU limits, named pools, request labels, defaults.

Pure decisions: the owner, the ledger's counts and the inventory come in, an
answer goes out.  A refusal by policy (`Refusal`) is a 403 that names the rule in
the config (``policy.limits.default``), so a user can quote it to the operator; a
request that cannot be understood (`Invalid`, an unknown pool, a bad size) is a
400; a shortage of GPUs stays a 409 and is placement's business.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from allocator.core.api import labels, numbers, signals
from allocator.core.leases import clock
from allocator.core.leases.clock import Now
from allocator.core.machine.inventory import GPU, Inventory
from allocator.core.rules.power_grants import NO_GRANTS, NOBODY_BINDS, Binders, PowerGrants
from allocator.core.rules.sharing import Sharing

# adopted containers, creates with no peer or none to name (core/judging/owners.py)
UNKNOWN = "unknown"


@dataclass(frozen=True)
class Owner:
    """Who asked: the person behind a shim connection (allocator/core/judging/owners.py)."""

    uid: int | None
    user: str
    groups: tuple[str, ...] = ()


NOBODY = Owner(None, UNKNOWN)


@dataclass(frozen=True)
class Pool:
    gpus: tuple[int, ...]  # GPU indices, as nvidia-smi numbers them
    users: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()

    def open_to(self, owner: Owner) -> bool:
        """A pool that names no users or groups is open to everyone."""
        if not (self.users or self.groups):
            return True
        return owner.user in self.users or bool(set(owner.groups) & set(self.groups))


@dataclass(frozen=True)
class Ulimit:
    name: str
    soft: int
    hard: int


@dataclass(frozen=True)
class Rules:
    default_limit: int | None = None  # policy.limits.default.gpus; None: unlimited
    user_limits: Mapping[str, int] = field(default_factory=dict)
    group_limits: Mapping[str, int] = field(default_factory=dict)
    exempt: tuple[str, ...] = ("root",)
    pools: Mapping[str, Pool] = field(default_factory=dict)
    default_pool: str | None = None
    shm_size: int | None = None  # bytes
    ulimits: tuple[Ulimit, ...] = ()
    release_stopped_after: float | None = None  # seconds
    user_priorities: Mapping[str, int] = field(default_factory=dict)
    group_priorities: Mapping[str, int] = field(default_factory=dict)
    wait_default: float | None = None  # policy.wait.default, seconds; None: creates never wait
    wait_max: float | None = None  # policy.wait.max: the most a label may ask
    # policy.privileged: refuse, or lease-all (core/access/privileged.py)
    privileged: str = "refuse"
    fair_share_half_life: float | None = None  # policy.fair_share.half_life, seconds; None: off
    # policy.time_limit, seconds a GPU container may run (allocator/core/timing/timelimits.py)
    time_default: float | None = None
    time_pools: Mapping[str, float] = field(default_factory=dict)
    time_users: Mapping[str, float] = field(default_factory=dict)
    time_groups: Mapping[str, float] = field(default_factory=dict)
    reclaim_idle_after: float | None = None  # seconds; None: idle containers are left alone
    # policy.signal, the checkpoint signal before a stop (allocator/core/timing/checkpoint.py)
    signal_default: signals.Signal | None = None
    signal_pools: Mapping[str, signals.Signal] = field(default_factory=dict)
    signal_users: Mapping[str, signals.Signal] = field(default_factory=dict)
    signal_groups: Mapping[str, signals.Signal] = field(default_factory=dict)
    withheld: frozenset[str] = frozenset()  # swarm.gpus: scheduled by swarm, never leased here
    # policy.sharing: GPUs leased as shares (core/rules/sharing.py)
    sharing: tuple[Sharing, ...] = ()
    # policy.engine_socket_binds: who may bind the Engine's socket (core/access/socket_binds.py)
    engine_socket_binds: Binders = NOBODY_BINDS
    # policy.powers: who holds which power outside the allow-list (core/access/powers.py)
    powers: PowerGrants = NO_GRANTS

    @property
    def grants_owners(self) -> bool:
        """The policy trusts some owner with more than others (the Engine's socket, a
        power): creates then carry their owner, and starts are judged by it."""
        return bool(self.engine_socket_binds or self.powers)


@dataclass(frozen=True)
class Refusal:
    """Refused by a rule of the policy: HTTP 403.

    ``waitable``: the refusal may pass by itself (the owner's limit, once one of their
    containers goes), so a create that asked to wait waits instead.
    """

    msg: str
    waitable: bool = False


@dataclass(frozen=True)
class Invalid:
    """A request label gpu-alloc cannot act on: HTTP 400."""

    msg: str


@dataclass(frozen=True)
class Wanted:
    """What a create's request labels ask for beyond a GPU count."""

    pool: str | None = None
    model: str | None = None
    min_memory: int | None = None  # bytes
    # seconds, the `TIME` label's ask (allocator/core/timing/timelimits.py)
    time: float | None = None
    # the `SIGNAL` label's checkpoint signal (allocator/core/timing/checkpoint.py)
    signal: signals.Signal | None = None

    def where(self, pool: str | None) -> str:
        """The set a request is placed in, for the shortage text ("" for the whole host)."""
        parts = [f"pool '{pool}'"] if pool else []
        if self.model:
            parts.append(f"model containing '{self.model}'")
        if self.min_memory is not None:
            parts.append(f"at least {self.min_memory // 2**20} MiB")
        return ", ".join(parts) if not parts or pool else "the GPUs with " + ", ".join(parts)


POOL, MODEL, MIN_MEMORY, OWNER, WAIT, TIME, SIGNAL = (
    labels.POOL,
    labels.MODEL,
    labels.MIN_MEMORY,
    labels.OWNER,
    labels.WAIT,
    labels.TIME,
    labels.SIGNAL,
)


def parse_size(text: str) -> int:
    """Bytes in ``text`` as Docker reads ``--shm-size`` (1024-based; ``40g``, ``512MiB``)."""
    return int(numbers.read(text, numbers.SIZE))


def wanted(given: Mapping[str, Any] | None) -> Wanted | Invalid:
    """The request labels of a create, as the user set them (before they are stripped)."""
    given = given or {}
    size = given.get(MIN_MEMORY)
    try:
        memory = None if size in (None, "") else parse_size(str(size))
    except ValueError as e:
        return Invalid(f"gpu-alloc refused the container create: label {MIN_MEMORY}: {e}")
    raw = given.get(TIME)
    try:
        seconds = None if raw in (None, "") else parse_duration(str(raw))
    except ValueError as e:
        return Invalid(f"gpu-alloc refused the container create: label {TIME}: {e}")
    if seconds is not None and seconds <= 0:
        return Invalid(
            f"gpu-alloc refused the container create: label {TIME}: '{raw}' is not a time "
            "limit; ask for more than zero, such as 30m or 6h"
        )
    try:
        signal = None if given.get(SIGNAL) in (None, "") else signals.parse(given[SIGNAL])
    except ValueError as e:
        return Invalid(f"gpu-alloc refused the container create: label {SIGNAL}: {e}")
    return Wanted(
        str(given[POOL]) if given.get(POOL) else None,
        str(given[MODEL]) if given.get(MODEL) else None,
        memory,
        seconds,
        signal,
    )


def limit_of(owner: Owner, rules: Rules) -> tuple[int, str] | None:
    """(GPUs allowed at once, the rule's dotted key); None when no limit applies.

    The largest limit that applies wins (the user's own, their groups', the default),
    the most specific rule on a tie.  The exempt (root by default) have none.
    """
    if owner.user in rules.exempt:
        return None
    found: list[tuple[int, str]] = []
    if owner.user in rules.user_limits:
        found.append((rules.user_limits[owner.user], f"policy.limits.users.{owner.user}"))
    found += [
        (rules.group_limits[g], f"policy.limits.groups.{g}")
        for g in sorted(owner.groups)
        if g in rules.group_limits
    ]
    if rules.default_limit is not None:
        found.append((rules.default_limit, "policy.limits.default"))
    if not found:
        return None
    best = max(gpus for gpus, _ in found)
    return next(f for f in found if f[0] == best)


def over_limit(owner: Owner, holding: float, asking: float, rules: Rules) -> Refusal | None:
    """Refuse a create that would take ``owner`` past their limit (running or stopped); a
    share counts as its fraction of a GPU (allocator/core/rules/sharing.py)."""
    limit = limit_of(owner, rules)
    holding, asking = round(holding, 9), round(asking, 9)  # thirds add up to whole GPUs
    if limit is None or holding + asking <= limit[0]:
        return None
    allowed, rule = limit
    gpus = f"GPU{'s' * (allowed != 1)}"
    if asking > allowed:  # never fits, whatever is released
        return Refusal(
            f"gpu-alloc refused the container create: {owner.user} may hold {allowed} "
            f"{gpus} at once ({rule}) and asked for {asking:g}; ask for {allowed} or fewer, "
            "or ask your operator to raise the limit",
            waitable=False,
        )
    if holding:
        now = f"{owner.user} holds {holding:g} of {allowed} {gpus} allowed"
    else:
        now = f"{owner.user} may hold {allowed} {gpus} at once"
    return Refusal(
        f"gpu-alloc refused the container create: {now} ({rule}) and asked for {asking:g} "
        "more; release one with 'docker rm' (a stopped container still holds its GPUs), "
        "or ask your operator",
        waitable=True,  # one of their containers going makes room
    )


def priority_of(owner: Owner, rules: Rules) -> int:
    """The highest of the owner's own priority and their groups'; 0 when none is set."""
    found = [rules.group_priorities[g] for g in owner.groups if g in rules.group_priorities]
    if owner.user in rules.user_priorities:
        found.append(rules.user_priorities[owner.user])
    return max(found, default=0)


def parse_duration(text: str) -> float:
    """Seconds in ``90``, ``30s``, ``15m``, ``2h`` or ``1d`` (at most 100 years)."""
    return float(numbers.read(text, numbers.DURATION))


def wait_of(given: Mapping[str, Any] | None, rules: Rules) -> float | Invalid:
    """How long a create may wait for GPUs, in seconds (0: not at all).

    The `WAIT` label wins over ``policy.wait.default``; ``policy.wait.max`` caps both.
    """
    raw = (given or {}).get(WAIT)
    if raw in (None, ""):
        seconds = rules.wait_default or 0.0
    else:
        try:
            seconds = parse_duration(str(raw))
        except ValueError as e:
            return Invalid(f"gpu-alloc refused the container create: label {WAIT}: {e}")
    if rules.wait_max is not None:
        seconds = min(seconds, rules.wait_max)
    return seconds


def given_to_swarm(gpu: GPU, rules: Rules) -> bool:
    """Whether ``gpu`` (or the GPU a slice is cut from) is in ``swarm.gpus``: swarm
    schedules it, so nothing here leases or reserves it."""
    return gpu.uuid in rules.withheld or gpu.parent in rules.withheld


def eligible(
    inventory: Inventory, want: Wanted, owner: Owner, rules: Rules, required: Sequence[str] = ()
) -> tuple[Inventory, str | None] | Refusal | Invalid:
    """The GPUs this request may be placed on, and the pool it is placed in.

    A request without a pool label goes to ``default_pool`` (none: every GPU).
    GPUs named explicitly (``device=``) must lie inside that set.  GPUs given to swarm
    (``rules.withheld``) are in no set.
    """
    pool_name = want.pool or rules.default_pool
    gpus: Sequence[GPU] = inventory.gpus
    migs: Sequence[GPU] = inventory.migs  # a slice is in a pool with its GPU (same index)
    if rules.withheld:
        swarm = [g for g in (*gpus, *migs) if given_to_swarm(g, rules)]
        given = [g for g in swarm if g.uuid in required]
        if given:
            return Refusal(
                f"gpu-alloc refused the container create: {given[0].label()} is given to "
                "Docker Swarm (swarm.gpus), whose services reserve it with generic resources; "
                "ask for another GPU, or run the work as a swarm service"
            )
        gpus = [g for g in gpus if g not in swarm]
        migs = [m for m in migs if m not in swarm]
    if pool_name is not None:
        pool = rules.pools.get(pool_name)
        if pool is None:
            if not rules.pools:
                return Invalid(
                    f"gpu-alloc refused the container create: there is no GPU pool "
                    f"'{pool_name}': this host has no pools; leave out --label {POOL}"
                )
            known = ", ".join(sorted(rules.pools))
            return Invalid(
                f"gpu-alloc refused the container create: there is no GPU pool '{pool_name}' "
                f"(pools: {known}); name one of them with --label {POOL}=NAME"
            )
        if not pool.open_to(owner):
            open_ = sorted(n for n, p in rules.pools.items() if p.open_to(owner))
            instead = (
                f"use one open to you with --label {POOL}=NAME ({', '.join(open_)})"
                if open_
                else "no pool is open to you"
            )
            return Refusal(
                f"gpu-alloc refused the container create: pool '{pool_name}' is not open to "
                f"{owner.user} (policy.pools.{pool_name}); {instead}, or ask your operator"
            )
        gpus = [g for g in gpus if g.index in pool.gpus]
        migs = [m for m in migs if m.index in pool.gpus]
    if want.model:
        gpus = [g for g in gpus if want.model.lower() in g.name.lower()]
        migs = [m for m in migs if want.model.lower() in m.name.lower()]
    if want.min_memory is not None:
        gpus = [g for g in gpus if g.memory_mib * 2**20 >= want.min_memory]
        migs = [m for m in migs if m.memory_mib * 2**20 >= want.min_memory]
    allowed = {g.uuid for g in (*gpus, *migs)}
    everything = (*inventory.gpus, *inventory.migs)
    outside = [g for g in everything if g.uuid in required and g.uuid not in allowed]
    if outside:
        where = f"pool '{pool_name}'" if pool_name else "the GPUs matching the request labels"
        named = ", ".join(g.label() for g in outside)
        return Refusal(
            f"gpu-alloc refused the container create: {named} is not in {where}"
            + (f" (policy.pools.{pool_name})" if pool_name else "")
            + f"; name a GPU of that set, or pick its pool with --label {POOL}=NAME"
        )
    if gpus is inventory.gpus and migs is inventory.migs:
        return inventory, pool_name  # nothing narrowed it: the same inventory, its caches kept
    return Inventory(tuple(gpus), inventory.cuda_driver_version, tuple(migs)), pool_name


def missing_pool_gpus(rules: Rules, inventory: Inventory) -> tuple[str, str] | None:
    """(dotted key, why) for a pool naming a GPU index the host lacks; None when every pool
    lies on the host.  Such a pool would quietly place its requests on fewer GPUs than the
    operator meant, or on none: a config error.  A MIG slice has its GPU's index."""
    have = sorted({g.index for g in inventory.gpus})
    for name, pool in rules.pools.items():
        missing = sorted(set(pool.gpus) - set(have))
        if missing:
            return (
                f"policy.pools.{name}.gpus",
                f"GPU {', '.join(map(str, missing))} is not on this host, whose GPUs are "
                f"{', '.join(map(str, have)) or 'none'} (nvidia-smi numbers them)",
            )
    return None


def with_defaults(spec: dict[str, Any], rules: Rules) -> dict[str, Any]:
    """``gpu_defaults`` added to a GPU create, only for what the client left unset."""
    hc = dict(spec.get("HostConfig") or {})
    if rules.shm_size is not None and not hc.get("ShmSize"):
        hc["ShmSize"] = rules.shm_size
    given = list(hc.get("Ulimits") or ())
    names = {str((u or {}).get("Name")) for u in given}
    extra = [
        {"Name": u.name, "Soft": u.soft, "Hard": u.hard}
        for u in rules.ulimits
        if u.name not in names
    ]
    if extra:
        hc["Ulimits"] = given + extra
    if hc == (spec.get("HostConfig") or {}):
        return spec
    return {**spec, "HostConfig": hc}


def expired(
    leases: Sequence[tuple[str, str]], stopped_since: Mapping[str, Now], now: Now, rules: Rules
) -> list[str]:
    """Lease ids (of ``(lease id, container)``) stopped longer than release_stopped_after,
    measured on the boot's clock (`clock.elapsed`)."""
    after = rules.release_stopped_after
    if after is None:
        return []
    return [
        lease_id
        for lease_id, cid in leases
        if cid in stopped_since and clock.elapsed(stopped_since[cid], now) >= after
    ]


def expired_text(ref: str, rules: Rules) -> str:
    after = rules.release_stopped_after
    limit = f" ({after:g}s)" if after is not None else ""
    return (
        f"gpu-alloc refused to start {ref}: it was stopped longer than "
        f"policy.release_stopped_after{limit}, so its GPUs went back to the pool; "
        "remove it and create it again (docker rm, then docker run --gpus ...) to get GPUs"
    )


def owner_label(owner: Owner) -> str:
    return f"{'' if owner.uid is None else owner.uid}:{owner.user}"


def labelled_owner(given: Mapping[str, Any]) -> tuple[int | None, str] | None:
    """(uid, user) of the container whose labels are ``given``, as gpu-alloc wrote them:
    only on a container the shim made for a lease (a client's own label was stripped);
    None where there is none.  ``unknown`` made it: uid None."""
    uid, _, user = str(given.get(OWNER) or "").rpartition(":")
    if not labels.lease_of(given) or not user:
        return None
    return (int(uid) if uid.isascii() and uid.isdigit() else None), user


def user_of_label(value: str | None) -> str:
    """The user name in an `OWNER` label ("<uid>:<user>"); "" when there is none."""
    _, _, user = (value or "").rpartition(":")
    return user
