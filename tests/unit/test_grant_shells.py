"""One grant, whoever asks: a create arriving now, a waiter served from the line and
``gpu-alloc explain`` get the same answer from the same host, because each is a shell
around the one plan (allocator/core/grant_plan.py).  The plugin decides no grant: it
admits the create whose token matches the pending lease, so it has no shell here.

Each case builds the same host three times (the policy and the GPUs held), and asks it
through each shell: the grant (GPUs, pool, time limit) or the refusal (its kind and words)
must be the same, and a waiter is granted exactly when a create now would be.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from allocator.core.api import labels
from allocator.core.judging.ask import Ask
from allocator.core.leases import outcomes
from allocator.core.placement import Shortage
from allocator.core.rules.policy import Invalid, Owner, Refusal, Wanted, wanted
from allocator.core.rules.queue import Waiter
from allocator.host import config as configmod
from allocator.service.placer import LeaseRequest
from allocator.service.views import explain
from allocator.service.wiring import Allocator
from tests.support import engine as sim
from tests.support.fake_engine import FakeEngine
from tests.support.sysfs import two_socket

ALICE = Owner(1001, "alice", ("staff",))
BOB = Owner(1002, "bob", ("ml",))
KIND = {explain.SHORT: Shortage, explain.REFUSED: Refusal, explain.INVALID: Invalid}


def one(n: int = 1) -> Ask:
    return Ask(required=(), count=n, every=False, caps=("gpu",))


CASES: dict[str, tuple[dict[str, Any], list[tuple[Owner, int]], Owner, int, dict[str, str]]] = {
    # policy, GPUs held (owner, how many), who asks, how many, the create's labels
    "granted on an empty host": ({}, [], ALICE, 2, {}),
    "granted around what is held": ({}, [(BOB, 3)], ALICE, 1, {}),
    "granted in the pool its label names": (
        {"pools": {"a": {"gpus": [0, 1]}, "b": {"gpus": [2, 3]}}}, [], BOB, 1,
        {labels.POOL: "b"},
    ),
    "granted with the policy's time limit": ({"time_limit": {"default": "1h"}}, [], ALICE, 1, {}),
    "granted with the shorter time it asks": (
        {"time_limit": {"default": "1h"}}, [], ALICE, 1, {labels.TIME: "10m"},
    ),
    "refused more time than the policy gives": (
        {"time_limit": {"default": "1h"}}, [], ALICE, 1, {labels.TIME: "2h"},
    ),
    "refused the pool's time limit": (
        {"pools": {"b": {"gpus": [2, 3]}}, "time_limit": {"pools": {"b": "30m"}}}, [], ALICE, 1,
        {labels.POOL: "b", labels.TIME: "1h"},
    ),
    "refused past the owner's limit": (
        {"limits": {"users": {"alice": {"gpus": 2}}}}, [(ALICE, 2)], ALICE, 1, {},
    ),
    "refused a pool not open to the owner": (
        {"pools": {"b": {"gpus": [2, 3], "users": ["bob"]}}}, [], ALICE, 1, {labels.POOL: "b"},
    ),
    "short of GPUs": ({}, [(BOB, 3)], ALICE, 2, {}),
    "granted cores near its GPUs": ({}, [], ALICE, 1, {labels.REQUEST_CPUS: "4"}),
    "short of cores": ({}, [], ALICE, 1, {labels.REQUEST_CPUS: "17"}),
}  # fmt: skip


def make(tmp_path: Path, fake: FakeEngine, policy: dict[str, Any]) -> Allocator:
    tmp_path.mkdir()
    gpus = sim.write_sim_gpus(tmp_path / "gpus.yaml", 4)
    cfg = {"state_dir": str(tmp_path / "state"), "gpus": str(gpus),
           "sysfs": str(two_socket(tmp_path / "sys")),
           "engine": {"socket": str(tmp_path / "none.sock")},
           "policy": {"pending_ttl": 300, "placement": "first-fit", **policy}}  # fmt: skip
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    return Allocator(configmod.load(str(tmp_path / "config.yaml")), fake)  # type: ignore[arg-type]


def host(tmp_path: Path, policy: dict[str, Any], held: list[tuple[Owner, int]]) -> Allocator:
    """The case's host: its policy, and each holder's running container."""
    fake = FakeEngine()
    alloc = make(tmp_path, fake, policy)
    for i, (owner, n) in enumerate(held):
        got = alloc.book.lease(LeaseRequest(one(n), f"held{i}", owner))
        assert isinstance(got, tuple), got
        lease, token = got
        cid = fake.add(lease.name, gpus=lease.gpus, lease=labels.lease_label(lease.id))
        alloc.book.settle(outcomes.Bind(lease.id, cid, token))
    return alloc


def request(who: Owner, n: int, given: dict[str, str]) -> LeaseRequest:
    want = wanted(given)
    assert isinstance(want, Wanted)
    resources = labels.resources(given)
    assert not isinstance(resources, str)
    return LeaseRequest(one(n), "job", who, want, resources, given)


def answer(got: Any) -> tuple[Any, ...]:
    """A create's answer as the shells are compared: the grant, or the refusal."""
    if isinstance(got, tuple):
        return ("granted", got[0].gpus, got[0].pool, got[0].time_limit)
    return (type(got), same(got.msg))


def same(msg: str) -> str:
    """Words the same on every host built alike: lease ids and seconds held are not."""
    return re.sub(r"for \d+s", "for Ns", re.sub(r"lease [0-9a-f]{16}", "lease L", msg))


@pytest.mark.parametrize("name", CASES)
def test_a_create_now_a_waiter_and_explain_get_the_same_answer(tmp_path: Path, name) -> None:
    policy, held, who, n, given = CASES[name]
    req = request(who, n, given)

    now = answer(host(tmp_path / "now", policy, held).book.lease(req))

    line = host(tmp_path / "line", policy, held)
    served = line.line.serve_waiters([Waiter("w1", who.user, 0, 1, n, req)])
    waiter = answer(served[0][1]) if served else None

    said = explain.explain(
        host(tmp_path / "explain", policy, held),
        None,
        str(n),
        [f"{k}={v}" for k, v in given.items()],
        who,
    )
    if said["code"] == explain.FITS:
        gpus = tuple(g["uuid"] for g in said["gpus"])
        told: tuple[Any, ...] = ("granted", gpus, said["pool"], said["time_limit_s"])
    else:
        told = (KIND[said["code"]], same(said["message"]))

    assert (now[0] == "granted") == name.startswith("granted"), now
    assert told == now
    if now[0] == "granted":
        assert waiter == now
    else:
        assert waiter is None  # never served past what a create now is refused
        assert [le.name for le in line.ledger.read().leases.values()] == [
            f"held{i}" for i in range(len(held))
        ]
