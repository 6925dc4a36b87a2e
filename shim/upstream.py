"""The Engine side of a shim connection: one upstream connection per client connection.

Opened lazily and reopened when the Engine closed it between requests, so the
Engine sees the client's connection pattern.  `UpstreamSide.forward` is what the
interceptor calls to send a (rewritten) request and buffer its answer; spliced
traffic never goes through it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import httptools

from shim.framing import (
    _CRLF2,
    _NO_BODY_STATUS,
    MAX_BODY,
    MAX_HEAD,
    Request,
    Response,
    UpstreamError,
    _BadMessage,
    _Body,
    _Closed,
    _encode_request,
    _Framing,
    _Head,
    _keep_alive,
    _parse_response,
)

if TYPE_CHECKING:
    from allocator.host.peers import Peer
    from shim.server import _Proxy

log = logging.getLogger(__name__)

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

    def __init__(self, client: ClientState) -> None:
        self.client = client
        self.eof = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # typeshed: BaseTransport

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


class ClientState:
    """The state the parts of `shim.splice._Client` share, declared for the type checker:
    `_Client.__init__` sets it, and the parts' methods read and change it."""

    proxy: _Proxy
    ct: asyncio.Transport | None
    up: _Upstream | None
    ut: asyncio.Transport | None
    buf: bytes
    ubuf: bytes
    rq: int
    rs: int
    body: _Body | None
    rbody: _Body | None
    awaiting: bool
    head_req: bool
    req_keep: bool
    rkeep: bool
    rsent: bool
    raw: bool
    client_eof: bool
    eof_sent: bool
    cpause: int
    upaused: bool
    closed: bool
    size: int
    pending: tuple[str, str, list[tuple[str, str]], bool, bool] | None
    collector: _Collector | None
    task: asyncio.Task[None] | None
    gone: asyncio.Event | None
    connecting: asyncio.Future[None] | None
    peer: Peer | None

    if TYPE_CHECKING:  # the methods one part calls on another

        def advance(self) -> None: ...
        def resume_client(self, reason: int) -> None: ...
        def reply_error(self, status: int, message: str) -> None: ...
        def close(self, *, abort: bool = False) -> None: ...
        def pause_client(self, reason: int) -> None: ...
        def up_data(self, up: _Upstream, data: bytes) -> None: ...
        def up_eof(self, up: _Upstream) -> bool: ...
        def up_lost(self, up: _Upstream) -> None: ...
        def _collect(self, eof: bool = False) -> None: ...
        def drop_upstream(self) -> None: ...
        async def ensure_upstream(self) -> None: ...
        async def forward(self, request: Request, *, timeout: float | None = None) -> Response: ...


class UpstreamSide(ClientState):
    """The upstream half of `shim.splice._Client`: connect, forward, collect."""

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
