"""The byte splice: one client connection and its upstream.

* Everything the interceptor does not want is spliced: the bytes the client sent
  go upstream unchanged and the Engine's bytes come back unchanged.  Bodies
  stream as they arrive, never buffered whole; a full socket on one side pauses
  reading on the other (shim/flow.py).
* Plain asyncio Protocols, not streams: the common exchange runs inside
  data_received callbacks with no task switch: a task switch per exchange would be
  much of the latency the proxy adds.
* One llhttp parser per direction (shim/parser.py) reads every message, and each
  side's state changes only through its table (shim/states.py).
* Hijacks (`101 UPGRADED` for attach/exec/session/grpc, or the legacy `200 OK`
  with a vnd.docker raw/multiplexed stream and no length) turn the connection
  into two raw byte pipes, propagating half-close: `docker run -i` ends stdin
  with a write-EOF while output continues.
* While a response streams (logs -f, events, wait), the client side is still
  read, so a client that goes away is noticed: its EOF is passed upstream as a
  write-EOF (Go's server then cancels the request), and pipelined bytes are held
  (bounded) for the next request.

This module holds the client's side (its transport callbacks, requests, the
connection's end); the Engine's answers are framed in shim/response.py (`Relay`), the
upstream connection and `forward` are in shim/upstream.py (`Link`), intercepted
requests in shim/intercept.py (`Interception`).
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import TYPE_CHECKING

from allocator.host import peers
from shim.flow import FlowControl, Pause
from shim.framing import READ_AHEAD, BadMessage, Closed, UpstreamError, error_bytes
from shim.headlimit import HeadTooLarge, request_head_end
from shim.intercept import Interception
from shim.parser import Parser
from shim.response import Relay
from shim.states import Act, Conversation, Ev, Exchange, Req
from shim.upstream import Link

if TYPE_CHECKING:
    from allocator.host.peers import Peer
    from shim.ports import Settings

log = logging.getLogger(__name__)

# The members every call reads, read once: on Python 3.11 each `Req.X` runs EnumType's
# Python-level __getattr__ hook.
IDLE, STREAMING, COLLECTING, RAW, CLOSED = (
    Req.IDLE, Req.STREAMING, Req.COLLECTING, Req.RAW, Req.CLOSED,
)  # fmt: skip
SEND, SEND_PART = Ev.SEND, Ev.SEND_PART


class Connection(asyncio.Protocol):
    """One client connection: its requests, and (through `link`) its upstream connection.

    The common path runs entirely inside data_received callbacks (no task switches): that is
    what keeps the added latency per call small.  Tasks exist only to connect upstream and to
    run the interceptor.
    """

    def __init__(self, proxy: Settings) -> None:
        self.proxy = proxy
        self.ct: asyncio.Transport | None = None
        self.peer: Peer | None = None
        self.buf = b""  # client bytes not yet forwarded
        self.parser = Parser()
        self.talk = Conversation()  # both sides' states and the rules between them
        self.req = self.talk.req
        self.flow = FlowControl()
        self.relay = Relay(self)  # the Engine's answers, back to the client
        self.link = Link(  # the Engine's side
            proxy.upstream_path,
            proxy.forward_timeout,
            self.flow,
            self.relay,
            self._gone,
            self.talk.resp,
        )
        self.intercepted = Interception(self)
        self.exchange: Exchange | None = None  # the spliced request being answered
        self.client_eof = False
        self.task: asyncio.Task[None] | None = None

    @property
    def closed(self) -> bool:
        return self.req.state is CLOSED

    def _gone(self) -> bool:
        return self.req.state is CLOSED

    # -- client transport callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.ct = transport  # type: ignore[assignment]  # typeshed: BaseTransport, not Transport
        self.flow.attach_client(self.ct)  # type: ignore[arg-type]
        self.peer = peers.of(transport.get_extra_info("socket"))
        self.proxy.conns.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.proxy.conns.discard(self)
        self.close(abort=True)

    def pause_writing(self) -> None:
        self.flow.pause_upstream()

    def resume_writing(self) -> None:
        self.flow.resume_upstream()

    def data_received(self, data: bytes) -> None:
        if self.req.state is RAW:
            ut = self.link.transport
            assert ut is not None  # a hijack keeps its upstream until both are closed
            ut.write(data)
            return
        self.buf = self.buf + data if self.buf else data
        self.advance()

    def eof_received(self) -> bool:
        self.client_eof = True
        ut = self.link.transport
        gone = self.intercepted.gone
        if self.req.state is Req.INTERCEPTING and gone is not None:
            gone.set()  # a waiting create leaves the queue; others finish as before
        act = self.talk.client_eof(self.exchange is not None)
        if act is Act.HALF_CLOSE:
            if ut is not None and not ut.is_closing():
                ut.write_eof()
            if self.link.up is None or self.link.up.eof:
                self.close()
            return True
        if act is Act.CLOSE:
            self.close()
            return False
        if act is Act.PASS_EOF and not self.buf and ut is not None and not self.link.eof_sent:
            self.link.eof_sent = True
            ut.write_eof()
        return True

    # -- requests

    def advance(self) -> None:
        """Make progress on the client's bytes; errors end the connection."""
        try:
            self._advance()
        except BadMessage as e:
            self.reply_error(400, f"bad request: {e}")
        except HeadTooLarge as e:
            self.reply_error(431, str(e))
        except Exception:
            log.exception("proxy error")
            self.close(abort=True)

    def _advance(self) -> None:
        p = self.parser
        while True:
            state = self.req.state
            buf = self.buf
            if state is IDLE:
                if not buf:
                    if self.client_eof and self.exchange is None:
                        self.close()
                    return
                end = request_head_end(buf)
                if not end:
                    return
                if p.head(buf, end):
                    self._request(end)
                else:  # only the empty lines llhttp skips before a request
                    self.buf = buf[end:]
            elif state is STREAMING:
                if not buf:
                    return
                ut = self.link.transport
                assert ut is not None
                end = p.body(buf, 0)
                ut.write(buf if end == len(buf) else memoryview(buf)[:end])
                self.buf = buf[end:]
                if not p.done:
                    return
                self.talk.body_sent(answered=self.exchange is None)
            elif state is COLLECTING:
                if not buf:
                    return
                end = p.body(buf, 0)
                self.buf = buf[end:]
                self.intercepted.collected(end)
            else:  # a response or the interceptor is pending, or the end: hold the bytes
                if len(buf) > READ_AHEAD and state is not CLOSED:
                    self.flow.pause_client(Pause.AHEAD)
                return

    def _request(self, end: int) -> None:
        """The parser has read a head (buf[:end]): intercept it, or send it on."""
        p = self.parser
        method = p.method.decode("latin-1")
        target = p.url.decode("latin-1")
        try:
            wanted = self.proxy.interceptor.wants(method, target)
        except Exception:
            log.exception("interceptor.wants(%s %s) failed", method, target)
            self.reply_error(500, "gpu-alloc shim: internal error")
            return
        if wanted:
            self.intercepted.start(method, target, p.keep_alive, end)
        elif not self.link.live:
            self.req.fire(Ev.WAIT_UPSTREAM)
            self.flow.pause_client(Pause.CONNECT)
            send = partial(self._send, Exchange(method == "HEAD", p.keep_alive), end)
            self.task = asyncio.create_task(self._connect_then_send(send))
        else:
            self._send(Exchange(method == "HEAD", p.keep_alive), end)

    def _send(self, exchange: Exchange, end: int) -> None:
        """Forward a request's head and the body bytes at hand; the rest streams later."""
        buf = self.buf
        pos = self.parser.body(buf, end)
        ut = self.link.transport
        assert ut is not None
        ut.write(buf if pos == len(buf) else memoryview(buf)[:pos])
        self.buf = buf[pos:]
        self.exchange = exchange
        self.talk.fire(SEND if self.parser.done else SEND_PART)

    async def _connect_then_send(self, send: partial[None]) -> None:
        """Open the upstream connection, then send the held request and carry on."""
        try:
            await self.link.ensure()
        except (UpstreamError, Closed) as e:
            log.error("%s", e)
            self.reply_error(502, f"gpu-alloc shim: {e}")
            return
        self.task = None
        if self.closed:
            return
        try:
            send()
        except BadMessage as e:
            self.reply_error(400, f"bad request: {e}")
            return
        self.flow.resume_client(Pause.CONNECT)
        self.advance()

    # -- ending

    def reply_error(self, status: int, message: str) -> None:
        """Answer in the Engine's error format and close the connection."""
        if self.ct is not None and not self.ct.is_closing():
            self.ct.write(error_bytes(status, message, close=True))
        self.close()

    def close(self, *, abort: bool = False) -> None:
        if self.closed:
            return
        self.talk.fire(Ev.CLOSE)
        if self.intercepted.gone is not None:
            self.intercepted.gone.set()
        if self.task is not None:
            self.task.cancel()
        collector = self.link.collector
        if collector is not None and not collector.future.done():
            collector.future.set_exception(Closed("connection closed"))
        if self.ct is not None:
            self.ct.abort() if abort else self.ct.close()
        ut = self.link.transport
        if ut is not None:
            ut.abort() if abort else ut.close()
        if self.peer is not None:
            self.peer.close()
