"""The shim's transport: a transparent HTTP/1.1 proxy from a unix socket to the Engine's.

Why it is shaped this way:

* The Go docker client and docker-py keep connections alive, so any request on a connection
  may be the one the interceptor wants: every request head is parsed (llhttp, via httptools)
  and offered to `Interceptor.wants`.
* Everything else is spliced: the bytes the client sent go upstream unchanged and the Engine's
  bytes come back unchanged.  httptools validates heads; body boundaries come from the framing
  (Content-Length, or a small chunk scanner that finds where a chunked body ends in the raw
  bytes, cross-checked by llhttp), so pipelined requests split correctly and nothing is
  re-encoded.  Bodies stream as they arrive, never buffered whole; a full socket on one side
  pauses reading on the other (asyncio flow control).
* Plain asyncio Protocols, not streams: the common exchange runs inside data_received
  callbacks with no task switch, which roughly halves the latency the proxy adds.
* One upstream connection per client connection, opened lazily and reopened when the Engine
  closed it between requests, so the Engine sees the client's connection pattern.
* Hijacks (`101 UPGRADED` for attach/exec/session/grpc, or the legacy `200 OK` with a
  vnd.docker raw/multiplexed stream and no length) turn the connection into two raw byte pipes,
  propagating half-close: `docker run -i` ends stdin with a write-EOF while output continues.
* While a response streams (logs -f, events, wait), the client side is still read, so a client
  that goes away is noticed: its EOF is passed upstream as a write-EOF (Go's server then cancels
  the request), and pipelined bytes are held (bounded) for the next request.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import json
import logging
import os
import re
import signal
import stat
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Protocol

import httptools

log = logging.getLogger(__name__)

MAX_HEAD = 64 * 1024  # Go's default MaxHeaderBytes is 1 MiB; Docker's clients send < 4 KiB.
MAX_BODY = 16 * 1024 * 1024  # cap for intercepted request bodies and forwarded responses
READ_AHEAD = 256 * 1024  # client bytes kept while a response streams (pipelining)
FORWARD_TIMEOUT = 120.0

_CRLF2 = b"\r\n\r\n"
_HEX = re.compile(rb"[0-9A-Fa-f]{1,15}")
# Hop-by-hop headers: `forward` rebuilds the request and owns the framing and the connection.
_HOP = frozenset(
    {
        "connection",
        "content-length",
        "expect",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
_HIJACK_TYPES = (b"application/vnd.docker.raw-stream", b"application/vnd.docker.multiplexed-stream")
_NO_BODY_STATUS = frozenset({204, 304})


@dataclass
class Request:
    """A complete, buffered request (Transfer-Encoding already undone)."""

    method: str
    target: str  # raw request-target as received, e.g. "/v1.41/containers/create?name=x"
    headers: list[tuple[str, str]]
    body: bytes


@dataclass
class Response:
    """A complete, buffered response (Transfer-Encoding already undone)."""

    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes


Forward = Callable[[Request], Awaitable[Response]]


class Interceptor(Protocol):
    def wants(self, method: str, target: str) -> bool:
        """Cheap and synchronous: called on every request head."""
        ...

    async def handle(self, request: Request, forward: Forward) -> Response:
        """Answer `request`; `forward` sends a (rewritten) request to the Engine."""
        ...


class UpstreamError(Exception):
    """`forward` could not complete an exchange with the Engine.

    `maybe_delivered` is False only when the request certainly never reached the Engine
    (connecting failed); otherwise the Engine may have acted on it (the connection dropped or
    the timeout fired after the request was written), so the outcome is ambiguous.
    """

    def __init__(self, message: str, *, maybe_delivered: bool) -> None:
        super().__init__(message)
        self.maybe_delivered = maybe_delivered


class _BadMessage(Exception):
    """Malformed or oversized HTTP from a peer: the connection cannot continue."""


class _Closed(Exception):
    """A peer closed the connection in the middle of a message."""


# --- parsing -------------------------------------------------------------------------------


class _Head:
    """httptools callbacks for one message; no on_body, so bodies cost no Python calls."""

    __slots__ = ("complete", "headers", "reason", "url")

    def __init__(self) -> None:
        self.url = b""
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.complete = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_status(self, reason: bytes) -> None:
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_message_complete(self) -> None:
        self.complete = True


class _Framing:
    """What a head says about its body and its connection."""

    __slots__ = ("chunked", "close", "length", "raw_type", "upgrade")

    def __init__(self, headers: list[tuple[bytes, bytes]]) -> None:
        self.length: int | None = None
        self.chunked = False
        self.close = False
        self.upgrade = False
        self.raw_type = False
        te = None
        for name, value in headers:
            n = name.lower()
            if n == b"content-length":
                self.length = int(value)  # llhttp accepted it: digits only, not repeated
            elif n == b"transfer-encoding":
                te = value.lower()
            elif n == b"connection":
                tokens = value.lower()
                self.close = self.close or b"close" in tokens
                self.upgrade = self.upgrade or b"upgrade" in tokens
            elif n == b"content-type":
                self.raw_type = value.lower().startswith(_HIJACK_TYPES)
        if te is not None:
            self.length = None
            # A request's coding must end in chunked (llhttp enforces it); a response whose
            # coding does not is read until close.
            self.chunked = te.rstrip().endswith(b"chunked")


class _Chunks:
    """Finds where a chunked body ends inside raw bytes, optionally collecting its data.

    The bytes themselves are forwarded untouched; llhttp checks the same bytes, and the two
    must agree on where the message ends (see _Body).
    """

    __slots__ = ("crlf", "done", "left", "line", "trailer")

    def __init__(self) -> None:
        self.left = 0  # data bytes still to come in the current chunk
        self.crlf = 0  # bytes of the CRLF after the chunk's data still to come
        self.line = b""  # partial size or trailer line
        self.trailer = False
        self.done = False

    def scan(self, buf: bytes, pos: int, parts: list[bytes] | None) -> int:
        """Consume body bytes from buf[pos:]; return where the body (or buf) ends."""
        n = len(buf)
        while pos < n and not self.done:
            if self.left:
                take = min(self.left, n - pos)
                if parts is not None:
                    parts.append(buf[pos : pos + take])
                self.left -= take
                pos += take
                continue
            if self.crlf:
                take = min(self.crlf, n - pos)
                self.crlf -= take
                pos += take
                continue
            nl = buf.find(b"\n", pos)
            if nl < 0:
                self.line += buf[pos:]
                if len(self.line) > 4096:
                    raise _BadMessage("chunk line too long")
                return n
            line = self.line + buf[pos:nl] if self.line else buf[pos:nl]
            self.line = b""
            pos = nl + 1
            if not line.endswith(b"\r"):
                raise _BadMessage("bare LF in chunked body")
            if self.trailer:
                self.done = line == b"\r"
                continue
            size = line[:-1].split(b";", 1)[0]
            if not _HEX.fullmatch(size):
                raise _BadMessage("bad chunk size")
            self.left = int(size, 16)
            if self.left:
                self.crlf = 2
            else:
                self.trailer = True
        return pos


class _Body:
    """Tracks one message body through successive buffers."""

    __slots__ = ("chunks", "head", "left", "parser", "parts")

    def __init__(
        self,
        parser: httptools.HttpRequestParser | httptools.HttpResponseParser | None,
        head: _Head,
        framing: _Framing,
        parts: list[bytes] | None = None,
    ) -> None:
        # parser is None when llhttp has stopped (an upgrade request): the framing still
        # follows Go's server, which reads such a request's body by its length.
        self.parser = parser
        self.head = head
        self.chunks = _Chunks() if framing.chunked else None
        self.left = framing.length or 0
        self.parts = parts

    @property
    def done(self) -> bool:
        return self.chunks.done if self.chunks is not None else self.left == 0

    def take(self, buf: bytes, pos: int) -> int:
        """Consume what belongs to this body from buf[pos:]; return the end offset."""
        if self.chunks is None:  # Content-Length: opaque bytes, nothing for llhttp to check
            end = pos + min(self.left, len(buf) - pos)
            self.left -= end - pos
            if self.parts is not None and end > pos:
                self.parts.append(buf[pos:end])
            return end
        end = self.chunks.scan(buf, pos, self.parts)
        if self.parser is not None:
            if end > pos:
                try:
                    self.parser.feed_data(memoryview(buf)[pos:end])
                except httptools.HttpParserUpgrade:
                    pass
                except httptools.HttpParserError as e:
                    raise _BadMessage(str(e)) from None
            if self.head.complete != self.chunks.done:
                raise _BadMessage("chunked framing disagrees with llhttp")
        return end


def _parse_request(buf: bytes, end: int) -> tuple[httptools.HttpRequestParser | None, _Head]:
    """Parse a request head; the parser is None when llhttp switched to upgrade mode."""
    head = _Head()
    parser = httptools.HttpRequestParser(head)
    try:
        parser.feed_data(memoryview(buf)[:end])
    except httptools.HttpParserUpgrade:
        return None, head
    except httptools.HttpParserError as e:
        raise _BadMessage(str(e)) from None
    return parser, head


def _parse_response(buf: bytes, end: int) -> tuple[httptools.HttpResponseParser | None, _Head]:
    head = _Head()
    parser = httptools.HttpResponseParser(head)
    try:
        parser.feed_data(memoryview(buf)[:end])
    except httptools.HttpParserUpgrade:
        return None, head
    except httptools.HttpParserError as e:
        raise _BadMessage(f"bad response from the Engine: {e}") from None
    return parser, head


def _error_bytes(status: int, message: str, *, close: bool) -> bytes:
    """A response in the Engine's error format, {"message": ...}."""
    body = json.dumps({"message": message}).encode()
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
    )
    if close:
        head += "Connection: close\r\n"
    return head.encode("latin-1") + b"\r\n" + body


def _check_token(text: str, what: str) -> str:
    if not text or any(c in text for c in " \r\n\0"):
        raise ValueError(f"invalid {what}: {text!r}")
    return text


def _check_value(text: str, what: str) -> str:
    if any(c in text for c in "\r\n\0"):
        raise ValueError(f"invalid {what}: {text!r}")
    return text


def _encode_request(req: Request) -> bytes:
    """The wire form of a rewritten request: fresh Content-Length, no hop-by-hop headers."""
    lines = [f"{_check_token(req.method, 'method')} {_check_token(req.target, 'target')} HTTP/1.1"]
    for name, value in req.headers:
        if name.lower() not in _HOP:
            lines.append(f"{_check_token(name, 'header name')}: {_check_value(value, 'header')}")
    if req.body or req.method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
        lines.append(f"Content-Length: {len(req.body)}")
    lines.append("\r\n")
    return "\r\n".join(lines).encode("latin-1") + req.body


def _encode_response(resp: Response, *, head_only: bool, close: bool) -> bytes:
    reason = _check_value(resp.reason or HTTPStatus(resp.status).phrase, "reason")
    lines = [f"HTTP/1.1 {resp.status} {reason}"]
    for name, value in resp.headers:
        if name.lower() not in _HOP:
            lines.append(f"{_check_token(name, 'header name')}: {_check_value(value, 'header')}")
    no_body = resp.status in _NO_BODY_STATUS or resp.status < 200
    if not no_body:
        lines.append(f"Content-Length: {len(resp.body)}")
    if close:
        lines.append("Connection: close")
    lines.append("\r\n")
    head = "\r\n".join(lines).encode("latin-1")
    return head if head_only or no_body else head + resp.body


def _keep_alive(head: bytes, framing: _Framing) -> bool:
    """Whether a response (head bytes start with the status line) leaves the connection open."""
    return not framing.close and head.startswith(b"HTTP/1.1")


# --- one client connection -----------------------------------------------------------------

# Request side states.
_RQ_HEAD = 0  # waiting for a request head
_RQ_CONNECT = 1  # head waiting for the upstream connection
_RQ_BODY = 2  # streaming a request body upstream
_RQ_SENT = 3  # request sent, its response not finished: later bytes are held
_RQ_COLLECT = 4  # buffering an intercepted request's body
_RQ_INTERCEPT = 5  # the interceptor is handling a request
# Response side states.
_RS_IDLE = 0
_RS_HEAD = 1
_RS_BODY = 2
_RS_UNTIL_CLOSE = 3
_RS_COLLECT = 4  # reading a response for `forward`
# Reasons to pause reading from the client (a bit each).
_P_PEER = 1  # the Engine's socket is full
_P_AHEAD = 2  # enough pipelined bytes held
_P_CONNECT = 4  # no upstream yet


class _Collector:
    """A response being buffered for `forward`."""

    __slots__ = ("body", "future", "head", "head_req", "keep", "parser", "parts", "size", "status")

    def __init__(self, future: asyncio.Future[Response], head_req: bool) -> None:
        self.future = future
        self.head_req = head_req
        self.head: _Head | None = None
        self.parser: httptools.HttpResponseParser | None = None
        self.body: _Body | None = None  # None after the head: delimited by close
        self.parts: list[bytes] = []
        self.size = 0
        self.status = 0
        self.keep = True


class _Upstream(asyncio.Protocol):
    """The Engine side of a connection: everything is handed to the owning _Client."""

    __slots__ = ("client", "eof", "transport")

    def __init__(self, client: _Client) -> None:
        self.client = client
        self.eof = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.client.up_data(self, data)

    def eof_received(self) -> bool:
        self.eof = True
        return self.client.up_eof(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.up_lost(self)

    def pause_writing(self) -> None:
        self.client.pause_client(_P_PEER)

    def resume_writing(self) -> None:
        self.client.resume_client(_P_PEER)


class _Client(asyncio.Protocol):
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
        self.connecting: asyncio.Future[None] | None = None

    # -- client transport callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.ct = transport  # type: ignore[assignment]
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
            self.ut.write(data)  # type: ignore[union-attr]
            return
        self.buf = self.buf + data if self.buf else data
        self.advance()

    def eof_received(self) -> bool:
        self.client_eof = True
        if self.raw:
            if self.ut is not None and not self.ut.is_closing():
                self.ut.write_eof()
            if self.up is None or self.up.eof:
                self.close()
            return True
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
                end = buf.find(_CRLF2)
                if end < 0:
                    if len(buf) > MAX_HEAD:
                        self.reply_error(431, "request header section too large")
                    return
                self._request(buf, end + 4)
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
            self.task = asyncio.create_task(
                self._connect_then_send(parser, head, framing, method == "HEAD", keep, end)
            )
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

    async def _connect_then_send(self, *request: object) -> None:
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
            self._send(*request)  # type: ignore[arg-type]
        except _BadMessage as e:
            self.reply_error(400, f"bad request: {e}")
            return
        self.resume_client(_P_CONNECT)
        self.advance()

    # -- interception

    def _start_collect(
        self,
        parser: httptools.HttpRequestParser | None,
        head: _Head,
        framing: _Framing,
        method: str,
        target: str,
        keep: bool,
        end: int,
    ) -> None:
        cap = self.proxy.max_body
        if framing.length is not None and framing.length > cap:
            self.reply_error(413, f"request body too large for gpu-alloc (limit {cap} bytes)")
            return
        headers = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in head.headers]
        if any(n.lower() == "expect" and v.lower() == "100-continue" for n, v in headers):
            self.ct.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # type: ignore[union-attr]
        self.pending = (method, target, headers, keep, method == "HEAD")
        self.body = _Body(parser, head, framing, [])
        buf = self.buf
        pos = self.body.take(buf, end)
        self.size = pos - end
        self.buf = buf[pos:]
        self.rq = _RQ_COLLECT
        self._collected()

    def _collected(self) -> None:
        body = self.body
        assert body is not None and body.parts is not None and self.pending is not None
        if self.size > self.proxy.max_body:
            limit = self.proxy.max_body
            self.reply_error(413, f"request body too large for gpu-alloc (limit {limit} bytes)")
            return
        if not body.done:
            return
        method, target, headers, keep, head_req = self.pending
        self.body = self.pending = None
        self.rq = _RQ_INTERCEPT
        request = Request(method, target, headers, b"".join(body.parts))
        self.task = asyncio.create_task(self._intercept(request, keep, head_req))

    async def _intercept(self, request: Request, keep: bool, head_req: bool) -> None:
        started = time.monotonic()
        try:
            response = await self.proxy.interceptor.handle(request, self.forward)
            out = _encode_response(response, head_only=head_req, close=not keep)
            status = response.status
        except Exception as e:
            if isinstance(e, UpstreamError):
                log.error("%s %s: Engine exchange failed: %s", request.method, request.target, e)
                msg = f"gpu-alloc shim: the Engine did not answer: {e}"
            else:
                log.exception("%s %s: interceptor failed", request.method, request.target)
                msg = f"gpu-alloc shim: internal error: {type(e).__name__}: {e}"
            status = 500
            out = _error_bytes(500, msg, close=not keep)
        elapsed = (time.monotonic() - started) * 1000
        log.info("%s %s -> %d (%.1f ms)", request.method, request.target, status, elapsed)
        self.task = None
        if self.closed:
            return
        self.ct.write(out)  # type: ignore[union-attr]
        if not keep:
            self.close()
            return
        self.rq = _RQ_HEAD
        self.resume_client(_P_AHEAD)
        self.advance()

    async def forward(self, request: Request, *, timeout: float | None = None) -> Response:
        """Send `request` on this connection's upstream; return the whole response."""
        raw = _encode_request(request)
        limit = self.proxy.forward_timeout if timeout is None else timeout
        written = False
        try:
            async with asyncio.timeout(limit):
                await self.ensure_upstream()
                assert self.ut is not None
                future: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
                self.collector = _Collector(future, request.method == "HEAD")
                self.rs = _RS_COLLECT
                self.ut.write(raw)
                written = True
                return await future
        except (TimeoutError, OSError, _Closed, _BadMessage) as e:
            self.drop_upstream()
            what = "timed out" if isinstance(e, TimeoutError) else f"failed: {e}"
            raise UpstreamError(
                f"{request.method} {request.target} {what}", maybe_delivered=written
            ) from e
        finally:
            self.collector = None
            if self.rs == _RS_COLLECT:
                self.rs = _RS_IDLE

    def _collect(self, eof: bool = False) -> None:
        """Advance the buffered response for `forward`; settle its future when complete."""
        c = self.collector
        assert c is not None
        if c.future.done():
            return
        try:
            while c.head is None:
                end = self.ubuf.find(_CRLF2)
                if end < 0:
                    if eof:
                        raise _Closed("the Engine closed the connection before answering")
                    if len(self.ubuf) > MAX_HEAD:
                        raise _BadMessage("response header section too large")
                    return
                end += 4
                parser, head = _parse_response(self.ubuf, end)
                if parser is None:
                    raise _BadMessage("the Engine switched protocols on a forwarded request")
                status = parser.get_status_code()
                if status >= 200:
                    framing = _Framing(head.headers)
                    c.head, c.parser, c.status = head, parser, status
                    c.keep = _keep_alive(self.ubuf, framing)
                    if c.head_req or status in _NO_BODY_STATUS:
                        c.body = _Body(None, head, _Framing([]))
                    elif framing.chunked or framing.length is not None:
                        if (framing.length or 0) > MAX_BODY:
                            raise _BadMessage("response too large")
                        c.body = _Body(parser, head, framing, c.parts)
                        pos = c.body.take(self.ubuf, end)
                        c.size = pos - end
                        self.ubuf = self.ubuf[pos:]
                        break
                    else:
                        c.keep = False
                self.ubuf = self.ubuf[end:]
            if c.body is not None:
                if self.ubuf and not c.body.done:
                    pos = c.body.take(self.ubuf, 0)
                    c.size += pos
                    self.ubuf = self.ubuf[pos:]
                if c.size > MAX_BODY:
                    raise _BadMessage("response too large")
                if not c.body.done:
                    if eof:
                        raise _Closed("the Engine closed the connection inside a response")
                    return
            else:
                c.parts.append(self.ubuf)
                c.size += len(self.ubuf)
                self.ubuf = b""
                if c.size > MAX_BODY:
                    raise _BadMessage("response too large")
                if not eof:
                    return
        except (_Closed, _BadMessage) as e:
            c.future.set_exception(e)
            return
        head = c.head
        if not c.keep or self.ubuf or eof:
            self.drop_upstream()
        c.future.set_result(
            Response(
                c.status,
                head.reason.decode("latin-1"),
                [(n.decode("latin-1"), v.decode("latin-1")) for n, v in head.headers],
                b"".join(c.parts),
            )
        )

    # -- upstream

    async def ensure_upstream(self) -> None:
        """Open the upstream connection unless a live one exists; UpstreamError if it can't."""
        while self.connecting is not None:
            await asyncio.shield(self.connecting)
        if self.ut is not None and not self.ut.is_closing() and self.up and not self.up.eof:
            return
        self.drop_upstream()
        loop = asyncio.get_running_loop()
        self.connecting = loop.create_future()
        try:
            transport, protocol = await loop.create_unix_connection(
                lambda: _Upstream(self), self.proxy.upstream_path
            )
        except OSError as e:
            raise UpstreamError(
                f"cannot connect to the Engine at {self.proxy.upstream_path}: {e}",
                maybe_delivered=False,
            ) from e
        finally:
            self.connecting.set_result(None)
            self.connecting = None
        if self.closed:
            transport.abort()
            raise _Closed("client went away")
        self.ut, self.up = transport, protocol

    def drop_upstream(self) -> None:
        if self.ut is not None:
            self.ut.abort()
        self.ut = self.up = None
        self.ubuf = b""
        self.eof_sent = self.upaused = False
        self.resume_client(_P_PEER)

    def up_data(self, up: _Upstream, data: bytes) -> None:
        if up is not self.up:
            return
        if self.raw:
            self.ct.write(data)  # type: ignore[union-attr]
            return
        self.ubuf = self.ubuf + data if self.ubuf else data
        if self.rs == _RS_COLLECT:
            self._collect()
            return
        try:
            self._respond()
        except _BadMessage as e:
            log.warning("closing connection: %s", e)
            self.close(abort=True)
        except Exception:
            log.exception("proxy error")
            self.close(abort=True)

    def _respond(self) -> None:
        ct = self.ct
        assert ct is not None
        while self.ubuf:
            ubuf = self.ubuf
            rs = self.rs
            if rs == _RS_BODY:
                body = self.rbody
                assert body is not None
                end = body.take(ubuf, 0)
                ct.write(ubuf if end == len(ubuf) else memoryview(ubuf)[:end])
                self.ubuf = ubuf[end:]
                if body.done:
                    self._response_done(self.rkeep)
                return
            if rs == _RS_UNTIL_CLOSE:
                ct.write(ubuf)
                self.ubuf = b""
                return
            if rs != _RS_HEAD:
                raise _BadMessage(f"the Engine sent {len(ubuf)} bytes nobody asked for")
            end = ubuf.find(_CRLF2)
            if end < 0:
                if len(ubuf) > MAX_HEAD:
                    raise _BadMessage("response header section too large")
                return
            end += 4
            parser, head = _parse_response(ubuf, end)
            status = parser.get_status_code() if parser is not None else 101
            self.rsent = True
            if 100 <= status < 200 and status != 101:  # interim (100 Continue): pass it on
                ct.write(memoryview(ubuf)[:end])
                self.ubuf = ubuf[end:]
                continue
            framing = _Framing(head.headers)
            if status == 101 or (
                status == 200
                and framing.raw_type
                and framing.length is None
                and not framing.chunked
            ):
                ct.write(ubuf)
                self.ubuf = b""
                self._hijack()
                return
            if self.head_req or status in _NO_BODY_STATUS:
                ct.write(memoryview(ubuf)[:end] if end < len(ubuf) else ubuf)
                self.ubuf = ubuf[end:]
                self._response_done(_keep_alive(ubuf, framing))
                return
            if not framing.chunked and framing.length is None:
                ct.write(ubuf)  # delimited by the Engine closing the connection
                self.ubuf = b""
                self.rs = _RS_UNTIL_CLOSE
                return
            body = _Body(parser, head, framing)
            pos = body.take(ubuf, end)
            ct.write(ubuf if pos == len(ubuf) else memoryview(ubuf)[:pos])
            self.ubuf = ubuf[pos:]
            if body.done:
                self._response_done(_keep_alive(ubuf, framing))
                return
            self.rbody = body
            self.rkeep = _keep_alive(ubuf, framing)
            self.rs = _RS_BODY

    def _response_done(self, keep: bool) -> None:
        self.rbody = None
        self.rs = _RS_IDLE
        self.awaiting = False
        if self.ubuf:
            log.warning("the Engine sent %d bytes after a response", len(self.ubuf))
            keep = False
        if not (keep and self.req_keep) or self.eof_sent:
            self.close()
            return
        if self.rq == _RQ_SENT:
            self.rq = _RQ_HEAD
            self.resume_client(_P_AHEAD)
            self.advance()

    def _hijack(self) -> None:
        """From now on both directions are raw byte pipes; EOFs pass on as write-EOFs."""
        self.raw = True
        self.rs = _RS_IDLE
        self.rq = _RQ_HEAD
        self.body = None
        ut = self.ut
        assert ut is not None
        if self.buf:
            ut.write(self.buf)
            self.buf = b""
        if self.client_eof and not self.eof_sent:
            self.eof_sent = True
            ut.write_eof()
        self.resume_client(_P_AHEAD)

    def up_eof(self, up: _Upstream) -> bool:
        if up is not self.up:
            return False
        if self.raw:
            if self.ct is not None and not self.ct.is_closing():
                self.ct.write_eof()
            if self.client_eof:
                self.close()
            return True
        self._up_gone()
        return False

    def up_lost(self, up: _Upstream) -> None:
        if up is not self.up:
            return
        if self.raw:
            self.close()
        elif not up.eof:
            self._up_gone()

    def _up_gone(self) -> None:
        """The Engine closed our upstream connection (outside a hijack)."""
        rs = self.rs
        if rs == _RS_COLLECT:
            self._collect(eof=True)
            return
        if rs == _RS_UNTIL_CLOSE:
            self.close()
        elif rs == _RS_HEAD and not self.rsent:
            log.error("the Engine closed the connection before answering")
            self.reply_error(502, "gpu-alloc shim: the Engine closed the connection")
        elif rs != _RS_IDLE or self.rq == _RQ_BODY:
            self.close()  # a truncated exchange: the client must see the connection end
        else:
            self.drop_upstream()  # idle: reconnect for the next request

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
        if self.task is not None:
            self.task.cancel()
        if self.collector is not None and not self.collector.future.done():
            self.collector.future.set_exception(_Closed("connection closed"))
        if self.ct is not None:
            self.ct.abort() if abort else self.ct.close()
        if self.ut is not None:
            self.ut.abort() if abort else self.ut.close()


def _method(buf: bytes) -> bytes:
    # After llhttp's upgrade exception get_method() is unavailable; the head parsed, so the
    # method is the first token of the request line.
    return buf.lstrip(b"\r\n").split(b" ", 1)[0]


# --- server --------------------------------------------------------------------------------


class _Proxy:
    __slots__ = ("conns", "forward_timeout", "interceptor", "max_body", "upstream_path")

    def __init__(
        self, upstream_path: str, interceptor: Interceptor, forward_timeout: float, max_body: int
    ) -> None:
        self.upstream_path = upstream_path
        self.interceptor = interceptor
        self.forward_timeout = forward_timeout
        self.max_body = max_body
        self.conns: set[_Client] = set()


def _remove_stale_socket(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise FileExistsError(f"{path} exists and is not a socket")
    os.unlink(path)


def _gid(group: str) -> int:
    if group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise OSError(
            f"shim.group: no group named '{group}' on this host; create it, or set "
            "shim.group to an existing group (or null)"
        ) from None


async def serve(
    listen_path: str,
    upstream_path: str,
    interceptor: Interceptor,
    *,
    mode: int = 0o660,
    group: str | None = None,
    ready: Callable[[], None] | None = None,
    forward_timeout: float = FORWARD_TIMEOUT,
    max_body: int = MAX_BODY,
) -> None:
    """Serve the proxy on `listen_path` until cancelled.

    The socket is created owner-only and then given `mode` and `group`, so it is never
    reachable by others before its permissions are right.
    """
    proxy = _Proxy(upstream_path, interceptor, forward_timeout, max_body)
    _remove_stale_socket(listen_path)
    loop = asyncio.get_running_loop()
    old_umask = os.umask(0o177)
    try:
        server = await loop.create_unix_server(lambda: _Client(proxy), listen_path)
    finally:
        os.umask(old_umask)
    inode = os.stat(listen_path).st_ino
    try:
        if group is not None:
            os.chown(listen_path, -1, _gid(group))
        os.chmod(listen_path, mode)
        log.info("shim listening on %s, forwarding to %s", listen_path, upstream_path)
        if ready is not None:
            ready()
        await server.serve_forever()
    finally:
        server.close()
        for conn in list(proxy.conns):
            conn.close(abort=True)
        with contextlib.suppress(OSError):
            if os.stat(listen_path).st_ino == inode:
                os.unlink(listen_path)


def run(listen_path: str, upstream_path: str, interceptor: Interceptor, **kwargs: Any) -> None:
    """Run `serve` until SIGTERM or SIGINT (a blocking entry point for the CLI)."""

    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await serve(listen_path, upstream_path, interceptor, **kwargs)
        log.info("shim stopped")

    asyncio.run(main())
