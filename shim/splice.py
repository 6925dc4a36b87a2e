"""The byte splice: one client connection and its upstream, as a pair of state machines.

* Everything the interceptor does not want is spliced: the bytes the client sent
  go upstream unchanged and the Engine's bytes come back unchanged.  Bodies
  stream as they arrive, never buffered whole; a full socket on one side pauses
  reading on the other (asyncio flow control).
* Plain asyncio Protocols, not streams: the common exchange runs inside
  data_received callbacks with no task switch: a task switch per exchange would be
  much of the latency the proxy adds.
* Hijacks (`101 UPGRADED` for attach/exec/session/grpc, or the legacy `200 OK`
  with a vnd.docker raw/multiplexed stream and no length) turn the connection
  into two raw byte pipes, propagating half-close: `docker run -i` ends stdin
  with a write-EOF while output continues.
* While a response streams (logs -f, events, wait), the client side is still
  read, so a client that goes away is noticed: its EOF is passed upstream as a
  write-EOF (Go's server then cancels the request), and pipelined bytes are held
  (bounded) for the next request.

This module holds the client's side (its transport callbacks, request framing, flow
control, the connection's end); the Engine's answers are framed in shim/response.py,
the upstream connection and `forward` are in shim/upstream.py, intercepted requests
in shim/intercept.py.
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import TYPE_CHECKING

import httptools

from allocator.host import peers
from shim.framing import (
    READ_AHEAD,
    UpstreamError,
    _BadMessage,
    _Body,
    _Closed,
    _error_bytes,
    _Framing,
    _Head,
    _parse_request,
    quick_request,
)
from shim.headlimit import HeadTooLarge, request_head_end
from shim.intercept import InterceptSide
from shim.response import ResponseSide
from shim.upstream import (
    _P_AHEAD,
    _P_CONNECT,
    _RQ_BODY,
    _RQ_COLLECT,
    _RQ_CONNECT,
    _RQ_HEAD,
    _RQ_INTERCEPT,
    _RQ_SENT,
    _RS_HEAD,
    _RS_IDLE,
    UpstreamSide,
    _Collector,
    _Upstream,
)

if TYPE_CHECKING:
    from shim.server import _Proxy

log = logging.getLogger(__name__)


class _Client(InterceptSide, UpstreamSide, ResponseSide, asyncio.Protocol):
    """One client connection and its upstream connection, as a pair of state machines.

    The common path runs entirely inside data_received callbacks (no task switches): that is
    what keeps the added latency per call small.  Tasks exist only to connect upstream and to
    run the interceptor.
    """

    def __init__(self, proxy: _Proxy) -> None:
        self.proxy = proxy
        self.ct: asyncio.Transport | None = None
        self.up: _Upstream | None = None
        self.ut: asyncio.Transport | None = None
        self.buf = b""  # client bytes not yet forwarded
        self.ubuf = b""  # Engine bytes not yet forwarded
        self.rq = _RQ_HEAD
        self.rs = _RS_IDLE
        self.body: _Body | None = None  # request body in progress
        self.rbody: _Body | None = None  # response body in progress
        self.awaiting = False  # a forwarded request's response is not finished
        self.head_req = False
        self.req_keep = True
        self.rkeep = True
        self.rsent = False  # bytes of the current response already went to the client
        self.raw = False  # hijacked: both directions are plain byte pipes
        self.client_eof = False
        self.eof_sent = False  # the client's EOF went upstream as a write-EOF
        self.closed = False
        self.cpause = 0
        self.upaused = False
        self.size = 0  # intercepted body bytes so far
        self.pending: tuple[str, str, list[tuple[str, str]], bool, bool] | None = None
        self.collector: _Collector | None = None
        self.task: asyncio.Task[None] | None = None
        self.gone: asyncio.Event | None = None  # the intercepted request's client left
        self.connecting: asyncio.Future[None] | None = None
        self.peer = None

    # -- client transport callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.ct = transport  # type: ignore[assignment]  # typeshed: BaseTransport, not Transport
        self.peer = peers.of(transport.get_extra_info("socket"))
        self.proxy.conns.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.proxy.conns.discard(self)
        self.close(abort=True)

    def pause_writing(self) -> None:
        if self.ut is not None:
            self.ut.pause_reading()
            self.upaused = True

    def resume_writing(self) -> None:
        if self.ut is not None and self.upaused:
            self.ut.resume_reading()
        self.upaused = False

    def data_received(self, data: bytes) -> None:
        if self.raw:
            assert self.ut is not None  # a hijack keeps its upstream until both are closed
            self.ut.write(data)
            return
        if self.rq == _RQ_HEAD and not self.buf and not self.awaiting and self._quick(data):
            return
        self.buf = self.buf + data if self.buf else data
        self.advance()

    def _quick(self, data: bytes) -> bool:
        """Forward a bodiless request the interceptor does not want, recognised by a few
        scans (`framing.quick_request`); False leaves it to the full parse."""
        ut = self.ut
        if ut is None or self.up is None or self.up.eof or ut.is_closing():
            return False
        request = quick_request(data)
        if request is None:
            return False
        try:
            if self.proxy.interceptor.wants(*request):
                return False
        except Exception:
            return False  # the full parse asks again and answers the error
        ut.write(data)
        self.awaiting = True
        self.head_req = request[0] == "HEAD"
        self.req_keep = True
        self.rsent = False
        self.rs = _RS_HEAD
        self.rq = _RQ_SENT
        return True

    def eof_received(self) -> bool:
        self.client_eof = True
        if self.raw:
            if self.ut is not None and not self.ut.is_closing():
                self.ut.write_eof()
            if self.up is None or self.up.eof:
                self.close()
            return True
        if self.rq == _RQ_INTERCEPT and self.gone is not None:
            self.gone.set()  # a waiting create leaves the queue; others finish as before
        if self.rq in (_RQ_BODY, _RQ_COLLECT) or (self.rq == _RQ_HEAD and not self.awaiting):
            self.close()  # nothing to answer, or the request can never be completed
            return False
        if self.awaiting and not self.buf and self.ut is not None and not self.eof_sent:
            # Pass the half-close on: Go's server then cancels a streaming request (events,
            # logs -f) whose client has gone, and still answers one that only shut down writing.
            self.eof_sent = True
            self.ut.write_eof()
        return True

    # -- flow control

    def pause_client(self, reason: int) -> None:
        if not self.cpause and self.ct is not None:
            self.ct.pause_reading()
        self.cpause |= reason

    def resume_client(self, reason: int) -> None:
        if self.cpause & reason:
            self.cpause &= ~reason
            if not self.cpause and self.ct is not None:
                self.ct.resume_reading()

    # -- requests

    def advance(self) -> None:
        """Make progress on the client's bytes; errors end the connection."""
        try:
            self._advance()
        except _BadMessage as e:
            self.reply_error(400, f"bad request: {e}")
        except HeadTooLarge as e:
            self.reply_error(431, str(e))
        except Exception:
            log.exception("proxy error")
            self.close(abort=True)

    def _advance(self) -> None:
        while not self.closed:
            rq = self.rq
            buf = self.buf
            if rq == _RQ_BODY:
                if not buf:
                    return
                body = self.body
                assert body is not None and self.ut is not None
                end = body.take(buf, 0)
                self.ut.write(buf if end == len(buf) else memoryview(buf)[:end])
                self.buf = buf[end:]
                if not body.done:
                    return
                self.body = None
                self.rq = _RQ_SENT if self.awaiting else _RQ_HEAD
            elif rq == _RQ_HEAD:
                if not buf:
                    if self.client_eof and not self.awaiting:
                        self.close()
                    return
                end = request_head_end(buf)
                if not end:
                    return
                self._request(buf, end)
            elif rq == _RQ_COLLECT:
                if not buf:
                    return
                body = self.body
                assert body is not None
                end = body.take(buf, 0)
                self.size += end
                self.buf = buf[end:]
                self._collected()
            else:  # a response or the interceptor is pending: hold the bytes
                if len(buf) > READ_AHEAD:
                    self.pause_client(_P_AHEAD)
                return

    def _request(self, buf: bytes, end: int) -> None:
        parser, head = _parse_request(buf, end)
        try:
            framing = _Framing(head.headers)
        except ValueError as e:
            raise _BadMessage(str(e)) from None
        method = (parser.get_method() if parser is not None else _method(buf)).decode("latin-1")
        target = head.url.decode("latin-1")
        keep = parser.should_keep_alive() if parser is not None else not framing.close
        try:
            wanted = self.proxy.interceptor.wants(method, target)
        except Exception:
            log.exception("interceptor.wants(%s %s) failed", method, target)
            self.reply_error(500, "gpu-alloc shim: internal error")
            return
        if wanted:
            self._start_collect(parser, head, framing, method, target, keep, end)
        elif self.ut is None or self.ut.is_closing() or self.up is None or self.up.eof:
            self.rq = _RQ_CONNECT
            self.pause_client(_P_CONNECT)
            send = partial(self._send, parser, head, framing, method == "HEAD", keep, end)
            self.task = asyncio.create_task(self._connect_then_send(send))
        else:
            self._send(parser, head, framing, method == "HEAD", keep, end)

    def _send(
        self,
        parser: httptools.HttpRequestParser | None,
        head: _Head,
        framing: _Framing,
        head_req: bool,
        keep: bool,
        end: int,
    ) -> None:
        """Forward a request's head and the body bytes at hand; the rest streams later."""
        buf = self.buf
        if framing.length is None and not framing.chunked:
            body = None  # the common GET: no body at all
            pos = end
        else:
            body = _Body(parser, head, framing)
            pos = body.take(buf, end)
        assert self.ut is not None
        self.ut.write(buf if pos == len(buf) else memoryview(buf)[:pos])
        self.buf = buf[pos:]
        self.awaiting = True
        self.head_req = head_req
        self.req_keep = keep
        self.rsent = False
        self.rs = _RS_HEAD
        if body is None or body.done:
            self.rq = _RQ_SENT
        else:
            self.rq = _RQ_BODY
            self.body = body

    async def _connect_then_send(self, send: partial[None]) -> None:
        """Open the upstream connection, then send the held request and carry on."""
        try:
            await self.ensure_upstream()
        except (UpstreamError, _Closed) as e:
            log.error("%s", e)
            self.reply_error(502, f"gpu-alloc shim: {e}")
            return
        self.task = None
        if self.closed:
            return
        try:
            send()
        except _BadMessage as e:
            self.reply_error(400, f"bad request: {e}")
            return
        self.resume_client(_P_CONNECT)
        self.advance()

    # -- ending

    def reply_error(self, status: int, message: str) -> None:
        """Answer in the Engine's error format and close the connection."""
        if self.ct is not None and not self.ct.is_closing():
            self.ct.write(_error_bytes(status, message, close=True))
        self.close()

    def close(self, *, abort: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        if self.gone is not None:
            self.gone.set()
        if self.task is not None:
            self.task.cancel()
        if self.collector is not None and not self.collector.future.done():
            self.collector.future.set_exception(_Closed("connection closed"))
        if self.ct is not None:
            self.ct.abort() if abort else self.ct.close()
        if self.ut is not None:
            self.ut.abort() if abort else self.ut.close()
        if self.peer is not None:
            self.peer.close()


def _method(buf: bytes) -> bytes:
    # After llhttp's upgrade exception get_method() is unavailable; the head parsed, so the
    # method is the first token of the request line.
    return buf.lstrip(b"\r\n").split(b" ", 1)[0]
