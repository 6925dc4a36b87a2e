"""The lease's transition table: what each event does to each phase, and nothing else."""

from __future__ import annotations

import pytest

from allocator.core.leases.phases import TRANSITIONS, Event, Phase


@pytest.mark.parametrize(
    ("phase", "event", "to"),
    [
        (Phase.PENDING, Event.BIND, Phase.BOUND),
        (Phase.BOUND, Event.BIND, Phase.BOUND),
        (Phase.BOUND, Event.HAND_OVER, Phase.HANDED_OVER),
        (Phase.HANDED_OVER, Event.TAKE_BACK, Phase.BOUND),
    ],
)
def test_each_row_moves_its_phase(phase: Phase, event: Event, to: Phase) -> None:
    assert TRANSITIONS[(phase, event)] is to


def test_no_other_event_moves_a_lease() -> None:
    allowed = {(Phase.PENDING, Event.BIND), (Phase.BOUND, Event.BIND),
               (Phase.BOUND, Event.HAND_OVER), (Phase.HANDED_OVER, Event.TAKE_BACK)}  # fmt: skip
    assert set(TRANSITIONS) == allowed
    assert (Phase.PENDING, Event.HAND_OVER) not in TRANSITIONS
