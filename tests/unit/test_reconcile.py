"""Reconcile as a plan (allocator/core/leases/reconcile.py): only what the Engine's listing proves
changes the ledger; what is newer than the listing is kept."""

from __future__ import annotations

from allocator.core.leases.leases import Claim, Phase, State
from allocator.core.leases.reconcile import apply, share_lease
from allocator.core.timing.clock import Now

CID, OTHER = "a" * 64, "b" * 64
RUNNING = {"State": "running", "Status": "Up 2 hours"}


def bound_state() -> tuple[State, str]:
    state = State()
    lease, _ = state.new_lease(("GPU-0",), now=0, ttl=60)
    state.bind(lease.id, CID, name="train")
    return state, lease.id


def test_a_bound_lease_whose_container_is_gone_is_freed() -> None:
    state, lease = bound_state()
    report = apply(state, state.copy(), {}, {}, {}, now=Now(10))
    assert report.freed == [lease] and report
    assert state.leases == {}


def test_a_lease_bound_after_the_listing_was_taken_is_kept() -> None:
    state, lease = bound_state()
    snapshot = State()  # the listing was asked for before this lease was bound
    report = apply(state, snapshot, {}, {}, {}, now=Now(10))
    assert not report and lease in state.leases


def test_a_pending_lease_is_bound_by_its_label_or_freed_past_its_deadline() -> None:
    state = State()
    labelled, _ = state.new_lease(("GPU-0",), now=0, ttl=60)
    late, _ = state.new_lease(("GPU-1",), now=0, ttl=60)
    waiting, _ = state.new_lease(("GPU-2",), now=50, ttl=60)
    report = apply(state, state.copy(), {CID: RUNNING}, {labelled.id: CID}, {}, now=Now(61))
    assert (report.bound, report.freed) == ([labelled.id], [late.id])
    assert state.leases[labelled.id].container == CID
    assert state.leases[waiting.id].state == "pending"


def test_claims_are_dropped_when_gone_and_found_containers_adopted_unless_leased() -> None:
    state, _ = bound_state()
    state.claims[OTHER] = Claim(OTHER, "legacy", None, "privileged")
    found = {CID: Claim(CID, "train", ("GPU-0",), "leased already"),
             "c" * 64: Claim("c" * 64, "new", ("GPU-1",), "privileged")}  # fmt: skip
    report = apply(state, state.copy(), {CID: RUNNING, "c" * 64: RUNNING}, {}, found, now=Now(5))
    assert (report.dropped, report.adopted) == ([OTHER], ["c" * 64])
    assert set(state.claims) == {"c" * 64}
    assert state.adopted_at == 5


def test_stopped_containers_are_reported_with_the_engines_status_and_change_nothing() -> None:
    state, _ = bound_state()
    listed = {CID: {"State": "exited", "Status": "Exited (0) 2 hours ago"},
              OTHER: {"State": "created"}}  # fmt: skip
    report = apply(state, state.copy(), listed, {}, {}, now=Now(5))
    assert report.stopped == {CID: "Exited (0) 2 hours ago", OTHER: "created"}
    assert not report


def test_a_share_whose_lease_was_lost_is_adopted_as_its_lease_again() -> None:
    claim = Claim(CID, "nb", ("GPU-0",), "device request", owner="al", owner_uid=1000,
                  since=5.0, pool="notebooks")  # fmt: skip
    lease = share_lease(claim, "0123abcd", 1, 4, "1000")
    state = State()
    report = apply(state, State(), {CID: RUNNING}, {}, {CID: lease}, now=Now(10))
    assert report.adopted == [CID] and state.claims == {}
    got = state.leases["0123abcd"]
    assert (got.container, got.phase, got.gpus, got.gpus_held) == (
        CID,
        Phase.BOUND,
        ("GPU-0",),
        0.25,
    )
    assert (got.owner, got.owner_uid, got.pool, got.share_user) == ("al", 1000, "notebooks", "1000")
    assert not got.token_matches("")  # it admits no create


def test_a_share_lease_whose_id_is_taken_meanwhile_waits_for_the_next_run() -> None:
    state, taken = bound_state()
    claim = Claim(OTHER, "nb", ("GPU-1",), "device request")
    report = apply(state, state.copy(), {CID: RUNNING, OTHER: RUNNING}, {},
                   {OTHER: share_lease(claim, taken, 1, 4, "0")}, now=Now(10))  # fmt: skip
    assert report.adopted == [] and state.leases[taken].container == CID
