"""The lease life as plain data (allocator/core/leases/leases.py): State, Lease and Claim, with no
file."""

from __future__ import annotations

import json
from dataclasses import replace

from allocator.core.leases.leases import Claim, State

A, B, C, D = (f"GPU-{c * 8}" for c in "abcd")


def test_a_new_lease_is_pending_on_its_gpus_until_its_deadline() -> None:
    st = State()
    lease, token = st.new_lease((A, B), now=100.0, ttl=30.0)
    assert st.leases == {lease.id: lease}
    assert (lease.gpus, lease.state, lease.container) == ((A, B), "pending", None)
    assert (lease.created, lease.deadline) == (100.0, 130.0)
    assert lease.token_matches(token)
    assert not lease.token_matches(token + "x")


def test_each_lease_gets_its_own_id_and_token() -> None:
    st = State()
    (l1, t1), (l2, t2) = st.new_lease((A,), 0, 1), st.new_lease((B,), 0, 1)
    assert l1.id != l2.id and t1 != t2
    assert not l1.token_matches(t2)


def test_the_full_lease_life_pending_bound_released() -> None:
    st = State()
    lease, token = st.new_lease((A, B), now=0, ttl=60)
    assert st.admits(lease.id, token, frozenset({B, A})) is None
    assert st.leases[lease.id].state == "pending"  # admitting writes nothing
    assert st.bind(lease.id, "c0ffee" * 10, name="train")
    bound = st.leases[lease.id]
    assert (bound.state, bound.container, bound.name) == ("bound", "c0ffee" * 10, "train")
    assert st.lease_of("c0ffee" * 10) == bound
    assert st.release(lease.id) == bound
    assert st.leases == {}
    assert st.release(lease.id) is None
    assert st.lease_of("c0ffee" * 10) is None


def test_a_bound_lease_admits_no_more_creates() -> None:
    st = State()
    lease, token = st.new_lease((A,), 0, 60)
    assert st.bind(lease.id, "c" * 64)
    why = st.admits(lease.id, token, frozenset({A}))
    assert why is not None and "admitted its create already" in why and "bound" in why


def test_bind_refuses_a_second_container_and_unknown_leases() -> None:
    st = State()
    lease, _ = st.new_lease((A,), 0, 60)
    assert st.bind(lease.id, "one")
    assert st.bind(lease.id, "one")  # the same answer twice is fine
    assert not st.bind(lease.id, "two")
    assert st.leases[lease.id].container == "one"
    assert not st.bind("missing", "one")


def test_holders_names_leases_and_claims_and_an_unpinned_claim_holds_every_gpu() -> None:
    st = State()
    pending, _ = st.new_lease((A,), 0, 60)
    bound, _ = st.new_lease((B,), 0, 60)
    st.bind(bound.id, "b" * 64, name="web")
    st.claims["c" * 64] = Claim("c" * 64, "legacy", None, "privileged")
    held = st.holders(frozenset({A, B, C, D}))
    assert set(held) == {A, B, C, D}
    assert pending.id in held[A].describe() and "pending" in held[A].describe()
    assert "b" * 12 in held[B].describe() and "'web'" in held[B].describe()
    assert held[C] == held[D] and "c" * 12 in held[C].describe()
    assert "privileged" in held[C].describe()


def test_a_state_file_from_before_cpu_leases_still_loads() -> None:
    old = {"id": "x", "gpus": [A], "token_sha256": "", "state": "bound", "container": "c" * 64}
    lease = State.from_json({"version": 1, "leases": {"x": old}, "claims": {}}, "f").leases["x"]
    assert (lease.cpus, lease.mems, lease.memory) == ((), (), 0)


def test_leased_cpus_and_memory_round_trip_and_count_only_live_leases() -> None:
    st = State()
    a, _ = st.new_lease((A,), 0, 60)
    st.leases[a.id] = replace(a, cpus=(0, 16), mems=(0,), memory=1 << 30)
    again = State.from_json(json.loads(json.dumps(st.to_json())), "f")
    assert again.leases[a.id].cpus == (0, 16) and again.leases[a.id].mems == (0,)
    assert (again.leased_cpus(), again.leased_memory()) == ({0, 16}, {0: 1 << 30})
    assert (again.leased_cpus(but=a.id), again.leased_memory(but=a.id)) == (set(), {})
