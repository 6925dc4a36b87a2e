"""allocator.core.timing.report: GPU-hours held, used and idle, waits and refusals, decayed
usage."""

from __future__ import annotations

import math

import pytest

from allocator.core.leases import events
from allocator.core.timing.report import (
    NONE,
    Bucket,
    Held,
    Window,
    decayed,
    held,
    reason_kind,
    rows,
    shares,
    weighed,
)
from allocator.core.timing.uses import uses

HOUR = 3600.0
A, B, C = "GPU-aaaa", "GPU-bbbb", "GPU-cccc"


def trail() -> list[dict]:
    """alice holds GPU 0 for 2 h; bob GPUs 1 and 2 for 1 h after waiting 90 s, then one
    refusal each; carol still holds GPU 0 from hour 5."""
    return [
        events.record("grant", 0, gpus=[A], indices={A: 0}, lease="L1", owner="alice",
                      pool="big"),
        events.record("release", 2 * HOUR, gpus=[A], lease="L1", owner="alice"),
        events.record("grant", 3 * HOUR, gpus=[B, C], indices={B: 1, C: 2}, lease="L2",
                      owner="bob", reason="served from the queue", waited_s=90.0),
        events.record("grant", 3 * HOUR + 1, gpus=[B, C], indices={B: 1, C: 2}, lease="L2",
                      owner="bob"),  # the create's own record of the same grant
        events.record("release", 4 * HOUR, gpus=[B, C], lease="L2", owner="bob"),
        events.record("refusal", 4.5 * HOUR, owner="bob", reason="gpu-alloc: not enough "
                      "free GPUs: asked for 4, 1 of 3 free", waited_s=600.0),
        events.record("refusal", 4.6 * HOUR, owner="alice", reason="bob holds 2 of 2 GPUs "
                      "(policy.limits.default)"),
        events.record("grant", 5 * HOUR, gpus=[A], indices={A: 0}, lease="L3", owner="carol"),
    ]  # fmt: skip


def by_user(owner: str, h: Held | None) -> tuple[str, ...]:
    return (owner,)


def table(by: str = "user", key=by_user, buckets=None, since=0.0, until=6 * HOUR):
    return {r[by]: r for r in rows(uses(trail()), buckets or {}, Window(since, until), by, key)}


def test_a_grant_recorded_twice_is_one_interval_with_its_wait() -> None:
    found = held(uses(trail()))
    assert [(h.owner, h.uuid, h.start, h.end) for h in found] == [
        ("alice", A, 0.0, 2 * HOUR),
        ("bob", B, 3 * HOUR, 4 * HOUR),
        ("bob", C, 3 * HOUR, 4 * HOUR),
        ("carol", A, 5 * HOUR, None),
    ]
    assert found[0].pool == "big" and found[1].pool is None


def test_gpu_hours_held_per_user_count_each_gpu_and_open_uses_up_to_until() -> None:
    got = table()
    assert got["alice"]["gpu_hours_held"] == 2.0
    assert got["bob"]["gpu_hours_held"] == 2.0  # two GPUs for one hour
    assert got["carol"]["gpu_hours_held"] == 1.0  # still held: up to `until`
    assert [got[u]["grants"] for u in ("alice", "bob", "carol")] == [1, 1, 1]


def test_the_window_clips_intervals_and_counts_only_events_inside_it() -> None:
    got = table(since=1 * HOUR, until=3.5 * HOUR)
    assert got["alice"]["gpu_hours_held"] == 1.0 and got["alice"]["grants"] == 0
    assert got["bob"]["gpu_hours_held"] == 1.0 and got["bob"]["grants"] == 1
    assert "carol" not in got


def test_used_is_held_time_weighted_by_utilisation_and_idle_is_time_without_use() -> None:
    buckets = {
        A: [Bucket(0, HOUR, 0.5, 1.0), Bucket(HOUR, HOUR, 0.0, 0.0)],
        B: [Bucket(3 * HOUR, HOUR, 1.0, 1.0)],
    }  # C: never sampled
    got = table(buckets=buckets)
    assert got["alice"]["gpu_hours_used"] == 0.5 and got["alice"]["gpu_hours_idle"] == 1.0
    assert got["bob"]["gpu_hours_used"] == 1.0 and got["bob"]["gpu_hours_idle"] == 0.0
    assert got["bob"]["gpu_hours_unsampled"] == 1.0


def test_a_bucket_counts_only_for_the_part_of_it_held() -> None:
    buckets = [Bucket(0, 60, 0.8, 1.0), Bucket(60, 60, 0.2, 0.5)]
    used, idle, sampled = weighed(buckets, 30, 90)
    assert (round(used, 6), idle, sampled) == (round(30 * 0.8 + 30 * 0.2, 6), 15.0, 60.0)


def test_waits_count_on_grants_and_on_refusals_whose_time_ran_out() -> None:
    bob = table()["bob"]
    assert (bob["waits"], bob["wait_seconds_total"], bob["wait_seconds_longest"]) == (
        2,
        690.0,
        600.0,
    )
    assert table()["carol"]["waits"] == 0


def test_refusals_are_counted_by_a_bounded_reason() -> None:
    got = table()
    assert got["bob"]["refusals"] == {"short of GPUs": 1}
    assert got["alice"]["refusals"] == {"owner limit": 1}
    assert (
        reason_kind("GPU 3: kept for alice's create 'big' waiting in line") == "kept for the line"
    )
    assert reason_kind("pool 'x' is not open to bob (policy.pools.x)") == "pool"
    assert reason_kind("something new") == "other policy"


def test_rows_by_gpu_and_pool_put_what_names_no_gpu_under_a_dash() -> None:
    def by_gpu(owner: str, h: Held | None) -> tuple[str, ...]:
        return (NONE,) if h is None else (str(h.index),)

    def by_pool(owner: str, h: Held | None) -> tuple[str, ...]:
        return (NONE,) if h is None else (h.pool or NONE,)

    gpus = table("gpu", by_gpu)
    assert gpus["0"]["gpu_hours_held"] == 3.0 and gpus["0"]["grants"] == 2
    assert gpus["1"]["gpu_hours_held"] == 1.0 and gpus["1"]["grants"] == 1
    assert gpus[NONE]["refusals"] == {"short of GPUs": 1, "owner limit": 1}
    pools = table("pool", by_pool)
    assert pools["big"]["gpu_hours_held"] == 2.0 and pools[NONE]["gpu_hours_held"] == 3.0


def test_rows_come_most_held_first() -> None:
    got = rows(uses(trail()), {}, Window(0, 6 * HOUR), "user", by_user)
    assert [r["user"] for r in got] == ["alice", "bob", "carol"]


def test_decayed_usage_halves_with_each_half_life_of_age() -> None:
    now, day = 10 * 86400.0, 86400.0
    recent = Held("recent", A, 0, now - 60, now)
    old = Held("old", B, 1, now - day - 60, now - day)
    usage = decayed([recent, old], now, half_life=day)
    assert usage["recent"] == pytest.approx(60, rel=1e-3)
    assert usage["old"] == pytest.approx(30, rel=1e-3)
    assert shares(usage) == pytest.approx({"recent": 2 / 3, "old": 1 / 3}, rel=1e-3)


def test_decayed_usage_is_the_exact_integral_and_counts_open_uses_to_now() -> None:
    half_life, now = 100.0, 1000.0
    usage = decayed([Held("a", A, 0, 800.0, None)], now, half_life)
    rate = math.log(2) / half_life
    assert usage["a"] == pytest.approx((1 - math.exp(-rate * 200)) / rate)
    assert decayed([Held("a", A, 0, 1200.0, None)], now, half_life) == {}


def test_a_use_handed_over_to_a_compose_replacement_holds_its_gpus_until_the_hand_over() -> None:
    trail = [
        events.record("grant", 0, gpus=[A], lease="old", owner="alice"),
        events.record("grant", HOUR, gpus=[A], lease="new", owner="alice"),
        events.record("hand-over", HOUR, gpus=[A], lease="old", owner="alice"),
        events.record("release", HOUR + 60, gpus=[A], lease="old", owner="alice"),
    ]
    found = held(uses(trail))
    assert [(h.start, h.end) for h in found] == [(0.0, HOUR), (HOUR, None)]
    got = rows(uses(trail), {}, Window(0, 2 * HOUR), "user", by_user)
    assert got[0]["gpu_hours_held"] == 2.0  # not 2 h and a minute


def test_an_interval_names_its_container_by_name_or_short_id() -> None:
    trail = [
        events.record("grant", 0, gpus=[A], lease="L1", owner="alice", container="f" * 64),
        events.record("release", HOUR, gpus=[A], lease="L1", owner="alice", name="train"),
        events.record("grant", HOUR, gpus=[B], lease="L2", owner="bob", container="e" * 64),
    ]
    assert [h.name for h in held(uses(trail))] == ["train", "e" * 12]


def test_a_reservation_made_and_cancelled_makes_no_row_of_its_own() -> None:
    """Rows are for owners with use, waits or refusals: a group's reservation, made and
    cancelled, is no user row of zeros."""
    trail_ = [*trail(), events.record("reserve", HOUR, gpus=[A], owner="@lab", reason="r"),
              events.record("reserve-cancel", HOUR + 5, gpus=[A], owner="@lab", reason="c"),
              events.record("health", HOUR, gpus=[A], reason="GPU unhealthy")]  # fmt: skip
    got = {r["user"] for r in rows(uses(trail_), {}, Window(0, 6 * HOUR), "user", by_user)}
    assert got == {"alice", "bob", "carol"}
