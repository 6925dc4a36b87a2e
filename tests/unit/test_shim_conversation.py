"""Both sides of a shim connection together (shim/states.py's `Conversation`): the rules
between the client's requests and the Engine's answers, driven with no socket."""

from __future__ import annotations

import pytest

from shim.framing import Framing
from shim.states import (
    BOTH,
    CLIENT_EOF,
    UPSTREAM_CLOSED,
    Act,
    Answer,
    Conversation,
    Ev,
    Req,
    Resp,
    answer,
)


def at(req: Req, resp: Resp) -> Conversation:
    talk = Conversation()
    talk.req.state, talk.resp.state = req, resp
    return talk


def test_a_spliced_request_opens_an_answer_and_the_next_one_waits_for_it() -> None:
    talk = Conversation()
    talk.fire(Ev.SEND)
    assert (talk.req.state, talk.resp.state) == (Req.SENT, Resp.HEAD)
    assert talk.answer_ended(reuse=True) is Act.GO_ON
    assert (talk.req.state, talk.resp.state) == (Req.IDLE, Resp.IDLE)


def test_an_answer_that_ends_before_the_body_is_sent_waits_for_the_body() -> None:
    talk = Conversation()
    talk.fire(Ev.SEND_PART)
    assert (talk.req.state, talk.resp.state) == (Req.STREAMING, Resp.HEAD)
    assert talk.answer_ended(reuse=True) is Act.WAIT
    assert (talk.req.state, talk.resp.state) == (Req.STREAMING, Resp.IDLE)
    talk.body_sent(answered=True)
    assert talk.req.state is Req.IDLE


def test_a_body_sent_before_its_answer_leaves_the_request_sent() -> None:
    talk = Conversation()
    talk.fire(Ev.SEND_PART)
    talk.body_sent(answered=False)
    assert (talk.req.state, talk.resp.state) == (Req.SENT, Resp.HEAD)


def test_an_answer_on_a_connection_not_kept_ends_it() -> None:
    talk = Conversation()
    talk.fire(Ev.SEND)
    assert talk.answer_ended(reuse=False) is Act.CLOSE
    assert talk.resp.state is Resp.IDLE


def test_a_hijack_and_a_close_take_both_sides() -> None:
    talk = Conversation()
    talk.fire(Ev.SEND)
    talk.fire(Ev.HIJACK)
    assert (talk.req.state, talk.resp.state) == (Req.RAW, Resp.RAW)
    talk.fire(Ev.CLOSE)
    assert (talk.req.state, talk.resp.state) == (Req.CLOSED, Resp.CLOSED)
    assert set(BOTH) == {Ev.SEND, Ev.SEND_PART, Ev.HIJACK, Ev.CLOSE}


@pytest.mark.parametrize(
    ("req", "awaiting", "act"),
    [
        (Req.IDLE, False, Act.CLOSE),  # nothing to answer
        (Req.STREAMING, True, Act.CLOSE),  # the body can never be completed
        (Req.COLLECTING, False, Act.CLOSE),
        (Req.SENT, True, Act.PASS_EOF),  # Go's server decides: cancel, or answer
        (Req.CONNECTING, False, Act.WAIT),  # the held request still goes up
        (Req.INTERCEPTING, False, Act.WAIT),  # the interceptor's answer still comes
        (Req.RAW, True, Act.HALF_CLOSE),
    ],
)
def test_a_client_half_close(req: Req, awaiting: bool, act: Act) -> None:
    assert at(req, Resp.IDLE).client_eof(awaiting) is act


def test_every_client_half_close_is_decided() -> None:
    assert set(CLIENT_EOF) == {(s, w) for s in Req for w in (False, True)}


@pytest.mark.parametrize(
    ("req", "resp", "answered", "act"),
    [
        (Req.IDLE, Resp.IDLE, False, Act.DROP),  # reopened for the next request
        (Req.STREAMING, Resp.IDLE, False, Act.CLOSE),  # its request is cut short
        (Req.SENT, Resp.HEAD, False, Act.REPLY_502),  # never answered
        (Req.SENT, Resp.HEAD, True, Act.CLOSE),  # an interim answer went: cut short
        (Req.SENT, Resp.BODY, True, Act.CLOSE),
        (Req.SENT, Resp.UNTIL_CLOSE, True, Act.CLOSE),  # the body's end, passed on
        (Req.INTERCEPTING, Resp.COLLECTING, False, Act.SETTLE),  # `forward` says why
    ],
)
def test_the_engine_closing(req: Req, resp: Resp, answered: bool, act: Act) -> None:
    assert at(req, resp).upstream_closed(answered) is act


def test_every_engine_close_is_decided() -> None:
    assert set(UPSTREAM_CLOSED) == set(Resp)


def framing(length: int | None = None, chunked: bool = False, raw: bool = False) -> Framing:
    f = Framing()
    f.length, f.chunked, f.raw_type = length, chunked, raw
    return f


@pytest.mark.parametrize(
    ("status", "upgraded", "body", "head_req", "what"),
    [
        (100, False, framing(), False, Answer.INTERIM),
        (101, True, framing(), False, Answer.HIJACK),  # attach, exec, session, grpc
        (200, False, framing(raw=True), False, Answer.HIJACK),  # the legacy raw stream
        (200, False, framing(length=5, raw=True), False, Answer.FRAMED),  # raw type, framed
        (200, False, framing(length=5), True, Answer.NO_BODY),  # an answer to HEAD
        (204, False, framing(), False, Answer.NO_BODY),
        (304, False, framing(), False, Answer.NO_BODY),
        (200, False, framing(), False, Answer.UNTIL_CLOSE),
        (200, False, framing(chunked=True), False, Answer.FRAMED),  # logs -f, events
        (404, False, framing(length=30), False, Answer.FRAMED),
    ],
)
def test_what_follows_an_answers_head(
    status: int, upgraded: bool, body: Framing, head_req: bool, what: Answer
) -> None:
    assert answer(status, upgraded, body, head_req) is what
