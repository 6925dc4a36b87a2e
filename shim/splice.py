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
connection's end); the Engine's answers are framed in shim/response.py, the upstream
connection and `forward` are in shim/upstream.py, intercepted requests in
shim/intercept.py.
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
from shim.intercept import InterceptSide
from shim.parser import Parser
from shim.response import ResponseSide
from shim.states import REQUEST, RESPONSE, Ev, Machine, Req, Resp
from shim.upstream import UpstreamSide

if TYPE_CHECKING:
    from shim.server import Proxy

log = logging.getLogger(__name__)


class Connection(InterceptSide, UpstreamSide, ResponseSide, asyncio.Protocol):
    """One client connection and its upstream connection.

    The common path runs entirely inside data_received callbacks (no task switches): that is
    what keeps the added latency per call small.  Tasks exist only to connect upstream and to
    run the interceptor.
    """

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        self.ct = None
        self.up = None
        self.ut = None
        self.buf = b""  # client bytes not yet forwarded
        self.ubuf = b""  # Engine bytes not yet forwarded
        self.req = Machine(REQUEST, Req.IDLE)
        self.resp = Machine(RESPONSE, Resp.IDLE)
        self.flow = FlowControl()
        self.parser = Parser()
        self.rparser = Parser(response=True)
        self.awaiting = False  # a forwarded request's response is not finished
        self.head_req = False
        self.req_keep = True
        self.rsent = False  # bytes of the current response already went to the client
        self.client_eof = False
        self.eof_sent = False  # the client's EOF went upstream as a write-EOF
        self.size = 0  # intercepted body bytes so far
        self.pending = None
        self.collector = None
        self.task = None
        self.gone = None  # the intercepted request's client left
        self.connecting = None
        self.peer = None

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
        if self.req.state is Req.RAW:
            assert self.ut is not None  # a hijack keeps its upstream until both are closed
            self.ut.write(data)
            return
        self.buf = self.buf + data if self.buf else data
        self.advance()

    def eof_received(self) -> bool:
        self.client_eof = True
        state = self.req.state
        if state is Req.RAW:
            if self.ut is not None and not self.ut.is_closing():
                self.ut.write_eof()
            if self.up is None or self.up.eof:
                self.close()
            return True
        if state is Req.INTERCEPTING and self.gone is not None:
            self.gone.set()  # a waiting create leaves the queue; others finish as before
        if state in (Req.STREAMING, Req.COLLECTING) or (state is Req.IDLE and not self.awaiting):
            self.close()  # nothing to answer, or the request can never be completed
            return False
        if self.awaiting and not self.buf and self.ut is not None and not self.eof_sent:
            # Pass the half-close on: Go's server then cancels a streaming request (events,
            # logs -f) whose client has gone, and still answers one that only shut down writing.
            self.eof_sent = True
            self.ut.write_eof()
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
            if state is Req.IDLE:
                if not buf:
                    if self.client_eof and not self.awaiting:
                        self.close()
                    return
                end = request_head_end(buf)
                if not end:
                    return
                if p.head(buf, end):
                    self._request(end)
                else:  # only the empty lines llhttp skips before a request
                    self.buf = buf[end:]
            elif state is Req.STREAMING:
                if not buf:
                    return
                assert self.ut is not None
                end = p.body(buf, 0)
                self.ut.write(buf if end == len(buf) else memoryview(buf)[:end])
                self.buf = buf[end:]
                if not p.done:
                    return
                self.req.fire(Ev.BODY_SENT)
                if not self.awaiting:  # the Engine answered before the body ended
                    self.req.fire(Ev.RESPONSE_END)
            elif state is Req.COLLECTING:
                if not buf:
                    return
                end = p.body(buf, 0)
                self.size += end
                self.buf = buf[end:]
                self.collected()
            else:  # a response or the interceptor is pending, or the end: hold the bytes
                if len(buf) > READ_AHEAD and state is not Req.CLOSED:
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
            self.start_collect(method, target, p.keep_alive, end)
        elif self.ut is None or self.ut.is_closing() or self.up is None or self.up.eof:
            self.req.fire(Ev.WAIT_UPSTREAM)
            self.flow.pause_client(Pause.CONNECT)
            send = partial(self._send, method == "HEAD", p.keep_alive, end)
            self.task = asyncio.create_task(self._connect_then_send(send))
        else:
            self._send(method == "HEAD", p.keep_alive, end)

    def _send(self, head_req: bool, keep: bool, end: int) -> None:
        """Forward a request's head and the body bytes at hand; the rest streams later."""
        buf = self.buf
        pos = self.parser.body(buf, end)
        assert self.ut is not None
        self.ut.write(buf if pos == len(buf) else memoryview(buf)[:pos])
        self.buf = buf[pos:]
        self.awaiting = True
        self.head_req = head_req
        self.req_keep = keep
        self.rsent = False
        self.resp.fire(Ev.SEND)
        self.req.fire(Ev.SEND if self.parser.done else Ev.SEND_PART)

    async def _connect_then_send(self, send: partial[None]) -> None:
        """Open the upstream connection, then send the held request and carry on."""
        try:
            await self.ensure_upstream()
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
        self.req.fire(Ev.CLOSE)
        self.resp.fire(Ev.CLOSE)
        if self.gone is not None:
            self.gone.set()
        if self.task is not None:
            self.task.cancel()
        if self.collector is not None and not self.collector.future.done():
            self.collector.future.set_exception(Closed("connection closed"))
        if self.ct is not None:
            self.ct.abort() if abort else self.ct.close()
        if self.ut is not None:
            self.ut.abort() if abort else self.ut.close()
        if self.peer is not None:
            self.peer.close()
