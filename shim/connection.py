"""One shim connection, sans I/O: both sides' HTTP, bytes in, actions out.

As h11's `Connection`: the client's bytes go in through `receive_client`, the Engine's
through `receive_engine`, socket events through the other methods, and each returns the
actions the transport takes, in order (shim/actions.py, run by shim/splice.py); nothing
here touches a socket, a task or a clock.  Spliced messages stream unchanged, cut only
where llhttp ends one (shim/parser.py), so the next pipelined one starts in the right
place; the interceptor's are read whole (shim/collect.py), then answered or passed on to
stream.  States change only through their tables (shim/states.py).  Hijacks (attach,
exec) become two raw pipes, half-closes passed on; a client's EOF while its answer
streams goes up as a write-EOF (Go's server then cancels the request); what is not
HTTP/1.1 (HTTP/2's prior-knowledge preface among it) is answered 400 in the Engine's
format before a byte of it goes upstream.  docs/design.md has the whole shape.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from shim.actions import Action, Do
from shim.collect import Collector, Intercepted, TooLarge
from shim.framing import MAX_BODY, READ_AHEAD, BadMessage, Response, error_bytes
from shim.headlimit import HeadTooLarge, request_head_end, response_head_end
from shim.parser import Parser
from shim.states import Act, Answer, Conversation, Ev, Exchange, Pause, Req, Resp, answer

log = logging.getLogger(__name__)

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"

# Members every call reads, read once (on 3.11 each `Req.X` runs EnumType's __getattr__).
IDLE, CONNECTING, STREAMING, COLLECTING, RAW, CLOSED = (
    Req.IDLE, Req.CONNECTING, Req.STREAMING, Req.COLLECTING, Req.RAW, Req.CLOSED,
)  # fmt: skip
HEAD, BODY, UNTIL_CLOSE, UP_RAW, UP_COLLECTING = (
    Resp.HEAD, Resp.BODY, Resp.UNTIL_CLOSE, Resp.RAW, Resp.COLLECTING,
)  # fmt: skip
TO_ENGINE, TO_CLIENT, PAUSE, RESUME, CLOSE = (
    Do.TO_ENGINE, Do.TO_CLIENT, Do.PAUSE, Do.RESUME, Do.CLOSE,
)  # fmt: skip
SEND, SEND_PART = Ev.SEND, Ev.SEND_PART
INTERIM, HIJACK, NO_BODY, ENDS_AT_CLOSE = (
    Answer.INTERIM, Answer.HIJACK, Answer.NO_BODY, Answer.UNTIL_CLOSE,
)  # fmt: skip
AHEAD, END, GO_ON = Pause.AHEAD, Act.CLOSE, Act.GO_ON


class Connection:
    """Both sides of one client connection and its upstream, with no I/O: ``wants(method,
    target)`` (cheap, asked of every head) says which requests the interceptor takes, their
    bodies capped at ``max_body``."""

    __slots__ = (
        "ahead", "buf", "client_eof", "collector", "eof_sent", "exchange", "held", "live",
        "max_body", "parser", "pending", "req", "resp", "talk", "ubuf", "up_eof", "uparser",
        "wants",
    )  # fmt: skip

    def __init__(self, wants: Callable[[str, str], bool], max_body: int = MAX_BODY) -> None:
        self.wants = wants
        self.max_body = max_body
        self.talk = Conversation()  # both sides' states and the rules between them
        self.req, self.resp = self.talk.req, self.talk.resp
        self.parser = Parser()  # the client's requests
        self.uparser = Parser(response=True)  # the Engine's answers (one per upstream)
        self.buf = b""  # client bytes not yet passed on
        self.ubuf = b""  # Engine bytes not yet passed on
        self.exchange: Exchange | None = None  # the spliced request being answered
        self.held: tuple[Exchange, int] | None = None  # a head waiting for an upstream
        self.pending: Intercepted | None = None  # the intercepted request being read
        self.collector: Collector | None = None  # `forward`'s answer being read
        self.client_eof = False
        self.live = False  # an upstream connection is open and the Engine has not closed it
        self.up_eof = False  # the Engine half-closed the current upstream connection
        self.eof_sent = False  # the client's EOF went upstream as a write-EOF
        self.ahead = False  # reading the client is paused for the bytes held (AHEAD)

    @property
    def closed(self) -> bool:
        return self.req.state is CLOSED

    @property
    def hijacked(self) -> bool:
        return self.resp.state is UP_RAW

    # -- the client's side

    def receive_client(self, data: bytes) -> list[Action]:
        """Bytes from the client."""
        if self.req.state is RAW:
            return [(TO_ENGINE, data)]
        self.buf = self.buf + data if self.buf else data
        out: list[Action] = []
        self._advance(out)
        return out

    def receive_client_eof(self) -> list[Action]:
        """The client half-closed (shut down writing, or went away)."""
        self.client_eof = True
        out: list[Action] = []
        if self.req.state is Req.INTERCEPTING:
            out.append((Do.GONE, None))  # a waiting create leaves the queue
        act = self.talk.client_eof(self.exchange is not None)
        if act is Act.HALF_CLOSE:
            out.append((Do.EOF_TO_ENGINE, None))
            if not self.live:  # the Engine has closed its side too
                self._end(out)
        elif act is Act.CLOSE:
            self._end(out)
        elif act is Act.PASS_EOF and not self.buf and self.live and not self.eof_sent:
            self.eof_sent = True
            out.append((Do.EOF_TO_ENGINE, None))
        return out

    def answered(self, data: bytes, keep: bool) -> list[Action]:
        """The interceptor's answer (wire bytes); `keep`: the connection goes on after it."""
        if self.closed:
            return []
        out: list[Action] = [(TO_CLIENT, data)]
        if not keep:
            self._end(out)
            return out
        self.req.fire(Ev.ANSWERED)
        self._unpause_ahead(out)
        self._advance(out)
        return out

    def passed_on(self, request: bytes, head_req: bool, keep: bool) -> list[Action]:
        """The interceptor's request (wire bytes) goes up on the open upstream as a spliced
        one, its answer to stream (a hijack included); `keep` as for `answered`."""
        if self.closed:
            return []
        self.exchange = Exchange(head_req, keep)
        self.talk.fire(SEND)
        return [(TO_ENGINE, request)]

    def _advance(self, out: list[Action]) -> None:
        """Make progress on the client's held bytes; what is not HTTP ends the connection."""
        try:
            p = self.parser
            while True:
                state = self.req.state
                buf = self.buf
                if state is IDLE:
                    if not buf:
                        if self.client_eof and self.exchange is None:
                            self._end(out)
                        return
                    end = request_head_end(buf)
                    if not end:
                        return
                    if p.head(buf, end):
                        self._request(out, end)
                    else:  # only the empty lines llhttp skips before a request
                        self.buf = buf[end:]
                elif state is STREAMING:
                    if not buf:
                        return
                    end = p.body(buf, 0)
                    out.append((TO_ENGINE, buf if end == len(buf) else memoryview(buf)[:end]))
                    self.buf = buf[end:]
                    if not p.done:
                        return
                    self.talk.body_sent(answered=self.exchange is None)
                elif state is COLLECTING:
                    if not buf:
                        return
                    self._collected(out, 0)
                else:  # an answer or the interceptor is pending, or the end: hold the bytes
                    if len(buf) > READ_AHEAD and state is not CLOSED and not self.ahead:
                        self.ahead = True
                        out.append((PAUSE, AHEAD))
                    return
        except BadMessage as e:
            self._reply_error(out, 400, f"bad request: {e}")
        except HeadTooLarge as e:
            self._reply_error(out, 431, str(e))
        except TooLarge as e:
            self._reply_error(out, 413, str(e))

    def _request(self, out: list[Action], end: int) -> None:
        """The parser has read a head (buf[:end]): intercept it, or send it on."""
        p = self.parser
        method = p.method.decode("latin-1")
        target = p.url.decode("latin-1")
        try:
            wanted = self.wants(method, target)
        except Exception:
            log.exception("interceptor.wants(%s %s) failed", method, target)
            self._reply_error(out, 500, "gpu-alloc shim: internal error")
            return
        if wanted:
            self._intercept(out, method, target, end)
            return
        exchange = Exchange(method == "HEAD", p.keep_alive)
        if self.live:
            self._send(out, exchange, end)
            return
        self.req.fire(Ev.WAIT_UPSTREAM)
        self.held = (exchange, end)
        out.append((PAUSE, Pause.CONNECT))
        out.append((Do.CONNECT, None))

    def _send(self, out: list[Action], exchange: Exchange, end: int) -> None:
        """Send a request's head and the body bytes at hand; the rest streams later."""
        buf = self.buf
        pos = self.parser.body(buf, end)
        out.append((TO_ENGINE, buf if pos == len(buf) else memoryview(buf)[:pos]))
        self.buf = buf[pos:]
        self.exchange = exchange
        self.talk.fire(SEND if self.parser.done else SEND_PART)

    def _intercept(self, out: list[Action], method: str, target: str, end: int) -> None:
        """Read the body of a request the interceptor wants (its head is buf[:end])."""
        self.pending = wanted = Intercepted(self.parser, method, target, self.max_body)
        if wanted.expects_continue:
            out.append((TO_CLIENT, CONTINUE))
        self.req.fire(Ev.COLLECT)
        self._collected(out, end)

    def _collected(self, out: list[Action], pos: int) -> None:
        """Take the body's bytes from buf[pos:]: hand the request over once it is whole."""
        wanted = self.pending
        assert wanted is not None
        self.buf = self.buf[wanted.feed(self.parser, self.buf, pos) :]
        if self.parser.done:
            self.pending = None
            self.req.fire(Ev.COLLECTED)
            out.append((Do.INTERCEPT, wanted))

    # -- the Engine's side

    def engine_opened(self) -> list[Action]:
        """A new upstream connection is open: a request held for it goes up."""
        self.live, self.up_eof, self.eof_sent = True, False, False
        self.uparser = Parser(response=True)
        self.ubuf = b""
        out: list[Action] = []
        if self.req.state is CONNECTING and self.held is not None:
            exchange, end = self.held
            self.held = None
            try:
                self._send(out, exchange, end)
            except BadMessage as e:
                self._reply_error(out, 400, f"bad request: {e}")
                return out
            out.append((RESUME, Pause.CONNECT))
            self._advance(out)
        return out

    def engine_failed(self, why: str) -> list[Action]:
        """The upstream connection CONNECT asked for could not be made."""
        return self._reply_error([], 502, f"gpu-alloc shim: {why}")

    def receive_engine(self, data: bytes) -> list[Action]:
        """Bytes from the Engine."""
        state = self.resp.state
        if state is UP_RAW:
            return [(TO_CLIENT, data)]
        self.ubuf = self.ubuf + data if self.ubuf else data
        out: list[Action] = []
        if state is UP_COLLECTING:
            self._settle(out, eof=False)
            return out
        try:
            self._answers(out)
        except BadMessage as e:
            log.warning("closing connection: %s", e)
            self._end(out, abort=True)
        return out

    def receive_engine_eof(self) -> list[Action]:
        """The Engine half-closed the upstream connection."""
        self.live, self.up_eof = False, True
        out: list[Action] = []
        if self.resp.state is UP_RAW:
            out.append((Do.EOF_TO_CLIENT, None))
            if self.client_eof:
                self._end(out)
            return out
        self._engine_gone(out)
        return out

    def engine_lost(self) -> list[Action]:
        """The upstream connection is gone (after the Engine's EOF, or without one)."""
        out: list[Action] = []
        if self.resp.state is UP_RAW:
            self._end(out)
        elif not self.up_eof:
            self.live = False
            self._engine_gone(out)
        return out

    def forward(self, request: bytes, head_req: bool) -> list[Action]:
        """`forward` sends a rewritten request upstream; its answer is read whole (SETTLE)."""
        self.collector = Collector(head_req)
        self.resp.fire(Ev.FORWARD)
        return [(TO_ENGINE, request)]

    def forward_ended(self, failed: bool) -> list[Action]:
        """`forward` is done; `failed` (timed out, cut short): its upstream is dropped."""
        self.collector = None
        if self.resp.state is UP_COLLECTING:
            self.resp.fire(Ev.RESPONSE_END)
        out: list[Action] = []
        if failed and not self.closed:
            self._drop(out)
        return out

    def _answers(self, out: list[Action]) -> None:
        resp = self.resp
        p = self.uparser
        while self.ubuf:
            ubuf = self.ubuf
            state = resp.state
            if state is BODY:
                end = p.body(ubuf, 0)
                out.append((TO_CLIENT, ubuf if end == len(ubuf) else memoryview(ubuf)[:end]))
                self.ubuf = ubuf[end:]
                if p.done:
                    self._answer_done(out, p.keep_alive)
                return
            if state is UNTIL_CLOSE:
                out.append((TO_CLIENT, ubuf))
                self.ubuf = b""
                return
            if state is not HEAD:
                raise BadMessage(f"the Engine sent {len(ubuf)} bytes nobody asked for")
            exchange = self.exchange
            assert exchange is not None  # a spliced request went upstream
            end = response_head_end(ubuf)
            if not end:
                return
            if not p.head(ubuf, end):
                self.ubuf = ubuf[end:]
                continue
            exchange.answered = True
            what = answer(p.status, p.upgraded, p.framing, exchange.head_req)
            if what is INTERIM:  # (100 Continue): pass it on
                out.append((TO_CLIENT, memoryview(ubuf)[:end]))
                self.ubuf = ubuf[end:]
                continue
            if what is HIJACK:
                out.append((TO_CLIENT, ubuf))
                self.ubuf = b""
                self._hijack(out)
                return
            if what is NO_BODY:
                if exchange.head_req:
                    p.skip_body()
                out.append((TO_CLIENT, memoryview(ubuf)[:end] if end < len(ubuf) else ubuf))
                self.ubuf = ubuf[end:]
                self._answer_done(out, p.keep_alive)
                return
            if what is ENDS_AT_CLOSE:
                out.append((TO_CLIENT, ubuf))  # delimited by the Engine closing
                self.ubuf = b""
                resp.fire(Ev.UNTIL_CLOSE)
                return
            pos = p.body(ubuf, end)
            out.append((TO_CLIENT, ubuf if pos == len(ubuf) else memoryview(ubuf)[:pos]))
            self.ubuf = ubuf[pos:]
            if p.done:
                self._answer_done(out, p.keep_alive)
                return
            resp.fire(Ev.BODY)

    def _answer_done(self, out: list[Action], keep: bool) -> None:
        exchange = self.exchange
        assert exchange is not None
        self.exchange = None
        if self.ubuf:
            log.warning("the Engine sent %d bytes after a response", len(self.ubuf))
            keep = False
        act = self.talk.answer_ended(keep and exchange.keep and not self.eof_sent)
        if act is END:
            self._end(out)
        elif act is GO_ON:
            if self.ahead:
                self._unpause_ahead(out)
            if self.buf or self.client_eof:
                self._advance(out)

    def _hijack(self, out: list[Action]) -> None:
        """From now on both directions are raw byte pipes; EOFs pass on as write-EOFs."""
        self.talk.fire(Ev.HIJACK)
        out.append((Do.PIPE, None))
        if self.buf:
            out.append((TO_ENGINE, self.buf))
            self.buf = b""
        if self.client_eof and not self.eof_sent:
            self.eof_sent = True
            out.append((Do.EOF_TO_ENGINE, None))
        self._unpause_ahead(out)

    def _engine_gone(self, out: list[Action]) -> None:
        """The Engine closed the upstream connection (outside a hijack)."""
        exchange = self.exchange
        act = self.talk.upstream_closed(bool(exchange and exchange.answered))
        if act is Act.SETTLE:
            self._settle(out, eof=True)
        elif act is Act.REPLY_502:
            log.error("the Engine closed the connection before answering")
            self._reply_error(out, 502, "gpu-alloc shim: the Engine closed the connection")
        elif act is Act.CLOSE:
            self._end(out)  # a truncated exchange: the client must see the connection end
        else:
            self._drop(out)  # idle: reconnect for the next request

    def _settle(self, out: list[Action], eof: bool) -> None:
        """Advance `forward`'s answer; settle it once whole, or once it cannot be."""
        c = self.collector
        if c is None:
            return
        got, self.ubuf = c.take(self.uparser, self.ubuf, eof)
        if isinstance(got, Response) and (not c.keep or self.ubuf or eof):
            self._drop(out)
        if got is not None:
            out.append((Do.SETTLE, got))

    # -- both

    def close(self, abort: bool = False) -> list[Action]:
        """End the connection (the transport saw a side go, or the server stops)."""
        out: list[Action] = []
        self._end(out, abort)
        return out

    def _unpause_ahead(self, out: list[Action]) -> None:
        if self.ahead:
            self.ahead = False
            out.append((RESUME, AHEAD))

    def _drop(self, out: list[Action]) -> None:
        self.live = self.eof_sent = False
        out.append((Do.DROP, None))

    def _reply_error(self, out: list[Action], status: int, message: str) -> list[Action]:
        """Answer in the Engine's error format, and end the connection."""
        if not self.closed:
            out.append((TO_CLIENT, error_bytes(status, message, close=True)))
        self._end(out)
        return out

    def _end(self, out: list[Action], abort: bool = False) -> None:
        if self.req.state is CLOSED:
            return
        self.talk.fire(Ev.CLOSE)
        out.append((Do.ABORT if abort else CLOSE, None))
