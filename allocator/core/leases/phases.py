"""A lease's phases and the one table of how events move it between them (`TRANSITIONS`):
an event with no row for the lease's phase is refused (`LeaseError`), never guessed at.
`leases.fire` applies a row; `leases.py`'s docstring draws the table."""

from __future__ import annotations

from enum import Enum, StrEnum


class LeaseError(ValueError):
    """An event that the lease's phase has no transition for."""


class Phase(StrEnum):
    PENDING = "pending"
    BOUND = "bound"
    HANDED_OVER = "handed-over"


class Event(Enum):
    BIND = "bind"  # the Engine named the container
    HAND_OVER = "hand-over"  # a Compose replacement takes the GPUs
    TAKE_BACK = "take-back"  # the replacement's lease ended first


TRANSITIONS: dict[tuple[Phase, Event], Phase] = {
    (Phase.PENDING, Event.BIND): Phase.BOUND,
    (Phase.BOUND, Event.BIND): Phase.BOUND,  # the same answer from plugin and shim
    (Phase.BOUND, Event.HAND_OVER): Phase.HANDED_OVER,
    (Phase.HANDED_OVER, Event.TAKE_BACK): Phase.BOUND,
}
