"""Time a clock change cannot move: every limit gpu-alloc measures runs on the boot's clock
from the event, whatever the wall clock is set to; a reboot falls back to the wall clock;
a jump of the wall clock is seen, and reservations keep the clock from before it."""

from __future__ import annotations

import json

from allocator.core.leases import clock
from allocator.core.leases.clock import Jump, Now
from allocator.core.leases.leases import Lease, Phase, State, lease_json
from allocator.core.leases.reconcile import apply, stopped_since
from allocator.core.rules import policy
from allocator.core.rules.policy import Rules
from allocator.core.timing import checkpoint, reclaim, timelimits

HOUR = 3600.0
BOOT = "5e1f-boot"
T0 = 1_767_225_600.0  # the wall clock at the event
B0 = 5000.0  # CLOCK_BOOTTIME at the event


def later(seconds: float, wall_moved: float = 0.0, boot_id: str = BOOT) -> Now:
    """The clocks ``seconds`` after the event, the wall clock set by ``wall_moved``."""
    return Now(T0 + seconds + wall_moved, boot_id, B0 + seconds)


def running(limit: float) -> Lease:
    return Lease("a", ("GPU-0",), "", Phase.BOUND.value, "c-a", created=T0, time_limit=limit,
                 started=T0, granted_boot=(BOOT, B0), started_boot=(BOOT, B0))  # fmt: skip


def test_a_time_limit_set_back_an_hour_still_ends_after_its_minutes_on_the_boots_clock():
    lease = running(10 * 60)
    assert timelimits.overdue([lease], {"c-a"}, later(599, wall_moved=-HOUR)) == []
    assert timelimits.overdue([lease], {"c-a"}, later(600, wall_moved=-HOUR)) == [lease]
    assert timelimits.start_refusal("job", lease, later(600, wall_moved=-HOUR)) is not None


def test_a_wall_clock_set_forward_an_hour_does_not_end_a_two_hour_limit_early():
    lease = running(2 * HOUR)
    assert timelimits.overdue([lease], {"c-a"}, later(600, wall_moved=HOUR)) == []
    assert timelimits.left(lease, later(600, wall_moved=HOUR)) == 2 * HOUR - 600
    assert timelimits.next_check([lease], later(600, wall_moved=HOUR), None) == 10


def test_after_a_reboot_time_run_is_the_wall_clocks_difference_never_below_zero():
    lease = running(10 * 60)
    assert timelimits.ran(lease, later(5, wall_moved=700, boot_id="next-boot")) == 705
    assert timelimits.overdue([lease], {"c-a"}, later(5, wall_moved=700, boot_id="x")) == [lease]
    assert clock.elapsed(Now(T0, BOOT, B0), Now(T0 - HOUR, "x", 1.0)) == 0.0


def test_a_lease_written_before_stamps_existed_is_measured_on_the_wall_clock():
    old = Lease("a", ("GPU-0",), "", Phase.BOUND.value, "c-a", time_limit=600, started=T0)
    assert timelimits.left(old, later(100, wall_moved=-HOUR)) == 600  # as before: no stamp
    assert timelimits.left(old, later(100)) == 500


def pending(ttl: float) -> State:
    state = State()
    state.new_lease(("GPU-0",), T0, ttl, (BOOT, B0))
    return state


def test_a_pending_lease_waits_its_ttl_on_the_boots_clock_whatever_the_wall_clock_says():
    state = pending(300)
    assert apply(state, state.copy(), {}, {}, {}, later(60, wall_moved=HOUR)).freed == []
    assert apply(state, state.copy(), {}, {}, {}, later(299, wall_moved=-HOUR)).freed == []
    assert len(apply(state, state.copy(), {}, {}, {}, later(301, wall_moved=-HOUR)).freed) == 1


def test_release_stopped_after_counts_from_the_stop_as_first_seen_on_the_boots_clock():
    rules, leases = Rules(release_stopped_after=HOUR), [("a", "c-a")]
    kept = stopped_since({}, {"c-a": T0}, later(10))  # reconcile sees it 10 s after its stop
    assert kept == {"c-a": (T0, BOOT, B0)}
    assert stopped_since(kept, {"c-a": T0}, later(600, wall_moved=-HOUR)) == kept

    def due(now: Now) -> list[str]:
        return policy.expired(leases, {c: Now(*s) for c, s in kept.items()}, now, rules)

    assert due(later(HOUR - 1, wall_moved=2 * HOUR)) == []  # forward: nothing early
    assert due(later(HOUR, wall_moved=-2 * HOUR)) == ["a"]  # back: not evaded
    assert stopped_since(kept, {"c-a": T0 + 900}, later(905)) == {"c-a": (T0 + 900, BOOT, B0 + 900)}
    assert stopped_since(kept, {}, later(905)) == {}  # it ran again, or went


def test_idle_reclaim_counts_unused_time_on_the_boots_clock_from_the_last_use():
    rules, lease = Rules(reclaim_idle_after=HOUR), running(10 * HOUR)
    used = clock.placed({}, {"GPU-0": T0 + 600}, later(605))  # seen in use at 600 s
    assert used == {"GPU-0": Now(T0 + 600, BOOT, B0 + 600)}
    assert clock.placed(used, {"GPU-0": T0 + 600}, later(900, wall_moved=HOUR)) == used

    def idle(now: Now) -> list[Lease]:
        """The leases reclaim stops at ``now`` (found, then `checkpoint.before_reclaim`)."""
        found = reclaim.idle([lease], {"c-a": None}, {"GPU-0"}, set(), used, now, rules)
        return checkpoint.before_reclaim(found, now, HOUR)[1]

    assert idle(later(600 + HOUR - 1, wall_moved=2 * HOUR)) == []  # forward: not early
    assert idle(later(600 + HOUR, wall_moved=-2 * HOUR)) == [lease]  # back: not evaded


def test_an_engine_timestamp_is_placed_back_on_the_boots_clock_never_before_the_grant():
    now = later(20)
    assert clock.seen(T0 + 15, now) == Now(T0 + 15, BOOT, B0 + 15)
    assert clock.seen(T0 + 25, now).boot == B0 + 20  # a stamp "in the future": now
    grant = Now(T0 + 12, BOOT, B0 + 12)
    assert clock.seen(T0 - HOUR, now, grant).boot == B0 + 12  # a clock set forward meanwhile
    assert clock.seen(T0, Now(T0 + 20)) == Now(T0)  # no boot clock: the wall time alone


def test_the_stamps_live_beside_the_leases_so_an_older_reader_reads_the_file_as_ever():
    state = pending(300)
    lease_id = next(iter(state.leases))
    state.bind(lease_id, "c-a")
    assert state.start_clock(lease_id, "c-a", T0 + 5, (BOOT, B0 + 5))
    data = json.loads(json.dumps(state.to_json()))
    assert data["boot"] == {lease_id: {"granted": [BOOT, B0], "started": [BOOT, B0 + 5]}}
    assert set(data["leases"][lease_id]) <= set(lease_json(Lease("x", (), "")))
    assert State.from_json(data, "f").leases[lease_id] == state.leases[lease_id]
    del data["boot"]  # as an older gpu-alloc writes it back
    old = State.from_json(data, "f").leases[lease_id]
    assert (old.granted_boot, old.started_boot, old.started) == (None, None, T0 + 5)


def test_a_jump_of_the_wall_clock_is_seen_beyond_the_tolerance_and_signed():
    trusted = Now(T0, BOOT, B0)
    assert clock.jump(trusted, later(60, wall_moved=1.5)) is None  # NTP slewing
    moved = clock.jump(trusted, later(60, wall_moved=3 * HOUR))
    assert moved == Jump(3 * HOUR, T0 + 60 + 3 * HOUR, BOOT, T0 - B0)
    assert clock.described(moved) == "+3h"
    assert clock.described(clock.jump(trusted, later(60, wall_moved=-90)) or moved) == "-1m"
    assert clock.jump(trusted, later(60, wall_moved=HOUR, boot_id="x")) is None  # rebooted
    assert Jump.from_json(json.loads(json.dumps(moved.to_json()))) == moved
    assert Jump.from_json({"by": 1}) is None


def test_reservations_keep_the_clock_from_before_a_jump_so_no_window_moves_early():
    moved = clock.jump(Now(T0, BOOT, B0), later(60, wall_moved=3 * HOUR))
    assert clock.schedule(later(120, wall_moved=3 * HOUR), moved) == T0 + 120
    back = clock.jump(Now(T0, BOOT, B0), later(60, wall_moved=-HOUR))
    assert clock.schedule(later(120, wall_moved=-HOUR), back) == T0 + 120 - HOUR
    assert clock.schedule(later(120, wall_moved=3 * HOUR), None) == T0 + 120 + 3 * HOUR
    assert clock.schedule(later(120, 3 * HOUR, "next-boot"), moved) == T0 + 120 + 3 * HOUR
