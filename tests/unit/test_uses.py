"""core.timing.uses: the audit trail's grants joined to their releases, the one join that
``gpu-alloc history``, ``report`` and fair share read."""

from __future__ import annotations

from allocator.core.leases import events
from allocator.core.timing.uses import uses

A = "GPU-aaaa"


def test_a_grant_and_its_release_are_one_use_from_one_to_the_other() -> None:
    grant = events.record("grant", 10, gpus=[A], lease="L1", owner="alice", name="x")
    release = events.record("release", 70, gpus=[A], lease="L1", reason="container removed")
    got = uses([grant, release])
    assert [(r["event"], r["from"], r["to"], r["end"], r["owner"]) for r in got] == [
        ("use", grant["time"], release["time"], "container removed", "alice")
    ]


def test_a_use_not_yet_released_is_open() -> None:
    (row,) = uses([events.record("grant", 10, gpus=[A], lease="L1", owner="alice")])
    assert row["to"] is None


def test_a_grant_recorded_again_joins_the_first_and_keeps_its_wait() -> None:
    first = events.record("grant", 10, gpus=[A], lease="L1", owner="alice", waited_s=4.0)
    got = uses([first, events.record("grant", 11, gpus=[A], lease="L1", owner="alice")])
    assert [(r["from"], r["waited_s"]) for r in got] == [(first["time"], 4.0)]


def test_every_other_event_is_a_row_of_its_own_at_its_time() -> None:
    refusal = events.record("refusal", 5, owner="bob", reason="not enough free GPUs")
    stray = events.record("release", 6, gpus=[A], lease="gone", owner="bob")
    got = uses([refusal, stray])
    assert [(r["event"], r["from"], r["to"]) for r in got] == [
        ("refusal", refusal["time"], refusal["time"]),
        ("release", stray["time"], stray["time"]),
    ]
