"""Which per-owner rule applies (allocator/core/rules/by_owner.py): the user's own, else
the largest of their groups', else the pool's, else the default, each with its key."""

from __future__ import annotations

from allocator.core.rules.by_owner import ByOwner
from allocator.core.rules.policy import Owner

HOURS = ByOwner(
    "policy.time_limit",
    users={"ann": 1.0},
    groups={"staff": 4.0, "interns": 2.0},
    pools={"batch": 8.0},
    default=6.0,
)


def pick(user: str, groups: tuple[str, ...] = (), pool: str | None = None):
    return HOURS.pick(Owner(1000, user, groups), pool, lambda hours: hours)


def test_the_users_own_rule_wins_over_their_groups_and_pool():
    assert pick("ann", ("staff",), "batch") == (1.0, "policy.time_limit.users.ann")


def test_of_several_groups_the_largest_rule_applies():
    assert pick("bob", ("interns", "staff"), "batch") == (4.0, "policy.time_limit.groups.staff")


def test_then_the_pool_then_the_default_and_without_one_nothing():
    assert pick("bob", ("other",), "batch") == (8.0, "policy.time_limit.pools.batch")
    assert pick("bob") == (6.0, "policy.time_limit.default")
    unset = ByOwner[float]("policy.signal", {}, {}, {}, None)
    assert unset.pick(Owner(1000, "bob"), None, float) is None
