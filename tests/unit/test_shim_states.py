"""A shim connection's two state machines (shim/states.py): the exchanges they walk, and
the events they refuse."""

from __future__ import annotations

import pytest

from shim.states import REQUEST, RESPONSE, Ev, Machine, ProtocolError, Req, Resp


def walk(table: object, start: Req | Resp, events: list[Ev]) -> list[Req | Resp]:
    machine = Machine(table, start)  # type: ignore[arg-type]
    return [machine.fire(e) for e in events]


def test_a_spliced_request_with_a_streamed_body_and_its_answer() -> None:
    assert walk(REQUEST, Req.IDLE, [Ev.SEND_PART, Ev.BODY_SENT, Ev.RESPONSE_END]) == [
        Req.STREAMING, Req.SENT, Req.IDLE,
    ]  # fmt: skip
    assert walk(RESPONSE, Resp.IDLE, [Ev.SEND, Ev.BODY, Ev.RESPONSE_END]) == [
        Resp.HEAD, Resp.BODY, Resp.IDLE,
    ]  # fmt: skip


def test_an_intercepted_request_forwards_and_answers() -> None:
    assert walk(REQUEST, Req.IDLE, [Ev.COLLECT, Ev.COLLECTED, Ev.ANSWERED]) == [
        Req.COLLECTING, Req.INTERCEPTING, Req.IDLE,
    ]  # fmt: skip
    assert walk(RESPONSE, Resp.IDLE, [Ev.FORWARD, Ev.RESPONSE_END]) == [Resp.COLLECTING, Resp.IDLE]


def test_a_hijack_makes_both_sides_raw_for_good() -> None:
    assert walk(REQUEST, Req.IDLE, [Ev.SEND, Ev.HIJACK]) == [Req.SENT, Req.RAW]
    assert walk(RESPONSE, Resp.IDLE, [Ev.SEND, Ev.HIJACK]) == [Resp.HEAD, Resp.RAW]
    for event in Ev:
        if event is not Ev.CLOSE:
            with pytest.raises(ProtocolError):
                Machine(REQUEST, Req.RAW).fire(event)


@pytest.mark.parametrize(
    ("table", "start", "event"),
    [
        (REQUEST, Req.SENT, Ev.SEND),  # a second request while one is answered
        (REQUEST, Req.IDLE, Ev.RESPONSE_END),  # an answer nobody asked for
        (REQUEST, Req.COLLECTING, Ev.HIJACK),  # a hijack of an intercepted request
        (RESPONSE, Resp.COLLECTING, Ev.SEND),  # a splice while `forward` reads
        (RESPONSE, Resp.UNTIL_CLOSE, Ev.RESPONSE_END),  # only the Engine's close ends it
        (RESPONSE, Resp.CLOSED, Ev.FORWARD),
    ],
)
def test_an_event_the_table_does_not_hold_is_refused_and_changes_nothing(
    table: object, start: Req | Resp, event: Ev
) -> None:
    machine = Machine(table, start)  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match=f"{event.value} while {start.value}"):
        machine.fire(event)
    assert machine.state is start


def test_every_state_can_close_and_stays_closed() -> None:
    for table, states, closed in ((REQUEST, Req, Req.CLOSED), (RESPONSE, Resp, Resp.CLOSED)):
        for state in states:
            assert Machine(table, state).fire(Ev.CLOSE) is closed  # type: ignore[arg-type]
