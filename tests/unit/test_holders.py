"""Who holds a GPU (allocator/core/leases/holders.py): the phrase every refusal shows, and the
dict ``status`` prints."""

from __future__ import annotations

from allocator.core.leases.holders import CREATED, Holder, ago, held_for

CID = "c0ffee" + "1" * 58


def test_durations_are_said_in_their_largest_unit() -> None:
    assert [ago(s) for s in (-5, 45, 60, 12 * 60 + 59, 3 * 3600, 2 * 86400 + 7)] == [
        "0s", "45s", "1m", "12m", "3h", "2d",
    ]  # fmt: skip


def test_a_leased_holder_names_its_container_owner_age_and_lease() -> None:
    held = Holder(CID, "train", "leased", lease="l1", state="bound", owner="alice", since=100.0)
    assert held.describe(now=100.0 + 7200) == (
        "container c0ffee111111 'train' of alice, held 2h (lease l1, bound)"
    )


def test_a_fresh_holder_is_held_under_a_minute_not_for_0s() -> None:
    assert [held_for(s) for s in (0, 59, 60, 3 * 60 + 5, 2 * 3600)] == [
        "<1m", "<1m", "1m", "3m", "2h",
    ]  # fmt: skip
    held = Holder(CID, "train", "leased", lease="l1", state="bound", owner="alice", since=100.0)
    assert ", held <1m (" in held.describe(now=100.0)


def test_a_lease_whose_create_is_in_flight_has_no_container_yet() -> None:
    held = Holder(None, "", "leased", lease="l2", state="pending", owner="bob")
    assert held.describe() == "a create in flight of bob (lease l2, pending)"


def test_a_stopped_holder_says_so_and_a_created_one_is_on_its_way() -> None:
    stopped = Holder(CID, "job", "leased", lease="l1", state="bound", stopped="Exited (0)")
    assert stopped.idle_stopped and "; stopped: Exited (0))" in stopped.describe()
    created = Holder(CID, "job", "leased", lease="l1", state="bound", stopped=CREATED)
    assert not created.idle_stopped
    assert "; created, not started yet)" in created.describe()


def test_an_adopted_container_is_named_with_why_it_is_not_leased() -> None:
    held = Holder(CID, "legacy", "privileged")
    assert held.describe() == "container c0ffee111111 'legacy' (not leased: privileged)"


def test_the_status_dict_keeps_the_container_and_nests_the_owner() -> None:
    out = Holder(None, "", "leased", lease="l2", owner="bob", owner_uid=1001).to_dict()
    assert out["container"] is None and "stopped" not in out
    assert out["owner"] == {"uid": 1001, "user": "bob"}
