"""The reservation rules (allocator/core/timing/reservations.py), as data."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from allocator.core.leases.leases import Lease
from allocator.core.machine.inventory import GPU
from allocator.core.placement import first_fit
from allocator.core.rules.policy import Owner
from allocator.core.timing import reservations as rsv

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC).timestamp()
H = 3600.0
GPUS = [GPU(uuid=f"GPU-{i}", index=i) for i in range(4)]
ALICE = Owner(1001, "alice", ("ml",))
BOB = Owner(1002, "bob")


def res(gpus=("GPU-1",), start=NOW + 2 * H, end=NOW + 4 * H, holder="alice", **kw):
    return rsv.Reservation("r1", holder, tuple(gpus), start, end, **kw)


def test_during_the_window_only_the_holder_is_placed_on_its_gpus() -> None:
    r = res(start=NOW - H)
    kept = rsv.blocked([r], BOB, None, NOW)
    assert list(kept) == ["GPU-1"]
    assert kept["GPU-1"].describe() == "reserved for alice until 16:00 UTC (reservation r1)"
    assert rsv.blocked([r], ALICE, None, NOW) == {}
    assert rsv.blocked([r], BOB, 60, NOW), "a time limit does not help during the window"


def test_a_group_reservation_holds_for_its_members_only() -> None:
    r = res(start=NOW - H, holder="@ml")
    assert rsv.blocked([r], ALICE, None, NOW) == {}
    assert "reserved for group ml" in rsv.blocked([r], BOB, None, NOW)["GPU-1"].why


def test_before_the_window_only_a_limit_ending_by_its_start_is_placed() -> None:
    r = res()  # starts in 2 h
    assert rsv.blocked([r], BOB, None, NOW)["GPU-1"].upcoming, "unlimited: kept from it now"
    assert rsv.blocked([r], BOB, 2 * H + 1, NOW), "ends after the start"
    assert rsv.blocked([r], BOB, 2 * H, NOW) == {}, "ends at the start"
    assert rsv.blocked([r], BOB, None, NOW + 4 * H) == {}, "over"


def test_explain_says_until_when_a_gpu_may_be_used_before_the_window() -> None:
    text = rsv.later([res(note="deadline")], ["GPU-0", "GPU-1"], BOB, NOW, {"GPU-1": 1})
    assert text == (
        "GPU 1 until 14:00 UTC, then reserved for alice from 14:00 UTC to 16:00 UTC "
        "(reservation r1, deadline)"
    )
    assert rsv.later([res()], ["GPU-1"], ALICE, NOW, {}) == ""


def test_a_holders_count_request_keeps_to_its_own_free_reserved_gpus() -> None:
    r = res(gpus=("GPU-2", "GPU-3"), start=NOW - H)
    free = ["GPU-0", "GPU-1", "GPU-2", "GPU-3"]
    assert rsv.prefer([r], ALICE, 2, free, NOW) == {"GPU-0", "GPU-1"}
    assert rsv.prefer([r], ALICE, 3, free, NOW) == frozenset(), "more than reserved: any"
    assert rsv.prefer([r], BOB, 1, free, NOW) == frozenset()
    assert rsv.prefer([res(gpus=("GPU-2",))], ALICE, 1, free, NOW) == frozenset(), "not yet"


@pytest.mark.parametrize(
    ("text", "at"),
    [
        ("now", NOW),
        ("+30m", NOW + 1800),
        ("+2h", NOW + 2 * H),
        ("2026-12-02T14:00:00Z", NOW + 2 * H),
        ("2026-12-02T15:00:00+01:00", NOW + 2 * H),
    ],
)
def test_times_are_rfc3339_or_from_now(text: str, at: float) -> None:
    assert rsv.parse_time(text, NOW) == at


@pytest.mark.parametrize("text", ["tomorrow", "+2x", "2026-12-02T14:00:00", "14:00", "+"])
def test_a_malformed_time_is_refused_saying_what_is_read(text: str) -> None:
    with pytest.raises(ValueError, match="RFC 3339 time with its offset"):
        rsv.parse_time(text, NOW)


def test_a_window_in_the_past_or_backwards_is_refused() -> None:
    assert "must be after --from" in str(rsv.window_error(NOW + 2 * H, NOW + H, NOW))
    assert "in the past" in str(rsv.window_error(NOW - 2 * H, NOW - H, NOW))
    assert rsv.window_error(NOW, NOW + H, NOW) is None


def test_a_window_that_has_begun_but_not_ended_is_reserved_from_now() -> None:
    assert rsv.from_now((NOW - 2 * H, NOW + 2 * 24 * H), NOW) == (NOW, NOW + 2 * 24 * H)
    assert rsv.from_now((NOW + H, NOW + 2 * H), NOW) == (NOW + H, NOW + 2 * H)  # ahead: as is
    assert rsv.from_now((NOW - 2 * H, NOW - H), NOW) == (NOW - 2 * H, NOW - H)  # over: refused


def plan(named=(), count=0, others=(), window=(NOW + H, NOW + 2 * H), sick=None, held=()):
    return rsv.plan(
        named, count, GPUS, "this host", window, NOW, list(others), sick or {}, held,
        first_fit.allocate,
    )  # fmt: skip


def test_named_gpus_overlapping_another_reservation_are_refused_naming_it() -> None:
    other = res(start=NOW + H + 1800, end=NOW + 3 * H)
    got = plan(named=[GPUS[1]], others=[other])
    assert isinstance(got, str) and "overlaps another reservation (GPU 1: reserved for alice" in got
    assert plan(named=[GPUS[2]], others=[other]) == ("GPU-2",)
    assert plan(named=[GPUS[1]], others=[other], window=(NOW, NOW + H + 1800)) == ("GPU-1",)


def test_a_count_is_picked_among_free_unreserved_healthy_gpus_first() -> None:
    assert plan(count=2, held=["GPU-0"]) == ("GPU-1", "GPU-2")
    assert plan(count=2, others=[res(start=NOW, end=NOW + 3 * H)], sick={"GPU-0": "Xid 79"}) == (
        "GPU-2",
        "GPU-3",
    )
    assert plan(count=4, held=["GPU-0"]) == ("GPU-0", "GPU-1", "GPU-2", "GPU-3"), "held: still"


def test_more_gpus_than_the_host_or_than_are_left_is_refused() -> None:
    assert plan(count=5) == "asked for 5 GPUs but this host has only 4; reserve fewer"
    got = plan(count=4, others=[res(start=NOW, end=NOW + 3 * H)])
    assert isinstance(got, str) and "only 3 of the 4 of this host can be reserved" in got
    assert "reservation r1" in got


def test_an_unhealthy_named_gpu_is_refused() -> None:
    got = plan(named=[GPUS[0]], sick={"GPU-0": "Xid 79 at x"})
    assert isinstance(got, str) and got.startswith("GPU 0 is unhealthy (Xid 79 at x)")


def test_a_count_reservation_is_repicked_when_its_gpu_turns_unhealthy() -> None:
    r = res(gpus=("GPU-0", "GPU-1"), count=2)
    other = rsv.Reservation("r2", "bob", ("GPU-2",), NOW, NOW + 5 * H)
    got = rsv.repick(r, GPUS, {"GPU-1": "Xid 79"}, [r, other], (), first_fit.allocate)
    assert got.gpus == ("GPU-0", "GPU-3") and got.id == "r1"
    named = res(gpus=("GPU-1",))
    assert rsv.repick(named, GPUS, {"GPU-1": "Xid 79"}, [], (), first_fit.allocate) is named


def test_ended_reservations_are_dropped_and_the_rest_kept_by_start() -> None:
    a, b = res(start=NOW + 3 * H), res(start=NOW - 2 * H, end=NOW - H)
    c = rsv.Reservation("r0", "bob", ("GPU-0",), NOW, NOW + H)
    assert rsv.current([a, b, c], NOW) == [c, a]
    assert rsv.Reservation.from_json(a.to_json()) == a


def bobs(gpus=("GPU-1",), limit=None, started=None, container="c1"):
    return Lease("l1", tuple(gpus), "", "bound", container, "job", NOW - H, owner="bob",
                 time_limit=limit, started=started)  # fmt: skip


def test_a_start_inside_anothers_window_is_refused_naming_it() -> None:
    r = res(start=NOW - 60)
    why = rsv.start_refusal("job", bobs(limit=30.0), [r], BOB, NOW)
    assert why is not None and "would run inside that window" in why and "r1" in why
    assert rsv.start_refusal("job", bobs(limit=30.0), [r], ALICE, NOW) is None  # the holder


@pytest.mark.parametrize(
    ("limit", "started", "refused"),
    [
        (60.0, None, False),  # first start: 60 s fit before the window
        (120.0, None, True),  # first start: 120 s would run into it
        (600.0, NOW - 590, False),  # 10 s left of its clock
        (600.0, NOW - 400, True),  # 200 s left: into the window
        (None, None, True),  # no limit: never ends before it
    ],
)
def test_a_start_before_the_window_is_judged_by_the_time_its_clock_has_left(
    limit, started, refused
) -> None:
    r = res(start=NOW + 100)
    why = rsv.start_refusal("job", bobs(limit=limit, started=started), [r], BOB, NOW)
    assert (why is not None) is refused, why


def test_a_start_on_other_gpus_or_without_a_lease_is_not_judged_here() -> None:
    r = res(start=NOW - 60)
    assert rsv.start_refusal("job", bobs(gpus=("GPU-2",)), [r], BOB, NOW) is None
    assert rsv.start_refusal("job", None, [r], BOB, NOW) is None


def test_a_container_not_running_when_the_window_begins_gives_its_gpu_up() -> None:
    r = res(start=NOW - 1)
    lease = bobs(limit=30.0)
    assert rsv.yielding([(lease, BOB)], {"c1"}, [r], NOW) == {"l1": r}
    assert rsv.yielding([(lease, BOB)], set(), [r], NOW) == {}  # running: the timekeeper's
    assert rsv.yielding([(lease, ALICE)], {"c1"}, [r], NOW) == {}  # the holder keeps it
    assert rsv.yielding([(lease, BOB)], {"c1"}, [res()], NOW) == {}  # window not begun
    text = rsv.gave_up_text("job", r, NOW)
    assert "gave that GPU up" in text and "r1" in text and "docker rm" in text
