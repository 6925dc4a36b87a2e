"""allocator.core.timing.timelimits: which limit applies, the label's ask, which containers are
past theirs; and the policy.time_limit keys of the config."""

from __future__ import annotations

import json

import pytest

from allocator.core.leases.leases import Lease, Phase, State, lease_from_json
from allocator.core.rules import policy
from allocator.core.rules.policy import Invalid, Owner, Rules
from allocator.core.timing import timelimits
from allocator.core.timing.clock import Now
from allocator.host.config import ConfigError, parse

LAB = """
policy:
  pools:
    training: {gpus: [0, 1]}
    interactive: {gpus: [2, 3]}
  time_limit:
    default: 24h
    pools: {interactive: 2h}
    users: {alice: 3d}
    groups: {students: 6h, staff: 2d}
  reclaim_idle_after: 30m
"""
RULES = parse(LAB, "lab.yaml").policy.rules
ALICE = Owner(1000, "alice", ("alice", "students"))
BOB = Owner(1001, "bob", ("bob", "students", "staff"))
CAROL = Owner(1002, "carol", ("carol",))
ROOT = Owner(0, "root", ("root",))
H = 3600.0


def test_the_config_keys_are_read_as_seconds():
    assert RULES.time_default == 24 * H
    assert RULES.time_pools == {"interactive": 2 * H}
    assert RULES.time_users == {"alice": 3 * 86400}
    assert RULES.time_groups == {"students": 6 * H, "staff": 2 * 86400}
    assert RULES.reclaim_idle_after == 1800
    assert parse("policy: {}", "x").policy.rules.reclaim_idle_after is None


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("policy: {time_limit: {default: soon}}", "policy.time_limit.default"),
        ("policy: {time_limit: {users: {alice: 0}}}", "policy.time_limit.users.alice"),
        ("policy: {time_limit: {user: {alice: 1h}}}", "policy.time_limit.user"),
        ("policy: {time_limit: {pools: {gone: 1h}}}", "policy.time_limit.pools.gone"),
        ("policy: {time_limit: {groups: {x: null}}}", "policy.time_limit.groups.x"),
        ("policy: {time_limit: 1h}", "policy.time_limit"),
        ("policy: {reclaim_idle_after: -5}", "policy.reclaim_idle_after"),
    ],
)
def test_a_bad_time_key_is_refused_naming_it(text, key):
    with pytest.raises(ConfigError, match=f"key '{key}'"):
        parse(text, "x.yaml")


def test_the_most_specific_limit_wins_user_then_group_then_pool_then_default():
    assert timelimits.policy_limit(RULES, ALICE, "interactive") == timelimits.Limit(
        3 * 86400, "policy.time_limit.users.alice"
    )
    # of several groups, the longest
    assert timelimits.policy_limit(RULES, BOB, "interactive") == timelimits.Limit(
        2 * 86400, "policy.time_limit.groups.staff"
    )
    assert timelimits.policy_limit(RULES, CAROL, "interactive") == timelimits.Limit(
        2 * H, "policy.time_limit.pools.interactive"
    )
    assert timelimits.policy_limit(RULES, CAROL, "training") == timelimits.Limit(
        24 * H, "policy.time_limit.default"
    )
    assert timelimits.policy_limit(RULES, CAROL, None).rule == "policy.time_limit.default"


def test_the_exempt_and_a_policy_without_limits_give_none():
    assert timelimits.policy_limit(RULES, ROOT, None) is None
    assert timelimits.policy_limit(Rules(), CAROL, None) is None
    assert timelimits.limit_for(Rules(), CAROL, None, {}) is None


def test_a_request_may_ask_for_less_but_more_is_refused_naming_the_rule():
    assert timelimits.effective(RULES, CAROL, "interactive", 1800) == 1800
    assert timelimits.effective(RULES, CAROL, "interactive", None) == 2 * H
    assert timelimits.refusal(RULES, CAROL, "interactive", 2 * H) is None
    refused = timelimits.refusal(RULES, CAROL, "interactive", 10 * H)
    assert isinstance(refused, Invalid)
    assert "asks for 10h" in refused.msg and "(policy.time_limit.pools.interactive)" in refused.msg
    assert "ask for 2h or less" in refused.msg
    assert timelimits.refusal(RULES, ROOT, None, 100 * H) is None  # exempt: any ask
    assert timelimits.effective(RULES, ROOT, None, 5.0) == 5.0  # and it is kept


def test_limit_for_reads_the_label_as_the_shim_does():
    assert timelimits.limit_for(RULES, CAROL, "interactive", {policy.TIME: "30m"}) == 1800
    assert timelimits.limit_for(RULES, CAROL, "interactive", {}) == 2 * H
    assert timelimits.limit_for(RULES, CAROL, "training", {policy.TIME: "soon"}) == 24 * H
    assert timelimits.limit_for(RULES, ROOT, None, {policy.TIME: "90"}) == 90


@pytest.mark.parametrize("raw", ["soon", "1w", "-5m", "0", "2 hours"])
def test_a_malformed_label_is_a_400_naming_it_and_the_accepted_forms(raw):
    got = policy.wanted({policy.TIME: raw})
    assert isinstance(got, Invalid)
    assert "label io.gpu-alloc.time" in got.msg
    assert "30m" in got.msg or "s, m, h or d" in got.msg


def test_the_label_is_known_and_read_into_the_request():
    from allocator.core.api import labels

    assert labels.unknown({policy.TIME: "6h"}) is None
    assert policy.wanted({policy.TIME: "6h"}) == policy.Wanted(time=6 * H)
    assert policy.wanted({}).time is None


def test_explain_says_which_limit_applies():
    assert timelimits.described(RULES, CAROL, "interactive", None) == (
        "its container may run 2h (policy.time_limit.pools.interactive)"
    )
    assert "(label io.gpu-alloc.time)" in timelimits.described(RULES, CAROL, None, 60)
    assert timelimits.described(RULES, ROOT, None, None) == ""


def lease(lid: str, limit: float | None, started: float | None, cid: str = "") -> Lease:
    return Lease(lid, ("GPU-0",), "", Phase.BOUND.value, cid or f"c-{lid}", created=100.0,
                 time_limit=limit, started=started)  # fmt: skip


def test_a_running_container_is_overdue_once_its_limit_from_its_first_start_passed():
    leases = [lease("a", 60, 1000), lease("b", 60, None), lease("c", None, 1000)]
    running = {"c-a", "c-b", "c-c"}
    assert timelimits.overdue(leases, running, Now(1059.9)) == []
    assert timelimits.overdue(leases, running, Now(1060)) == [leases[0]]
    assert timelimits.overdue(leases, set(), Now(5000)) == []  # stopped: nothing to stop
    assert timelimits.unstarted(leases, running) == [leases[1]]
    assert timelimits.unstarted(leases, {"c-a"}) == []  # not running: no clock yet


def test_a_pending_or_handed_over_lease_is_not_watched():
    pending = Lease("p", ("GPU-0",), "", Phase.PENDING.value, None, time_limit=1, started=0)
    lent = Lease("h", ("GPU-0",), "", Phase.HANDED_OVER.value, "c-h", time_limit=1, started=0)
    assert timelimits.overdue([pending, lent], {"c-h"}, Now(100)) == []


def test_time_left_counts_from_the_first_start_and_stops_at_zero():
    assert timelimits.left(lease("a", 60, None), Now(5000)) == 60
    assert timelimits.left(lease("a", 60, 1000), Now(1045)) == 15
    assert timelimits.left(lease("a", 60, 1000), Now(2000)) == 0
    assert timelimits.left(lease("a", None, 1000), Now(2000)) is None


def test_the_next_look_is_at_the_next_end_within_bounds():
    assert timelimits.next_check([], Now(0), None) == timelimits.CHECK_MAX
    assert timelimits.next_check([lease("a", 60, 1000)], Now(1057), None) == 3
    assert timelimits.next_check([lease("a", 60, 1000)], Now(1059.9), None) == timelimits.CHECK_MIN
    assert timelimits.next_check([lease("a", 60, 1000)], Now(1070), None) == timelimits.CHECK_MAX
    assert timelimits.next_check([lease("a", 3, None)], Now(0), None) == 0.75
    assert timelimits.next_check([], Now(0), 8) == 2


def test_a_start_after_the_time_is_up_is_refused_saying_to_create_it_again():
    assert timelimits.start_refusal("job", lease("a", 60, 1000), Now(1059)) is None
    assert timelimits.start_refusal("job", lease("a", 60, None), Now(9999)) is None  # never ran
    assert timelimits.start_refusal("job", None, Now(9999)) is None
    why = timelimits.start_refusal("job", lease("a", 60, 1000), Now(1060))
    assert why is not None and "refused to start job" in why and "time limit of 1m" in why
    assert "docker rm" in why


def test_the_clock_is_started_once_for_the_leases_container():
    state = State({"a": lease("a", 60, None)})
    assert not state.start_clock("a", "other", 5)
    assert state.start_clock("a", "c-a", 5)
    assert not state.start_clock("a", "c-a", 9)  # a restart does not reset it
    assert state.leases["a"].started == 5


def test_a_lease_written_before_time_limits_reads_without_one():
    old = {"id": "a", "gpus": ["GPU-0"], "token_sha256": "", "state": "bound", "container": "c"}
    got = lease_from_json(old)
    assert got.time_limit is None and got.started is None
    again = lease_from_json(json.loads(json.dumps(vars(lease("b", 60, 7.5)))))
    assert (again.time_limit, again.started) == (60, 7.5)


@pytest.mark.parametrize(
    "stop_timeout, grace",
    [(None, 10), (3, 3), (0, 0), (30, 30), (86400, 30), (2**31 - 1, 30), (-1, 30), (True, 10)],
)
def test_a_containers_own_stop_timeout_delays_its_sigkill_at_most_30_s(stop_timeout, grace):
    """dockerd waits as long as a container's StopTimeout says, forever when negative: a
    container ignoring its stop signal must not outlive its limit by it."""
    assert timelimits.grace(stop_timeout) == grace
