"""allocator.core.timing.reclaim: which running GPU containers sat idle long enough to stop."""

from __future__ import annotations

from dataclasses import replace

from allocator.core.leases.clock import Now
from allocator.core.leases.leases import Lease, Phase
from allocator.core.rules.policy import Rules
from allocator.core.timing import checkpoint, reclaim

RULES = Rules(exempt=("root",), reclaim_idle_after=100.0)
READ = {"GPU-0", "GPU-1", "GPU-2"}


def lease(lid: str, gpus: tuple[str, ...], owner: str = "alice", created: float = 0) -> Lease:
    return Lease(lid, gpus, "", Phase.BOUND.value, f"c-{lid}", created=created, owner=owner)


def idle(leases, now, *, active=(), seen=None, started=None, rules=RULES, read=READ):
    """The leases stopped at ``now``: those `reclaim.idle` finds (with wall times alone:
    the clock tests are in test_clock.py), as `checkpoint.before_reclaim` stops them."""
    starts = {c: Now(t) for c, t in (started or {}).items()}
    running = {le.container: starts.get(le.container) for le in leases}
    used = {u: Now(t) for u, t in (seen or {}).items()}
    found = reclaim.idle(leases, running, read, set(active), used, Now(now), rules)
    return checkpoint.before_reclaim(found, Now(now), rules.reclaim_idle_after)[1]


def test_a_container_whose_gpus_ran_nothing_that_long_is_reclaimed():
    a = lease("a", ("GPU-0",))
    assert idle([a], 99) == []
    assert idle([a], 100) == [a]


def test_idle_counts_from_the_last_use_and_the_last_start():
    a = lease("a", ("GPU-0",))
    assert idle([a], 150, seen={"GPU-0": 60}) == []
    assert idle([a], 160, seen={"GPU-0": 60}) == [a]
    assert idle([a], 160, started={"c-a": 100}) == []  # restarted at 100: idle 60 s only


def test_a_gpu_in_use_or_unread_keeps_the_whole_lease_running():
    both = lease("b", ("GPU-0", "GPU-1"))
    assert idle([both], 500, active={"GPU-1"}) == []
    assert idle([lease("u", ("GPU-9",))], 500) == []  # no reading for it: not known idle
    assert idle([both], 500) == [both]


def test_the_exempt_a_stopped_container_and_a_policy_without_reclaim_are_left_alone():
    mine = lease("r", ("GPU-0",), owner="root")
    assert idle([mine], 500) == []
    a = lease("a", ("GPU-1",))
    assert reclaim.idle([a], {}, READ, set(), {}, Now(500), RULES) == []  # not running
    assert idle([a], 500, rules=Rules()) == []


def test_the_reason_names_the_rule_and_what_happens_to_the_lease():
    why = reclaim.reason(7200)
    assert "2h (policy.reclaim_idle_after)" in why and "release_stopped_after" in why


def test_without_a_signal_a_container_is_found_at_80_percent_for_its_owners_warning():
    a = lease("a", ("GPU-0",))
    assert reclaim.idle([a], {"c-a": None}, READ, set(), {}, Now(79), RULES) == []
    assert reclaim.idle([a], {"c-a": None}, READ, set(), {}, Now(80), RULES) == [(a, 80)]


def test_a_container_with_a_checkpoint_signal_is_found_its_lead_earlier_with_how_long():
    a = replace(lease("a", ("GPU-0",)), signal="SIGUSR1", signal_lead=30.0)
    assert idle([a], 69) == []
    used = {"GPU-0": Now(10)}
    assert reclaim.idle([a], {"c-a": None}, READ, set(), used, Now(80), RULES) == [(a, 70)]
