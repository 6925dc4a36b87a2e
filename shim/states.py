"""The states of a shim connection, and the only transitions between them.

A connection has two sides, each a small state machine (as h11's `_state.py` keeps one
per role): the client's requests and the Engine's answers.  Every change of state is an
event fired through `Machine.fire`, which looks the pair (state, event) up in the side's
table and refuses one the table does not hold: a bug in the connection (shim/connection.py)
then ends it with an error instead of splicing bytes in a state nobody designed.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Generic, TypeVar

from shim.framing import NO_BODY_STATUS, Framing


class Pause(enum.Flag):
    """Why reading from the client is paused (shim/flow.py pauses and resumes it)."""

    PEER = enum.auto()  # the Engine's socket is full
    AHEAD = enum.auto()  # enough pipelined bytes held
    CONNECT = enum.auto()  # no upstream yet


class Req(enum.Enum):
    """Where the client's side of a connection is."""

    __hash__ = object.__hash__  # members are singletons; Enum's own hash runs Python code

    IDLE = "idle"  # waiting for a request head
    CONNECTING = "connecting"  # a head waits for the upstream connection
    STREAMING = "streaming"  # a spliced request's body is streaming upstream
    SENT = "sent"  # a spliced request is sent, its answer unfinished: later bytes are held
    COLLECTING = "collecting"  # buffering an intercepted request's body
    INTERCEPTING = "intercepting"  # the interceptor is handling a request
    RAW = "raw"  # hijacked: the client's bytes go upstream as they come
    CLOSED = "closed"


class Resp(enum.Enum):
    """Where the Engine's side of a connection is."""

    __hash__ = object.__hash__

    IDLE = "idle"  # nothing asked of the Engine
    HEAD = "head"  # waiting for the head of a spliced request's answer
    BODY = "body"  # passing on a framed body
    UNTIL_CLOSE = "until close"  # passing on a body the Engine ends by closing
    COLLECTING = "collecting"  # buffering an answer for `forward`
    RAW = "raw"  # hijacked: the Engine's bytes go to the client as they come
    CLOSED = "closed"


class Ev(enum.Enum):
    """What happens to a connection."""

    __hash__ = object.__hash__

    WAIT_UPSTREAM = "wait upstream"  # a spliced head found no upstream connection
    SEND = "send"  # a spliced request went upstream whole
    SEND_PART = "send part"  # a spliced head went upstream, its body to follow
    BODY_SENT = "body sent"  # the rest of a spliced body went upstream
    COLLECT = "collect"  # the interceptor wants the request
    COLLECTED = "collected"  # its body is whole: the interceptor runs
    ANSWERED = "answered"  # the interceptor's answer is written
    RESPONSE_END = "response end"  # a spliced answer ended
    FORWARD = "forward"  # `forward` sent a request and reads its answer
    BODY = "body"  # a framed body follows the head just passed on
    UNTIL_CLOSE = "until close"  # a body the Engine ends by closing follows
    HIJACK = "hijack"  # both sides become raw byte pipes
    CLOSE = "close"


class Exchange:
    """A spliced request on its way: what passing its answer on needs to know."""

    __slots__ = ("answered", "head_req", "keep")

    def __init__(self, head_req: bool, keep: bool) -> None:
        self.head_req = head_req  # a HEAD request: its answer has no body
        self.keep = keep  # the client keeps the connection alive after it
        self.answered = False  # bytes of its answer went to the client


S = TypeVar("S", Req, Resp)


class ProtocolError(Exception):
    """An event the side's table has no transition for: a bug in the connection."""


class Machine(Generic[S]):
    """One side's state, changed only by `fire`."""

    __slots__ = ("state", "table")
    state: S
    table: Mapping[tuple[S, Ev], S]

    def __init__(self, table: Mapping[tuple[S, Ev], S], start: S) -> None:
        self.table = table
        self.state = start

    def fire(self, event: Ev) -> S:
        """Move to the state the table gives for (state, event); ProtocolError if none."""
        try:
            self.state = self.table[self.state, event]
        except KeyError:
            raise ProtocolError(f"{event.value} while {self.state.value}") from None
        return self.state


def _closing(states: type[Req] | type[Resp]) -> dict[tuple[S, Ev], S]:
    return {(s, Ev.CLOSE): states.CLOSED for s in states}  # type: ignore[misc]


REQUEST: Mapping[tuple[Req, Ev], Req] = {
    (Req.IDLE, Ev.WAIT_UPSTREAM): Req.CONNECTING,
    (Req.IDLE, Ev.SEND): Req.SENT,
    (Req.IDLE, Ev.SEND_PART): Req.STREAMING,
    (Req.CONNECTING, Ev.SEND): Req.SENT,
    (Req.CONNECTING, Ev.SEND_PART): Req.STREAMING,
    (Req.STREAMING, Ev.BODY_SENT): Req.SENT,
    (Req.SENT, Ev.RESPONSE_END): Req.IDLE,
    (Req.IDLE, Ev.COLLECT): Req.COLLECTING,
    (Req.COLLECTING, Ev.COLLECTED): Req.INTERCEPTING,
    (Req.INTERCEPTING, Ev.ANSWERED): Req.IDLE,
    (Req.INTERCEPTING, Ev.SEND): Req.SENT,  # passed on: its answer streams
    (Req.SENT, Ev.HIJACK): Req.RAW,
    (Req.STREAMING, Ev.HIJACK): Req.RAW,
    **_closing(Req),
}

RESPONSE: Mapping[tuple[Resp, Ev], Resp] = {
    (Resp.IDLE, Ev.SEND): Resp.HEAD,
    (Resp.HEAD, Ev.BODY): Resp.BODY,
    (Resp.HEAD, Ev.UNTIL_CLOSE): Resp.UNTIL_CLOSE,
    (Resp.HEAD, Ev.RESPONSE_END): Resp.IDLE,
    (Resp.BODY, Ev.RESPONSE_END): Resp.IDLE,
    (Resp.IDLE, Ev.FORWARD): Resp.COLLECTING,
    (Resp.COLLECTING, Ev.RESPONSE_END): Resp.IDLE,
    (Resp.HEAD, Ev.HIJACK): Resp.RAW,
    **_closing(Resp),
}


# -- both sides: the cross-side rules

# Events of the whole connection and what each side sees of them: a spliced request going
# up opens an answer on the Engine's side; a hijack and a close take both sides at once.
BOTH: Mapping[Ev, tuple[Ev, Ev]] = {
    Ev.SEND: (Ev.SEND, Ev.SEND),
    Ev.SEND_PART: (Ev.SEND_PART, Ev.SEND),
    Ev.HIJACK: (Ev.HIJACK, Ev.HIJACK),
    Ev.CLOSE: (Ev.CLOSE, Ev.CLOSE),
}


class Act(enum.Enum):
    """What the connection's I/O does next, as the cross-side rules decide it."""

    __hash__ = object.__hash__

    GO_ON = "go on"  # nothing to end: carry on with the bytes held, if any
    WAIT = "wait"  # nothing to do until more happens
    PASS_EOF = "pass eof"  # pass the client's half-close upstream as a write-EOF
    HALF_CLOSE = "half close"  # hijacked: pass the EOF on; end once both sides have
    SETTLE = "settle"  # settle `forward`'s answer with what came
    DROP = "drop"  # forget the upstream connection: the next request opens a new one
    REPLY_502 = "reply 502"  # the Engine went away before answering: say so, and end
    CLOSE = "close"  # end the connection


# The client half-closed, by its side's state and whether a spliced answer is awaited: a
# request that can never be completed, or nothing to answer, ends the connection; an
# awaited answer goes on, the EOF passed upstream (Go's server then cancels a streaming
# request whose client has gone, and still answers one that only shut down writing); an
# intercepted request or an upstream connection being made is finished as before.
CLIENT_EOF: Mapping[tuple[Req, bool], Act] = {
    **{(s, False): Act.WAIT for s in Req},
    **{(s, True): Act.PASS_EOF for s in Req},
    (Req.IDLE, False): Act.CLOSE,
    (Req.STREAMING, False): Act.CLOSE,
    (Req.STREAMING, True): Act.CLOSE,
    (Req.COLLECTING, False): Act.CLOSE,
    (Req.COLLECTING, True): Act.CLOSE,
    (Req.RAW, False): Act.HALF_CLOSE,
    (Req.RAW, True): Act.HALF_CLOSE,
}

# The Engine closed the upstream connection outside a hijack, by its side's state: a
# buffered answer is settled, a head never answered is a 502, a body cut short ends the
# connection (the client must see it end), and an idle connection is just reopened later.
UPSTREAM_CLOSED: Mapping[Resp, Act] = {
    Resp.IDLE: Act.DROP,
    Resp.HEAD: Act.REPLY_502,
    Resp.BODY: Act.CLOSE,
    Resp.UNTIL_CLOSE: Act.CLOSE,
    Resp.COLLECTING: Act.SETTLE,
    Resp.RAW: Act.CLOSE,
    Resp.CLOSED: Act.CLOSE,
}


# Read once: on Python 3.11 each `Req.X` runs EnumType's Python-level __getattr__ hook.
_SENT, _STREAMING, _RESPONSE_END, _BODY_SENT = (
    Req.SENT,
    Req.STREAMING,
    Ev.RESPONSE_END,
    Ev.BODY_SENT,
)
_GO_ON, _WAIT, _CLOSE = Act.GO_ON, Act.WAIT, Act.CLOSE


class Conversation:
    """Both sides of one connection and the rules between them, with no I/O: events in,
    what to do out (h11's `ConnectionState` is the model).  The connection
    (shim/connection.py) acts on the `Act`s; every change of state still goes through a
    side's table."""

    __slots__ = ("req", "resp")

    def __init__(self) -> None:
        self.req = Machine(REQUEST, Req.IDLE)
        self.resp = Machine(RESPONSE, Resp.IDLE)

    def fire(self, event: Ev) -> None:
        """An event of the whole connection (BOTH): each side moves by its own table."""
        on_req, on_resp = BOTH[event]
        self.req.fire(on_req)
        self.resp.fire(on_resp)

    def answer_ended(self, reuse: bool) -> Act:
        """A spliced answer ended; `reuse` says both peers keep the connection alive and
        the client has not half-closed.  The client's next request may be read only once
        its last one went up whole (a body still streaming ends it later: body_sent)."""
        self.resp.fire(_RESPONSE_END)
        if not reuse:
            return _CLOSE
        if self.req.state is _SENT:
            self.req.fire(_RESPONSE_END)
            return _GO_ON
        return _WAIT

    def body_sent(self, answered: bool) -> None:
        """A spliced request's body went up whole; `answered` if its answer already ended."""
        self.req.fire(_BODY_SENT)
        if answered:
            self.req.fire(_RESPONSE_END)

    def client_eof(self, awaiting: bool) -> Act:
        """The client half-closed; `awaiting` if a spliced answer is still to come."""
        return CLIENT_EOF[self.req.state, awaiting]

    def upstream_closed(self, answered: bool) -> Act:
        """The Engine closed the connection outside a hijack; `answered` if some of the
        current answer already reached the client (then it is cut short, not missing)."""
        act = UPSTREAM_CLOSED[self.resp.state]
        if act is Act.REPLY_502 and answered:
            return _CLOSE
        if act is Act.DROP and self.req.state is _STREAMING:
            return _CLOSE  # the request it was sending is cut short
        return act


class Answer(enum.Enum):
    """What follows the head of a spliced request's answer."""

    __hash__ = object.__hash__

    INTERIM = "interim"  # a 1xx other than 101 (100 Continue): passed on, a head follows
    HIJACK = "hijack"  # both sides become raw byte pipes
    NO_BODY = "no body"  # an answer to HEAD, or a status that has none
    UNTIL_CLOSE = "until close"  # a body the Engine ends by closing the connection
    FRAMED = "framed"  # a body with a length or chunks


_INTERIM, _HIJACK, _NO_BODY, _UNTIL_CLOSE, _FRAMED = (
    Answer.INTERIM, Answer.HIJACK, Answer.NO_BODY, Answer.UNTIL_CLOSE, Answer.FRAMED,
)  # fmt: skip


def answer(status: int, upgraded: bool, framing: Framing, head_req: bool) -> Answer:
    """What follows an answer's head, from the head and whether the request was HEAD: an
    upgrade (`101`) or the legacy raw stream (`200` with a vnd.docker raw type and no
    length) is a hijack whatever was asked; an answer to HEAD has no body whatever it says."""
    if 100 <= status < 200 and status != 101:
        return _INTERIM
    if (
        status == 101
        or upgraded
        or (status == 200 and framing.raw_type and framing.length is None and not framing.chunked)
    ):
        return _HIJACK
    if head_req or status in NO_BODY_STATUS:
        return _NO_BODY
    if not framing.chunked and framing.length is None:
        return _UNTIL_CLOSE
    return _FRAMED
