"""The grant plan (allocator/core/grant_plan.py): every stage of a grant, as a table.

A host of four GPUs (0 and 1 on NUMA node 0, 2 and 3 on node 1) and a request go in;
the `Plan`, or the refusal, shortage or invalid request with the words it says, comes out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from allocator.core.grant_plan import HostNow, LeaseRequest, Plan, plan, record, scope
from allocator.core.judging.ask import Ask
from allocator.core.leases.holders import Holder
from allocator.core.leases.leases import Phase, State
from allocator.core.machine import cpus
from allocator.core.machine.inventory import GPU, Inventory
from allocator.core.placement import POLICIES, Shortage
from allocator.core.rules.policy import Invalid, Owner, Pool, Refusal, Rules, Wanted
from allocator.core.rules.sharing import ShareAsk, Sharing
from allocator.core.timing.reservations import Reservation

NOW = 1_000_000.0
ALICE = Owner(1001, "alice", ("staff",))
BOB = Owner(1002, "bob", ("ml",))
GPUS = tuple(
    GPU(f"GPU-{i}", i, "Simulated H100", 81559, numa_node=0 if i < 2 else 1) for i in range(4)
)
INVENTORY = Inventory(GPUS)
GIB = 2**30
TOPOLOGY = cpus.Topology(
    (
        cpus.Node(0, ((0, 4), (1, 5)), 64 * GIB),
        cpus.Node(1, ((2, 6), (3, 7)), 64 * GIB),
    )
)
POOLS = {"a": Pool((0, 1)), "b": Pool((2, 3), users=("bob",))}
KEPT = Holder(None, "w1", "kept for bob's create 'w1' waiting in line for 2 GPUs", owner="bob")


def one(n: int = 1, *named: str) -> Ask:
    return Ask(required=named, count=n, every=False, caps=("gpu",))


def req(ask: Ask | None = None, owner: Owner = ALICE, **kw: Any) -> LeaseRequest:
    return LeaseRequest(ask or one(), "job", owner, **kw)


def hold(st: State, *uuids: str, owner: str = "bob", container: str = "", share: int = 0) -> str:
    """A lease of ``owner`` on ``uuids`` (bound to ``container`` when given); its id."""
    lease, _ = st.new_lease(uuids, NOW - 60, 300)
    st.leases[lease.id] = replace(
        lease, owner=owner, share_slots=share, share_of=2 if share else 0, share_user="1000"
    )
    if container:
        st.bind(lease.id, container)
    return lease.id


@dataclass(frozen=True)
class Case:
    req: LeaseRequest
    expect: Plan | tuple[type, str]  # the plan, or the answer's type and words it says
    rules: Rules = field(default_factory=Rules)
    setup: Callable[[State], None] = lambda st: None
    host: Mapping[str, Any] = field(default_factory=dict)  # HostNow fields besides these
    kept: Mapping[str, Holder] = field(default_factory=dict)


def plain(gpus: tuple[str, ...], pool: str | None = None, limit: float | None = None) -> Plan:
    return Plan(gpus, pool, limit)


CASES = {
    # 1. scope: the pool, the request labels, swarm's GPUs
    "one GPU of an empty host": Case(req(), plain(("GPU-0",))),
    "the pool label places in the pool": Case(
        req(owner=BOB, want=Wanted(pool="b")), plain(("GPU-2",), "b"), Rules(pools=POOLS)
    ),
    "the default pool when no label names one": Case(
        req(), plain(("GPU-0",), "a"), Rules(pools=POOLS, default_pool="a")
    ),
    "a pool that does not exist is a 400": Case(
        req(want=Wanted(pool="c")), (Invalid, "there is no GPU pool 'c' (pools: a, b)"),
        Rules(pools=POOLS),
    ),
    "a pool not open to the owner is refused": Case(
        req(want=Wanted(pool="b")), (Refusal, "pool 'b' is not open to alice"),
        Rules(pools=POOLS),
    ),
    "a GPU named outside the pool is refused": Case(
        req(one(0, "GPU-3"), want=Wanted(pool="a")), (Refusal, "GPU 3 is not in pool 'a'"),
        Rules(pools=POOLS),
    ),
    "a GPU given to swarm is refused when named": Case(
        req(one(0, "GPU-1")), (Refusal, "is given to Docker Swarm"),
        Rules(withheld=frozenset({"GPU-1"})),
    ),
    "a GPU given to swarm is never placed": Case(
        req(one(2)), plain(("GPU-2", "GPU-3")), Rules(withheld=frozenset({"GPU-0", "GPU-1"}))
    ),
    "a model label narrows the GPUs": Case(
        req(want=Wanted(model="A100")), (Shortage, "model containing 'A100'")
    ),
    # 2. the time limit
    "more time than the policy gives is a 400 naming the rule": Case(
        req(want=Wanted(time=7200)), (Invalid, "(policy.time_limit.default)"),
        Rules(time_default=3600),
    ),
    "the policy's limit goes into the lease": Case(
        req(), plain(("GPU-0",), None, 3600), Rules(time_default=3600)
    ),
    "less time than the policy's, as the label asks": Case(
        req(want=Wanted(time=600)), plain(("GPU-0",), None, 600), Rules(time_default=3600)
    ),
    "the pool's limit for a create placed in it": Case(
        req(owner=BOB, want=Wanted(pool="b", time=7200)),
        (Invalid, "policy.time_limit.pools.b"), Rules(pools=POOLS, time_pools={"b": 3600}),
    ),
    # 3. what holds GPUs: leases, and what the line keeps
    "around the GPUs leased": Case(
        req(one(2)), plain(("GPU-1", "GPU-2")), setup=lambda st: hold(st, "GPU-0")
    ),
    "around the GPUs kept for a waiter ahead": Case(
        req(), plain(("GPU-2",)), kept={"GPU-0": KEPT, "GPU-1": KEPT}
    ),
    "a shortage names the waiter the line keeps GPUs for": Case(
        req(one(3)), (Shortage, "kept for bob's create 'w1'"), kept={"GPU-0": KEPT, "GPU-1": KEPT}
    ),
    "every GPU held: short": Case(
        req(),
        (Shortage, "0 of 4 free on this host, held by:\n  GPUs 0,1,2,3: a create in flight of bob"),
        setup=lambda st: hold(st, "GPU-0", "GPU-1", "GPU-2", "GPU-3"),
    ),
    "more GPUs than the host has": Case(req(one(5)), (Shortage, "this host has only 4")),
    # 6. the owner's limit
    "within the owner's limit": Case(
        req(), plain(("GPU-1",)), Rules(user_limits={"alice": 2}),
        setup=lambda st: hold(st, "GPU-0", owner="alice"),
    ),
    "over the owner's limit is refused": Case(
        req(), (Refusal, "alice holds 1 of 1 GPU allowed"), Rules(user_limits={"alice": 1}),
        setup=lambda st: hold(st, "GPU-0", owner="alice"),
    ),
    "asking more than the limit ever allows": Case(
        req(one(3)), (Refusal, "asked for 3; ask for 2 or fewer"), Rules(user_limits={"alice": 2})
    ),
    # 7. reservations, then the GPUs
    "a GPU reserved for someone else now is passed over": Case(
        req(), plain(("GPU-1",)),
        host={"reservations": (Reservation("r1", "bob", ("GPU-0",), NOW - 10, NOW + 3600),)},
    ),
    "a GPU reserved for someone else, named, is short naming it": Case(
        req(one(0, "GPU-0")), (Shortage, "reservation r1"),
        host={"reservations": (Reservation("r1", "bob", ("GPU-0",), NOW - 10, NOW + 3600),)},
    ),
    "a GPU reserved later is left to a create without a time limit": Case(
        req(), plain(("GPU-1",)),
        host={"reservations": (Reservation("r1", "bob", ("GPU-0",), NOW + 600, NOW + 3600),)},
    ),
    "a GPU reserved later goes to a create whose limit ends before": Case(
        req(), plain(("GPU-0",), None, 300), Rules(time_default=300),
        host={"reservations": (Reservation("r1", "bob", ("GPU-0",), NOW + 600, NOW + 3600),)},
    ),
    "the holder's count request lands on its own reserved GPU": Case(
        req(), plain(("GPU-3",)),
        host={"reservations": (Reservation("r1", "alice", ("GPU-3",), NOW - 10, NOW + 3600),)},
    ),
    "an unhealthy GPU is passed over": Case(
        req(), plain(("GPU-1",)), host={"unhealthy": {"GPU-0": "Xid 79"}}
    ),
    "an unhealthy GPU named cannot wait": Case(
        req(one(0, "GPU-0")), (Shortage, "Xid 79"), host={"unhealthy": {"GPU-0": "Xid 79"}}
    ),
    "the placement policy picks: first-fit in index order": Case(
        req(one(2)), plain(("GPU-0", "GPU-1")), setup=lambda st: hold(st, "GPU-2")
    ),
    # 8. cores and memory near the GPUs
    "cores on the GPUs' node": Case(
        req(resources=cpus.Resources(cpus=1, memory=GIB)),
        Plan(("GPU-0",), None, None, (0, 4), (0,), GIB),
        host={"topology": TOPOLOGY},
    ),
    "more cores than the host has is short": Case(
        req(resources=cpus.Resources(cpus=5)), (Shortage, "not enough free CPU cores"),
        host={"topology": TOPOLOGY},
    ),
    "cores asked with no topology read are refused, never left out": Case(
        req(resources=cpus.Resources(cpus=1)), (Shortage, "not enough free CPU cores")
    ),
    # 4. shares
    "a share on the shared GPU": Case(
        req(share=ShareAsk(1, 2, user="1000")),
        Plan(("GPU-3",), None, None, share_slots=1, share_of=2, share_user="1000"),
        Rules(sharing=(Sharing((3,), 2),)),
    ),
    "a share packs beside the one out already": Case(
        req(share=ShareAsk(1, 2, user="1000")),
        Plan(("GPU-3",), None, None, share_slots=1, share_of=2, share_user="1000"),
        Rules(sharing=(Sharing((2, 3), 2),)),
        setup=lambda st: hold(st, "GPU-3", share=1),
    ),
    "a share counts as its fraction against the owner's limit": Case(
        req(share=ShareAsk(1, 2, user="1000")), (Refusal, "alice holds 1 of 1 GPU allowed"),
        Rules(user_limits={"alice": 1}, sharing=(Sharing((3,), 2),)),
        setup=lambda st: hold(st, "GPU-0", owner="alice"),
    ),
    "a share with no shared GPU cannot wait": Case(
        req(share=ShareAsk(1, 2)), (Shortage, "none of the GPUs it may have is shared")
    ),
    "a share's GPU held whole is short": Case(
        req(share=ShareAsk(1, 2, user="1000")), (Shortage, "GPU 3: held whole"),
        Rules(sharing=(Sharing((3,), 2),)), setup=lambda st: hold(st, "GPU-3"),
    ),
}  # fmt: skip


def host_for(case: Case) -> HostNow:
    return HostNow(INVENTORY, case.rules, NOW, **{"placement": POLICIES["first-fit"], **case.host})


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_the_grant_plan(case: Case) -> None:
    st = State()
    case.setup(st)
    before = st.copy()
    got = plan(case.req, host_for(case), st, case.kept)
    assert st.leases == before.leases  # the plan takes nothing
    if isinstance(case.expect, Plan):
        assert got == case.expect
    else:
        kind, words = case.expect
        assert isinstance(got, kind), got
        assert words in got.msg


def test_scope_is_the_plans_first_stage() -> None:
    """What `scope` refuses, `plan` refuses the same way (a shell asks it without the lock)."""
    for case in CASES.values():
        early = scope(case.req, INVENTORY, case.rules)
        if not isinstance(early, tuple):
            assert plan(case.req, host_for(case), State(), case.kept) == early


def test_a_shortage_carries_the_free_gpus_the_request_could_use() -> None:
    """What a waiter short of GPUs keeps from those behind it (core/rules/queue.py rule 2)."""
    st = State()
    hold(st, "GPU-0", "GPU-1")
    got = plan(req(one(3)), host_for(Case(req(), plain(()))), st)
    assert isinstance(got, Shortage)
    assert got.usable == {"GPU-2", "GPU-3"}
    pooled = req(one(3), owner=BOB, want=Wanted(pool="b"))
    got = plan(pooled, host_for(Case(pooled, plain(()), Rules(pools=POOLS))), State())
    assert isinstance(got, Shortage)
    assert got.usable == {"GPU-2", "GPU-3"}  # never another pool's GPUs


def test_record_makes_the_plan_a_pending_lease() -> None:
    st = State()
    case = Case(req(resources=cpus.Resources(cpus=1)), plain(()), Rules(time_default=600),
                host={"topology": TOPOLOGY, "pending_ttl": 30})  # fmt: skip
    host = host_for(case)
    planned = plan(case.req, host, st)
    assert isinstance(planned, Plan)
    lease, token, old = record(st, case.req, planned, host)
    assert st.leases[lease.id] == lease and old is None
    assert (lease.gpus, lease.name) == (("GPU-0",), "job")
    assert (lease.owner, lease.owner_uid) == ("alice", 1001)
    assert (lease.cpus, lease.time_limit, lease.deadline) == ((0, 4), 600, NOW + 30)
    assert lease.phase is Phase.PENDING and lease.token_matches(token)


def full(st: State, owner: str) -> None:
    """Every GPU held; GPUs 0 and 1 by ``owner``'s bound container ``old``."""
    hold(st, "GPU-0", "GPU-1", owner=owner, container="old")
    hold(st, "GPU-2", "GPU-3")


def test_a_compose_predecessor_of_the_same_owner_lends_its_gpus() -> None:
    st = State()
    full(st, "alice")
    old_id = st.lease_of("old").id  # type: ignore[union-attr]
    host = host_for(Case(req(), plain(())))
    got = plan(req(one(2)), host, st, predecessor=("old", "old_name"))
    assert got == Plan(("GPU-0", "GPU-1"), None, None, predecessor=(old_id, "old_name"))
    lease, _, old = record(st, req(one(2)), got, host)
    assert old is not None and old.id == old_id
    assert st.leases[old_id].handed_to == lease.id


def test_someone_elses_predecessor_lends_nothing() -> None:
    st = State()
    full(st, "bob")
    host = host_for(Case(req(), plain(())))
    assert isinstance(plan(req(one(2)), host, st, predecessor=("old", "x")), Shortage)
    assert plan(req(one(0, "GPU-0")), host_for(Case(req(), plain(()))), State(),
                predecessor=("gone", "x")) == Refusal(
        "gpu-alloc: the predecessor is not this owner's bound lease"
    )  # fmt: skip


def test_a_stopped_holder_is_said_so() -> None:
    st = State()
    hold(st, "GPU-0", "GPU-1", "GPU-2", "GPU-3", container="c1")
    got = plan(req(), host_for(Case(req(), plain(()))), st, stopped={"c1": "Exited (0) 1 hour ago"})
    assert isinstance(got, Shortage)
    assert "Exited (0) 1 hour ago" in got.msg
