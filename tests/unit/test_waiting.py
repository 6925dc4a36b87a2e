"""Waiting in line: `Lineup.serve_waiters` and `shim.waitline` against a FakeEngine.

The order itself is pinned in test_queue.py; here the service grants the queue
under the ledger lock with the same placement and limits as a create arriving
now, and the shim's futures leave nothing behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from allocator.core.api import labels
from allocator.core.judging.ask import Ask
from allocator.core.leases import outcomes
from allocator.core.leases.leases import Phase
from allocator.core.placement import Shortage
from allocator.core.rules import policy
from allocator.core.rules.policy import Invalid, Owner, Refusal, Wanted
from allocator.core.rules.queue import Waiter
from allocator.host import config as configmod
from allocator.ops import status
from allocator.service.placer import LeaseRequest
from allocator.service.views import explain
from allocator.service.wiring import Allocator
from shim import create as shim_create
from shim import server
from shim.framing import Request, Response
from shim.waitline import Gone, Stopping, Waitline
from tests.support import engine as sim
from tests.support.fake_engine import FakeEngine

GPUS = 4
ALICE = Owner(1001, "alice", ("staff",))
BOB = Owner(1002, "bob", ("staff",))
CAROL = Owner(1003, "carol", ("vip",))


def one(n: int = 1) -> Ask:
    return Ask(required=(), count=n, every=False, caps=("gpu",))


def make(tmp_path: Path, fake: FakeEngine, **policy_: Any) -> Allocator:
    gpus = sim.write_sim_gpus(tmp_path / "gpus.yaml", GPUS)
    cfg = {"state_dir": str(tmp_path / "state"), "gpus": str(gpus),
           "engine": {"socket": str(tmp_path / "none.sock")},
           "policy": {"pending_ttl": 300, **policy_}}  # fmt: skip
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    return Allocator(configmod.load(str(tmp_path / "config.yaml")), fake)  # type: ignore[arg-type]


@pytest.fixture
def fake() -> FakeEngine:
    return FakeEngine()


def hold(alloc: Allocator, fake: FakeEngine, owner: Owner, n: int = 1) -> str:
    """A running container of ``owner`` with ``n`` leased GPUs; its container id."""
    got = alloc.book.lease(LeaseRequest(one(n), f"held-{owner.user}", owner=owner))
    assert isinstance(got, tuple), got
    lease, token = got
    cid = fake.add(lease.name, gpus=lease.gpus, lease=labels.lease_label(lease.id))
    alloc.book.settle(outcomes.Bind(lease.id, cid, token))
    return cid


def free(alloc: Allocator, fake: FakeEngine, cid: str) -> None:
    """``docker rm -f``: the container goes and the plugin's AuthZRes ends its lease."""
    fake.remove(cid)
    alloc.book.settle(outcomes.Forget(cid))


def waiter(owner: Owner, arrived: int, n: int = 1, priority: int = 0, **want: Any) -> Waiter:
    req = LeaseRequest(one(n), f"w{arrived}", owner, Wanted(**want))
    return Waiter(f"w{arrived}", owner.user, priority, arrived, n, req)


def live_gpus(alloc: Allocator) -> list[str]:
    return [g for le in alloc.ledger.read().leases.values() for g in le.gpus]


# ------------------------------------------------------------- serve_waiters


def test_waiters_are_granted_by_priority_then_fair_share_then_arrival(tmp_path, fake) -> None:
    alloc = make(tmp_path, fake)
    held = [hold(alloc, fake, ALICE), hold(alloc, fake, ALICE), hold(alloc, fake, BOB)]
    held.append(hold(alloc, fake, BOB))
    a = waiter(ALICE, 1)  # first to arrive
    b = waiter(BOB, 2)
    c = waiter(CAROL, 3, priority=10)  # highest priority: first despite arriving last
    assert alloc.line.serve_waiters([a, b, c]) == []  # every GPU held: all wait
    order = []
    for cid in held[:3]:
        free(alloc, fake, cid)
        order += [
            w.id for w, _ in alloc.line.serve_waiters([w for w in (a, b, c) if w.id not in order])
        ]
    # After carol: alice holds 1 (one of hers was freed), bob 2: alice goes before bob.
    assert order == ["w3", "w1", "w2"]


def test_no_gpu_is_granted_twice_in_one_serving(tmp_path, fake) -> None:
    alloc = make(tmp_path, fake)
    granted = alloc.line.serve_waiters([waiter(ALICE, i) for i in range(6)])
    assert len(granted) == GPUS
    gpus = live_gpus(alloc)
    assert len(gpus) == len(set(gpus)) == GPUS
    leases = alloc.ledger.read().leases
    assert all(leases[got[0].id].phase is Phase.PENDING for _, got in granted)


def test_a_larger_waiter_ahead_keeps_the_gpus_it_could_use(tmp_path, fake) -> None:
    alloc = make(tmp_path, fake)
    cids = [hold(alloc, fake, BOB) for _ in range(GPUS)]
    free(alloc, fake, cids[0])
    big, small = waiter(ALICE, 1, n=2), waiter(CAROL, 2, n=1)
    assert alloc.line.serve_waiters([big, small]) == []  # the free GPU waits for alice's pair
    free(alloc, fake, cids[1])
    assert [w.id for w, _ in alloc.line.serve_waiters([big, small])] == ["w1"]


def named(index: int) -> Ask:
    """``--gpus device=INDEX``, as the shim resolves it: that GPU by UUID."""
    return Ask(required=(sim.sim_gpu_uuid(index),), count=0, every=False, caps=("gpu",))


def every() -> Ask:
    return Ask(required=(), count=0, every=True, caps=("gpu",))


def test_a_create_behind_the_line_may_not_take_what_a_waiter_keeps(tmp_path, fake) -> None:
    alloc = make(tmp_path, fake)
    cids = [hold(alloc, fake, BOB) for _ in range(GPUS)]
    free(alloc, fake, cids[0])
    (spare,) = set(sim.sim_gpu_uuid(i) for i in range(GPUS)) - set(live_gpus(alloc))
    big = waiter(ALICE, 1, n=2)
    alloc.line.waiting = lambda: [big]
    for ask in (one(1), named(sim_index(spare))):  # --gpus 1, and --gpus device=N
        got = alloc.book.lease(LeaseRequest(ask, "late", owner=CAROL))
        assert isinstance(got, Shortage), got
        assert "kept for alice's create 'w1' waiting in line for 2 GPUs" in got.msg
        assert "wait in line too (--label io.gpu-alloc.wait=30m" in got.msg
    assert spare not in live_gpus(alloc)
    free(alloc, fake, cids[1])
    ((w, (lease, _)),) = alloc.line.serve_waiters([big])  # the waiter does get them
    assert w is big and spare in lease.gpus and len(lease.gpus) == 2


def test_a_stream_of_small_creates_never_starves_a_waiter_for_every_gpu(tmp_path, fake) -> None:
    alloc = make(tmp_path, fake)
    cid = hold(alloc, fake, BOB)
    whole = Waiter("w1", "alice", 0, 1, 0, LeaseRequest(every(), "all", ALICE, Wanted()))
    alloc.line.waiting = lambda: [whole]
    for _ in range(GPUS):
        got = alloc.book.lease(LeaseRequest(one(1), "small", owner=CAROL))
        assert isinstance(got, Shortage) and "waiting in line for all GPUs" in got.msg, got
    free(alloc, fake, cid)
    ((_, (lease, _)),) = alloc.line.serve_waiters([whole])
    assert len(lease.gpus) == GPUS


def test_a_waiter_that_fits_now_keeps_only_what_it_will_be_given(tmp_path, fake) -> None:
    """It is served at the queue's next wake-up; the rest stays free for anyone."""
    alloc = make(tmp_path, fake)
    hold(alloc, fake, BOB, 2)
    first = waiter(ALICE, 1, n=1)
    alloc.line.waiting = lambda: [first]
    got = alloc.book.lease(LeaseRequest(one(1), "late", owner=CAROL))
    assert isinstance(got, tuple), got
    ((_, (lease, _)),) = alloc.line.serve_waiters([first])
    assert not set(lease.gpus) & set(got[0].gpus)


def test_a_create_ahead_of_the_waiters_takes_what_it_likes(tmp_path, fake) -> None:
    """Higher priority (or fewer GPUs held) places a create before the waiters: it
    delays nobody ahead of it."""
    alloc = make(tmp_path, fake, priority={"users": {"carol": 10}})
    cids = [hold(alloc, fake, BOB) for _ in range(GPUS)]
    free(alloc, fake, cids[0])
    big = waiter(ALICE, 1, n=2)
    alloc.line.waiting = lambda: [big]
    assert isinstance(alloc.book.lease(LeaseRequest(one(1), "vip", owner=CAROL)), tuple)


def sim_index(uuid: str) -> int:
    return next(i for i in range(GPUS) if sim.sim_gpu_uuid(i) == uuid)


def test_a_waiter_at_its_limit_waits_without_blocking_others(tmp_path, fake) -> None:
    alloc = make(tmp_path, fake, limits={"users": {"alice": {"gpus": 1}}})
    hold(alloc, fake, ALICE)
    limited, other = waiter(ALICE, 1), waiter(BOB, 2)
    granted = alloc.line.serve_waiters([limited, other])
    assert [w.id for w, _ in granted] == ["w2"]


def test_a_waiter_is_served_only_through_the_time_limit_a_create_now_gets(tmp_path, fake) -> None:
    """The line's grants go through the same checks as a create arriving now
    (`core.grant_plan.plan`): a waiter asking more time than the policy gives is never granted."""
    alloc = make(tmp_path, fake, time_limit={"default": "1h"})
    long, short = waiter(ALICE, 1, time=7200.0), waiter(BOB, 2, time=600.0)
    assert isinstance(alloc.book.lease(long.ask), Refusal | Invalid)  # as a create now
    granted = alloc.line.serve_waiters([long, short])
    assert [w.id for w, _ in granted] == ["w2"]
    assert [le.owner for le in alloc.ledger.read().leases.values()] == ["bob"]


def test_a_waiter_whose_pool_has_room_is_served_past_a_short_head(tmp_path, fake) -> None:
    pools = {"a": {"gpus": [0, 1]}, "b": {"gpus": [2, 3]}}
    alloc = make(tmp_path, fake, pools=pools)
    for _ in range(2):
        got = alloc.book.lease(LeaseRequest(one(), "x", owner=BOB, want=Wanted(pool="a")))
        assert isinstance(got, tuple)
    head, other = waiter(ALICE, 1, pool="a"), waiter(CAROL, 2, pool="b")
    assert [w.id for w, _ in alloc.line.serve_waiters([head, other])] == ["w2"]


def test_more_gpus_than_the_host_has_cannot_wait(tmp_path, fake) -> None:
    alloc = make(tmp_path, fake)
    got = alloc.book.lease(LeaseRequest(one(GPUS + 1), "huge", owner=ALICE))
    assert isinstance(got, Shortage) and not got.waitable and "has only 4" in got.msg
    hold(alloc, fake, BOB, GPUS)
    short = alloc.book.lease(LeaseRequest(one(), "small", owner=ALICE))
    assert isinstance(short, Shortage) and short.waitable


def test_only_a_limit_that_can_pass_is_worth_waiting_for(tmp_path, fake) -> None:
    alloc = make(tmp_path, fake, limits={"default": {"gpus": 2}})
    hold(alloc, fake, ALICE, 2)
    now = alloc.book.lease(LeaseRequest(one(), "next", owner=ALICE))
    never = alloc.book.lease(LeaseRequest(one(3), "too-big", owner=BOB))
    assert isinstance(now, Refusal) and now.waitable
    assert isinstance(never, Refusal) and not never.waitable


def test_wait_comes_from_the_label_or_the_default_and_is_capped() -> None:
    rules = policy.Rules(wait_default=60.0, wait_max=600.0)
    assert policy.wait_of({policy.WAIT: "2m"}, rules) == 120.0
    assert policy.wait_of({}, rules) == 60.0
    assert policy.wait_of({policy.WAIT: "5h"}, rules) == 600.0
    assert policy.wait_of({}, policy.Rules()) == 0.0
    assert isinstance(policy.wait_of({policy.WAIT: "soon"}, rules), policy.Invalid)


def test_priority_is_the_highest_of_user_and_groups() -> None:
    rules = policy.Rules(user_priorities={"alice": 3}, group_priorities={"staff": 5})
    assert policy.priority_of(ALICE, rules) == 5
    assert policy.priority_of(CAROL, rules) == 0


def test_config_checks_priority_and_wait_keys() -> None:
    cfg = configmod.parse(
        "policy:\n  priority: {users: {alice: 2}, groups: {ml: -1}}\n"
        "  wait: {default: 5m, max: 2h}\n"
    )
    rules = cfg.policy.rules
    assert (rules.user_priorities, rules.group_priorities) == ({"alice": 2}, {"ml": -1})
    assert (rules.wait_default, rules.wait_max) == (300.0, 7200.0)
    with pytest.raises(configmod.ConfigError, match=r"policy\.priority\.users\.alice"):
        configmod.parse("policy:\n  priority: {users: {alice: high}}\n")
    with pytest.raises(configmod.ConfigError, match=r"policy\.wait\.soon"):
        configmod.parse("policy:\n  wait: {soon: 1m}\n")


# ------------------------------------------------------------------ waitline


def request_of(owner: Owner, n: int = 1) -> LeaseRequest:
    return LeaseRequest(one(n), f"job-{owner.user}", owner, Wanted())


def test_a_waiter_is_granted_when_a_lease_ends_and_one_that_leaves_leaks_nothing(
    tmp_path, fake
) -> None:
    alloc = make(tmp_path, fake)
    cids = [hold(alloc, fake, BOB) for _ in range(GPUS)]

    async def main() -> None:
        line = Waitline(alloc)
        gone = asyncio.Event()
        leaving = asyncio.create_task(line.wait(request_of(CAROL), 30, gone))
        staying = asyncio.create_task(line.wait(request_of(ALICE), 30))
        timing_out = asyncio.create_task(line.wait(request_of(ALICE), 0.3))
        await asyncio.sleep(0.1)
        assert [r["owner"] for r in line.snapshot()] == ["carol", "alice", "alice"]
        gone.set()
        with pytest.raises(Gone):
            await leaving
        assert await timing_out is None
        await asyncio.to_thread(free, alloc, fake, cids[0])
        lease, _ = await asyncio.wait_for(staying, 2)
        assert lease.owner == "alice" and line.snapshot() == []
        line.stop()

    asyncio.run(main())
    leases = alloc.ledger.read().leases.values()
    assert sorted(le.owner for le in leases) == ["alice", "bob", "bob", "bob"]


def test_a_stopping_shim_answers_its_waiters(tmp_path, fake) -> None:
    alloc = make(tmp_path, fake)
    hold(alloc, fake, BOB, GPUS)

    async def main() -> None:
        line = Waitline(alloc)
        task = asyncio.create_task(line.wait(request_of(ALICE), 30))
        await asyncio.sleep(0.05)
        line.stop()
        with pytest.raises(Stopping, match="stopping"):
            await task

    asyncio.run(main())


def test_many_waiters_random_releases_and_cancels_keep_the_invariants(tmp_path, fake) -> None:
    """No GPU in two live leases; each waiter granted, timed out or gone; nothing leaked."""
    alloc = make(tmp_path, fake)
    rng = random.Random(15)
    cids = [hold(alloc, fake, BOB) for _ in range(GPUS)]
    owners = [ALICE, BOB, CAROL]
    ended: dict[str, str] = {}

    async def main() -> None:
        line = Waitline(alloc, poll=0.02)

        async def one_waiter(i: int) -> None:
            gone = asyncio.Event()
            if rng.random() < 0.3:
                asyncio.get_running_loop().call_later(rng.uniform(0, 0.5), gone.set)
            try:
                got = await line.wait(request_of(owners[i % 3], rng.choice((1, 1, 2))), 3, gone)
            except Gone:
                ended[f"w{i}"] = "gone"
                return
            if got is None:
                ended[f"w{i}"] = "timed out"
                return
            lease, token = got
            ended[f"w{i}"] = "granted"
            await asyncio.sleep(rng.uniform(0, 0.05))
            cid = fake.add(lease.name, gpus=lease.gpus, lease=labels.lease_label(lease.id))
            await asyncio.to_thread(alloc.book.settle, outcomes.Bind(lease.id, cid, token))
            cids.append(cid)

        async def releaser() -> None:
            for _ in range(40):
                await asyncio.sleep(0.03)
                gpus = live_gpus(alloc)
                assert len(gpus) == len(set(gpus)), "a GPU in two live leases"
                if cids:
                    await asyncio.to_thread(free, alloc, fake, cids.pop(rng.randrange(len(cids))))

        await asyncio.gather(releaser(), *(one_waiter(i) for i in range(24)))
        assert line.snapshot() == []
        line.stop()

    asyncio.run(main())
    assert len(ended) == 24
    assert {"granted", "gone"} <= set(ended.values()), ended
    state = alloc.ledger.read()
    gpus = live_gpus(alloc)
    assert len(gpus) == len(set(gpus))
    bound = {le.container for le in state.leases.values()}
    assert all(le.phase is Phase.BOUND for le in state.leases.values()), "a leaked pending lease"
    assert bound == set(cids)


# ------------------------------------------------------------ seen: explain, status


def test_explain_says_a_request_would_wait(tmp_path, fake) -> None:
    alloc = make(tmp_path, fake)
    hold(alloc, fake, BOB, GPUS)
    waits = explain.explain(alloc, None, "1", [f"{policy.WAIT}=2m"])
    assert (waits["verdict"], waits["wait_s"]) == ("waits", 120.0)
    assert waits["message"].startswith("would wait in line up to 2m")
    assert explain.explain(alloc, None, "1", [])["verdict"] == "short"
    assert explain.explain(alloc, None, "5", [f"{policy.WAIT}=2m"])["verdict"] == "short"


def test_explain_counts_the_gpus_the_line_keeps(tmp_path, fake) -> None:
    alloc = make(tmp_path, fake)
    cids = [hold(alloc, fake, BOB) for _ in range(GPUS)]
    free(alloc, fake, cids[0])
    assert isinstance(alloc.book.explain(one(1), CAROL, Wanted()), tuple)
    alloc.line.waiting = lambda: [waiter(ALICE, 1, n=2)]
    answer = alloc.book.explain(one(1), CAROL, Wanted())
    assert isinstance(answer, Shortage) and "kept for alice's create" in answer.msg


def test_the_queue_says_whom_their_own_limit_holds_back(tmp_path, fake) -> None:
    alloc = make(tmp_path, fake, limits={"users": {"alice": {"gpus": 1}}})
    hold(alloc, fake, ALICE)  # alice at her limit, three GPUs free

    async def main() -> list[dict]:
        line = Waitline(alloc)
        waiting = asyncio.create_task(line.wait(request_of(ALICE), 30))
        await asyncio.sleep(0.1)
        rows = line.snapshot()
        line.stop()
        with contextlib.suppress(Exception):
            await waiting
        return rows

    (row,) = asyncio.run(main())
    assert row["held_back_by"] == "policy.limits.users.alice: alice holds 1 of 1"
    table = status.render_table({"holders": [], "gpus": [], "free": 3, "total": 4, "queue": [row]})
    assert "held back by their limit (policy.limits.users.alice: alice holds 1 of 1)" in table


def test_status_lists_the_queue_in_order_and_says_when_the_shim_is_silent() -> None:
    row = {"position": 1, "owner": "carol", "name": "train", "gpus": 2, "all": False,
           "pool": None, "priority": 10, "since": 1.8e9, "waited_s": 75}  # fmt: skip
    snap = {"holders": [], "gpus": [], "free": 0, "total": 0}
    table = status.render_table(snap | {"queue": [row]})
    assert "waiting for GPUs: 1" in table
    assert (
        "1. carol 'train': 2 GPUs, priority 10, waiting 1m (since 2027-01-15T08:00:00Z); "
        "waiting for free GPUs" in table
    )
    assert "queue: unknown" in status.render_table(snap | {"queue": None})
    assert "queue" not in status.render_table(snap)


def test_a_stopping_shim_server_sends_its_waiters_a_503(tmp_path, fake) -> None:
    alloc = make(tmp_path, fake)
    hold(alloc, fake, BOB, GPUS)
    line = Waitline(alloc)

    class Waiting:
        def wants(self, method: str, target: str) -> bool:
            return True

        async def handle(self, request: Request, forward: Any) -> Response:
            try:
                await line.wait(request_of(ALICE), 30)
            except Stopping as e:
                return shim_create.error(503, str(e))
            return shim_create.error(500, "granted?")

        def stop(self) -> None:
            line.stop()

    sock = str(tmp_path / "shim.sock")

    async def main() -> bytes:
        served = asyncio.create_task(server.serve(sock, str(tmp_path / "none"), Waiting()))
        while not os.path.exists(sock):
            await asyncio.sleep(0.01)
        reader, writer = await asyncio.open_unix_connection(sock)
        writer.write(b"POST /containers/create HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        while not line.snapshot():
            await asyncio.sleep(0.01)
        served.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await served
        return await reader.read()

    answer = asyncio.run(main())
    assert answer.startswith(b"HTTP/1.1 503") and b"gpu-alloc shim is stopping" in answer


def test_a_removal_the_plugin_never_saw_does_not_count_against_the_limit(tmp_path, fake) -> None:
    """``docker run --rm`` twice at a limit of 1: the first container went without any
    API call (the daemon removed it), so the second create reconciles before refusing."""
    alloc = make(tmp_path, fake, limits={"default": {"gpus": 1}}, exempt=[])
    first = hold(alloc, fake, ALICE)
    fake.remove(first)  # --rm: no DELETE passes the plugin
    second = alloc.book.lease(LeaseRequest(one(), "again", owner=ALICE))
    assert isinstance(second, tuple), second
    assert [le.name for le in alloc.ledger.read().leases.values()] == ["again"]
