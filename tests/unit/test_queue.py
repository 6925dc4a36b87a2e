"""allocator.core.rules.queue: who is served first, and that nobody is delayed by those behind."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.core.rules.queue import (
    OverLimit,
    Placed,
    Short,
    Waiter,
    ahead_of,
    kept,
    order,
    serve,
)

GPUS = tuple(f"GPU-{i}" for i in range(8))


def waiter(name: str, *, owner: str = "", priority: int = 0, arrived: int = 0, gpus: int = 1):
    return Waiter(name, owner or name, priority, arrived, gpus, ask=gpus)


def pool(free: set[str], usable: dict[str, set[str]] | None = None):
    """An attempt that takes the lowest free GPUs a waiter may use, as placement would."""

    def attempt(w: Waiter, blocked: frozenset[str]) -> Placed | Short | OverLimit:
        mine = sorted((usable or {}).get(w.id, set(GPUS)) & free)
        open_ = [g for g in mine if g not in blocked]
        if len(open_) >= w.gpus:
            picked = tuple(open_[: w.gpus])
            free.difference_update(picked)
            return Placed(picked)
        return Short(frozenset(mine))

    return attempt


def test_higher_priority_comes_first_then_fewer_gpus_held_then_arrival() -> None:
    a = waiter("a", arrived=1)
    b = waiter("b", arrived=2, priority=5)
    c = waiter("c", arrived=3)
    d = waiter("d", arrived=0)
    assert [w.id for w in order([a, b, c, d], held={"d": 2})] == ["b", "a", "c", "d"]


def test_fair_share_puts_less_recent_use_first_among_equal_priorities() -> None:
    heavy = waiter("heavy", arrived=1)
    light = waiter("light", arrived=2)
    boss = waiter("boss", arrived=3, priority=1)
    usage = {"heavy": 7200.0, "light": 60.0, "boss": 1e9}
    assert [w.id for w in order([heavy, light, boss], {}, usage)] == ["boss", "light", "heavy"]
    # what they hold now still counts among owners with the same decayed usage
    assert [w.id for w in order([heavy, light], {"heavy": 0, "light": 1}, {})] == [
        "heavy",
        "light",
    ]


def test_without_fair_share_the_line_is_todays_held_now_order() -> None:
    heavy = waiter("heavy", arrived=1)
    light = waiter("light", arrived=2)
    assert [w.id for w in order([heavy, light], {"heavy": 0, "light": 1}, None)] == [
        "heavy",
        "light",
    ]


def test_serving_with_fair_share_grants_the_owner_with_less_recent_use_first() -> None:
    heavy = waiter("heavy", arrived=1)
    light = waiter("light", arrived=2)
    free = {"GPU-0"}
    granted = serve([heavy, light], {}, pool(free), {"heavy": 3600.0, "light": 0.0})
    assert [w.id for w, _ in granted] == ["light"]
    usage = {"heavy": 3600.0, "light": 60.0, "new": 0.0}
    assert ahead_of(waiter("new", arrived=3), [heavy, light], {}, usage) == []  # a newcomer too


def test_a_small_request_may_not_take_gpus_the_larger_head_could_use() -> None:
    head = waiter("big", arrived=1, gpus=4)
    small = waiter("small", arrived=2, gpus=1)
    free = {"GPU-0", "GPU-1"}
    assert serve([head, small], {}, pool(free)) == []
    assert free == {"GPU-0", "GPU-1"}  # held back for the head


def test_a_request_behind_may_use_gpus_the_head_cannot() -> None:
    head = waiter("big", arrived=1, gpus=4)
    other_pool = waiter("other", arrived=2, gpus=1)
    free = {"GPU-0", "GPU-1", "GPU-6"}
    usable = {"big": {"GPU-0", "GPU-1", "GPU-2", "GPU-3"}, "other": {"GPU-6", "GPU-7"}}
    granted = serve([head, other_pool], {}, pool(free, usable))
    assert [(w.id, p.gpus) for w, p in granted] == [("other", ("GPU-6",))]


def test_a_waiter_over_its_limit_blocks_nothing() -> None:
    limited = waiter("limited", arrived=1)
    next_ = waiter("next", arrived=2)
    free = {"GPU-0"}
    base = pool(free)

    def attempt(w: Waiter, blocked: frozenset[str]) -> Placed | Short | OverLimit:
        return OverLimit("over") if w.id == "limited" else base(w, blocked)

    assert [w.id for w, _ in serve([limited, next_], {}, attempt)] == ["next"]


def test_fair_share_is_taken_again_after_each_grant() -> None:
    alice1 = waiter("alice-1", owner="alice", arrived=1)
    alice2 = waiter("alice-2", owner="alice", arrived=2)
    bob = waiter("bob", owner="bob", arrived=3)
    free = {"GPU-0", "GPU-1"}
    granted = serve([alice1, alice2, bob], {}, pool(free))
    assert [w.id for w, _ in granted] == ["alice-1", "bob"]


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=4), min_size=1, max_size=8),
    free_count=st.integers(min_value=0, max_value=8),
)
def test_no_gpu_is_granted_twice_and_the_first_waiter_that_fits_is_never_skipped(
    sizes: list[int], free_count: int
) -> None:
    waiters = [waiter(f"w{i}", arrived=i, gpus=n) for i, n in enumerate(sizes)]
    free = set(GPUS[:free_count])
    granted = serve(waiters, {}, pool(set(free)))
    taken = [g for _, p in granted for g in p.gpus]
    assert len(taken) == len(set(taken)) and set(taken) <= free
    # With one pool, service is strictly in order: the granted are a prefix of the queue.
    assert [w.id for w, _ in granted] == [w.id for w in waiters[: len(granted)]]


def test_a_create_arriving_now_takes_its_place_in_the_order() -> None:
    a = waiter("a", arrived=1)
    b = waiter("b", arrived=2, priority=5)
    now = waiter("now", arrived=3)
    assert [w.id for w in ahead_of(now, [a, b], {})] == ["b", "a"]
    assert ahead_of(now, [a, b], {"a": 1, "b": 1}) == [b]  # holding fewer, it goes before a
    assert ahead_of(waiter("vip", arrived=3, priority=9), [a, b], {}) == []


def test_waiters_ahead_keep_what_they_could_use_or_would_be_given() -> None:
    head = waiter("big", arrived=1, gpus=4)
    fits = waiter("fits", arrived=2, gpus=1)
    limited = waiter("limited", arrived=3)
    free = {"GPU-0", "GPU-1", "GPU-6", "GPU-7"}
    usable = {"big": {"GPU-0", "GPU-1", "GPU-2", "GPU-3"}, "fits": {"GPU-6", "GPU-7"}}
    tried = pool(free, usable)

    def attempt(w: Waiter, blocked: frozenset[str]) -> Placed | Short | OverLimit:
        return OverLimit("at its limit") if w is limited else tried(w, blocked)

    keeps = kept([head, fits, limited], attempt)
    assert keeps == {"GPU-0": head, "GPU-1": head, "GPU-6": fits}  # GPU-7 stays free
