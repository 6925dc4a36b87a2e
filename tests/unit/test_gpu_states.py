"""The one state each GPU has, whatever view shows it: every state and its precedence."""

from __future__ import annotations

from allocator.core.leases.holders import Holder
from allocator.core.machine.gpu_states import (
    BUSY,
    CREATING,
    DEPARTED,
    FREE,
    LEASED,
    MIG,
    UNHEALTHY,
    Activity,
    GpuState,
    states,
)
from allocator.core.machine.health import XID, GpuEvent, GpuHealth, Health
from allocator.core.machine.inventory import GPU

U = [f"GPU-{i}" for i in range(4)]
NOW, IDLE_AFTER = 10_000.0, 60.0
CID = "c" * 64
LEASE = Holder(CID, "train", "leased by gpu-alloc", "l1", "bound", "alice", since=NOW - 600)
PENDING = Holder(None, "job", "leased by gpu-alloc", "l2", "pending", "bob", since=NOW - 5)
XID79 = GpuHealth(healthy=False, event=GpuEvent(U[0], XID, NOW - 30, 79), last_event=NOW - 30)


def read(
    gpus: list[GPU],
    holders: dict[str, Holder] | None = None,
    sick: dict[str, GpuHealth] | None = None,
    active: frozenset[str] = frozenset(),
    containers: dict[str, str] | None = None,
    unread: frozenset[str] = frozenset(),
) -> dict[str, GpuState]:
    got = states(
        gpus,
        holders or {},
        Health(sick or {}),
        Activity(NOW, IDLE_AFTER, active, {}, frozenset(U) - unread),
        containers,
    )
    return {s.uuid: s for s in got}


def test_a_gpu_nothing_holds_is_free_and_grantable() -> None:
    [s] = read([GPU(U[0], 0)]).values()
    assert (s.state, s.free, s.holder, s.container_state, s.idle_since) == (
        FREE,
        True,
        None,
        None,
        None,
    )


def test_a_held_gpu_is_leased_with_its_holder_and_its_containers_state() -> None:
    got = read(
        [GPU(U[0], 0), GPU(U[1], 1)], {U[0]: LEASE, U[1]: PENDING}, containers={CID: "exited"}
    )
    assert (got[U[0]].state, got[U[0]].holder, got[U[0]].container_state) == (
        LEASED,
        LEASE,
        "exited",
    )
    assert (got[U[1]].state, got[U[1]].container_state) == (LEASED, CREATING)
    assert not got[U[0]].free


def test_an_unhealthy_gpu_is_never_free() -> None:
    [s] = read([GPU(U[0], 0)], sick={U[0]: XID79}).values()
    assert (s.state, s.free, s.health.reason()) == (UNHEALTHY, False, XID79.reason())


def test_an_unhealthy_held_gpu_shows_both_the_health_and_the_lease() -> None:
    [s] = read([GPU(U[0], 0)], {U[0]: LEASE}, {U[0]: XID79}, containers={CID: "running"}).values()
    assert s.state == UNHEALTHY and s.held and s.holder == LEASE
    assert s.container_state == "running" and not s.health.healthy


def test_a_gpu_a_lease_names_that_the_inventory_lost_is_departed_whatever_else() -> None:
    got = read([GPU(U[0], 0)], {U[0]: LEASE, U[3]: PENDING}, {U[3]: XID79})
    gone = got[U[3]]
    assert (gone.state, gone.gpu, gone.holder, gone.free) == (DEPARTED, None, PENDING, False)
    assert list(got) == [U[0], U[3]]  # the inventory's GPUs first, then the departed


def test_host_processes_make_a_free_gpu_busy_but_a_lease_wins() -> None:
    got = read([GPU(U[0], 0, busy=True), GPU(U[1], 1, busy=True)], {U[1]: LEASE})
    assert (got[U[0]].state, got[U[1]].state) == (BUSY, LEASED)


def test_a_gpu_in_mig_mode_is_not_free_and_its_slices_share_its_health() -> None:
    parent = GPU(U[0], 0, mig_mode=True)
    piece = GPU("MIG-a", 0, parent=U[0], profile="1g.10gb", mig_index=1)
    got = read([parent, piece])
    assert (got[U[0]].state, got["MIG-a"].state) == (MIG, FREE)
    sick = read([parent, piece], sick={U[0]: XID79})
    assert sick["MIG-a"].state == UNHEALTHY


def test_a_lease_unused_for_idle_after_is_idle_and_use_clears_it() -> None:
    holders = {U[0]: LEASE}
    assert read([GPU(U[0], 0)], holders)[U[0]].idle_since == LEASE.since
    assert read([GPU(U[0], 0)], holders, active=frozenset({U[0]}))[U[0]].idle_since is None
    fresh = Holder(CID, "x", "leased by gpu-alloc", "l3", "bound", "a", since=NOW - 10)
    assert read([GPU(U[0], 0)], {U[0]: fresh})[U[0]].idle_since is None


def test_a_leased_gpu_whose_use_was_not_read_is_unknown_never_idle() -> None:
    got = read([GPU(U[0], 0), GPU(U[1], 1)], {U[0]: LEASE, U[1]: LEASE}, unread=frozenset(U[:1]))
    assert (got[U[0]].use, got[U[0]].idle_since) == ("unknown", None)
    assert (got[U[1]].use, got[U[1]].idle_since) == ("unused", LEASE.since)
    busy = read([GPU(U[0], 0)], {U[0]: LEASE}, active=frozenset(U[:1]), unread=frozenset(U[:1]))
    assert busy[U[0]].use == "active"  # a process seen is use, whatever else is unread


def test_an_adopted_claim_holds_but_is_never_marked_idle() -> None:
    claim = Holder(CID, "old", "adopted: no lease label", owner="carol", since=NOW - 9999)
    [s] = read([GPU(U[0], 0)], {U[0]: claim}).values()
    assert (s.state, s.idle_since) == (LEASED, None)
