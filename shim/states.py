"""The states of a shim connection, and the only transitions between them.

A connection has two sides, each a small state machine (as h11's `_state.py` keeps one
per role): the client's requests and the Engine's answers.  Every change of state is an
event fired through `Machine.fire`, which looks the pair (state, event) up in the side's
table and refuses one the table does not hold: a transport bug then ends that
connection with an error instead of splicing bytes in a state nobody designed.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Generic, TypeVar


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
    """An event the side's table has no transition for: a bug in the transport."""


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
